"""Build and cache the control-plane binaries from the Go module proxy.

Kubernetes: a wrapper module that requires ``k8s.io/kubernetes`` and replaces every staging
module (listed at v0.0.0 in its go.mod) with the matching published v0.X.Y, built with
``CGO_ENABLED=0`` and version ldflags so ``/version`` tells the truth. etcd: a wrapper
module around ``go.etcd.io/etcd/server/v3/etcdmain``. Binaries are cached per version under
the user's cache folder; a file lock keeps two builds (two test sessions) from colliding.
Not for: starting anything (``tessera.localcluster.cluster``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.36.5"
ETCD_VERSION = "v3.6.16"
K8S_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")

Progress = Callable[[str], None]


class LocalClusterError(RuntimeError):
    """The local control plane could not be built or started; the message says why."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kubernetes_version: str


def cache_root() -> Path:
    """``$TESSERA_CACHE_DIR``, else ``$XDG_CACHE_HOME/tessera``, else ``~/.cache/tessera``."""
    if explicit := os.environ.get("TESSERA_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tessera"


def _stderr_progress(message: str) -> None:
    print(f"[tessera localcluster] {message}", file=sys.stderr, flush=True)


def ensure_binaries(
    kubernetes_version: str = KUBERNETES_VERSION,
    etcd_version: str = ETCD_VERSION,
    progress: Progress = _stderr_progress,
) -> Binaries:
    """The cached binaries for these versions, built first if they are missing."""
    root = cache_root()
    k8s_dir = root / "bin" / f"kubernetes-{kubernetes_version}"
    etcd_dir = root / "bin" / f"etcd-{etcd_version}"
    binaries = Binaries(
        etcd=etcd_dir / "etcd",
        kube_apiserver=k8s_dir / "kube-apiserver",
        kube_controller_manager=k8s_dir / "kube-controller-manager",
        kube_scheduler=k8s_dir / "kube-scheduler",
        kubectl=k8s_dir / "kubectl",
        kubernetes_version=kubernetes_version,
    )
    if _complete(binaries):
        return binaries
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / "build.lock", progress):
        if not _complete(binaries):  # another process may have built them while we waited
            go = _find_go()
            if not all(p.exists() for p in (binaries.kube_apiserver, binaries.kubectl,
                                            binaries.kube_controller_manager, binaries.kube_scheduler)):
                _build_kubernetes(go, kubernetes_version, k8s_dir, root, progress)
            if not binaries.etcd.exists():
                _build_etcd(go, etcd_version, etcd_dir, root, progress)
    return binaries


def _complete(binaries: Binaries) -> bool:
    return all(
        p.exists()
        for p in (binaries.etcd, binaries.kube_apiserver, binaries.kube_controller_manager,
                  binaries.kube_scheduler, binaries.kubectl)
    )


@contextmanager
def _build_lock(path: Path, progress: Progress) -> Iterator[None]:
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("another build of the control plane is running; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise LocalClusterError(
            "Go is not on PATH. The local control plane is built from the Go module proxy on first "
            "use: install Go 1.26 or newer (https://go.dev/dl/) and run again, or point "
            "KUBECONFIG at an existing cluster."
        )
    return go


def _go_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    return env


def _run_go(go: str, args: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    proc = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise LocalClusterError(f"{what} failed (go {' '.join(args[:2])} ...):\n{tail}")
    return proc.stdout


def staging_replacements(kubernetes_gomod: str, kubernetes_version: str) -> list[tuple[str, str]]:
    """(module, version) for every k8s.io staging module required at v0.0.0 by Kubernetes'
    go.mod: ``v1.36.5`` → ``v0.36.5``."""
    staging_version = "v0" + kubernetes_version[2:]
    modules = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.\-/]+) v0\.0\.0\s*$", kubernetes_gomod, re.M)))
    return [(m, staging_version) for m in modules]


def kubernetes_wrapper_gomod(kubernetes_gomod: str, kubernetes_version: str) -> str:
    go_directive = re.search(r"^go (\S+)", kubernetes_gomod, re.M)
    lines = [
        "module tessera.dev/localcluster/kubernetes",
        "",
        f"go {go_directive.group(1) if go_directive else '1.26.0'}",
        "",
        f"require k8s.io/kubernetes {kubernetes_version}",
        "",
        "replace (",
        *(f"\t{m} => {m} {v}" for m, v in staging_replacements(kubernetes_gomod, kubernetes_version)),
        ")",
        "",
    ]
    return "\n".join(lines)


def version_ldflags(kubernetes_version: str) -> str:
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", kubernetes_version)
    if match is None:
        raise LocalClusterError(f"Kubernetes version {kubernetes_version!r} is not of the form v1.36.5")
    pkg = "k8s.io/component-base/version"
    values = {
        "gitVersion": kubernetes_version,
        "gitMajor": match.group(1),
        "gitMinor": match.group(2),
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    return "-s -w " + " ".join(f"-X {pkg}.{k}={v}" for k, v in values.items())


def _build_kubernetes(go: str, version: str, out_dir: Path, root: Path, progress: Progress) -> None:
    env = _go_env(root)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="k8s-build-", dir=root) as tmp:
        work = Path(tmp)
        progress(f"downloading k8s.io/kubernetes {version} from the Go module proxy")
        info = json.loads(_run_go(go, ["mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
                                  work, env, "downloading Kubernetes"))
        gomod = Path(info["GoMod"]).read_text()
        (work / "go.mod").write_text(kubernetes_wrapper_gomod(gomod, version))
        progress(
            f"building {', '.join(K8S_COMPONENTS)} {version} (first run only; several minutes on 2 cores)"
        )
        staging = work / "out"
        staging.mkdir()
        _run_go(
            go,
            ["build", "-trimpath", "-ldflags", version_ldflags(version), "-o", str(staging) + "/",
             *(f"k8s.io/kubernetes/cmd/{c}" for c in K8S_COMPONENTS)],
            work, env, "building Kubernetes",
        )
        _install(staging, out_dir)
    progress(f"built Kubernetes {version} in {time.monotonic() - started:.0f}s → {out_dir}")


ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def _build_etcd(go: str, version: str, out_dir: Path, root: Path, progress: Progress) -> None:
    env = _go_env(root)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="etcd-build-", dir=root) as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text(
            f"module tessera.dev/localcluster/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 {version}\n"
        )
        (work / "main.go").write_text(ETCD_MAIN)
        progress(f"building etcd {version}")
        staging = work / "out"
        staging.mkdir()
        _run_go(go, ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "etcd"), "."],
                work, env, "building etcd")
        _install(staging, out_dir)
    progress(f"built etcd {version} in {time.monotonic() - started:.0f}s → {out_dir}")


def _install(staging: Path, out_dir: Path) -> None:
    """Move built binaries into the cache; each appears whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for binary in sorted(staging.iterdir()):
        os.replace(binary, out_dir / binary.name)
