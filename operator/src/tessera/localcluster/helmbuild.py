"""Build, cache and find ``helm`` (helm.sh/helm/v4, a pinned release) for the chart's checks.

``helm`` is built from the Go module proxy like containerd (``go install pkg@version``: Helm's
go.mod has no replace directives, so that builds exactly its own dependency versions),
``CGO_ENABLED=0``, with the version ldflags Helm's Makefile sets so ``helm version`` tells the
truth. It lands in the control plane's cache, in a folder named after its version
(``bin/helm-v4.3.2/helm``), behind the same file lock as every other build there, so the
checks need nothing installed but Go.
Not for: running helm against a cluster (the tests and ``tessera.chart`` do that).
"""

from __future__ import annotations

import time
from pathlib import Path
from tempfile import TemporaryDirectory

from tessera.localcluster.build import (
    Progress,
    _build_lock,
    _find_go,
    _go_env,
    _install,
    _run_go,
    _stderr_progress,
    cache_root,
)

HELM_VERSION = "v4.3.2"
HELM_MODULE = "helm.sh/helm/v4"


def helm_path(version: str = HELM_VERSION) -> Path:
    """Where the built ``helm`` of ``version`` lives (whether or not it is built yet)."""
    return cache_root() / "bin" / f"helm-{version}" / "helm"


def helm_install_args(version: str, tags: tuple[str, ...] = ()) -> list[str]:
    """``go install`` of Helm's command at ``version``, with the release's version ldflags."""
    pkg = f"{HELM_MODULE}/internal/version"
    ldflags = f"-s -w -X {pkg}.version={version} -X {pkg}.metadata= -X {pkg}.gitTreeState=clean"
    tag_args = ["-tags", " ".join(tags)] if tags else []
    return ["install", "-trimpath", *tag_args, "-ldflags", ldflags, f"{HELM_MODULE}/cmd/helm@{version}"]


def ensure_helm(version: str = HELM_VERSION, progress: Progress = _stderr_progress) -> Path:
    """The cached ``helm`` of ``version``, built first (a few minutes on 2 cores) when missing."""
    binary = helm_path(version)
    if binary.exists():
        return binary
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / "build.lock", progress):
        if not binary.exists():  # another process may have built it while we waited
            _build_helm(_find_go(), version, binary.parent, root, progress)
    return binary


def _build_helm(go: str, version: str, out_dir: Path, root: Path, progress: Progress) -> None:
    env = _go_env(root)
    started = time.monotonic()
    with TemporaryDirectory(prefix="helm-build-", dir=root) as tmp:
        staging = Path(tmp) / "out"
        staging.mkdir()
        env["GOBIN"] = str(staging)
        env.pop("GOFLAGS", None)  # -mod=mod is refused outside a module
        progress(f"building helm {version} (first run only)")
        _run_go(go, helm_install_args(version), Path(tmp), env, "building helm")
        _install(staging, out_dir)
    progress(f"built helm {version} in {time.monotonic() - started:.0f}s → {out_dir}")


if __name__ == "__main__":
    print(ensure_helm())
