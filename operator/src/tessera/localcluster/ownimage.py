"""Build Tessera's own image from the repository's Dockerfile without Docker or a registry.

The Dockerfile starts ``FROM python:3.11-slim``; no registry is reachable, so that base is
made here: ``mmdebstrap`` writes a Debian bookworm root filesystem with Python 3.11, pip and
the CA bundle (Debian's ``EXTERNALLY-MANAGED`` marker removed, as the official image has
none), and Debian's ``buildah`` commits it under the base's full name. ``buildah bud`` then
builds the Dockerfile as it is (vfs storage, chroot isolation, never pulling), and the image
is written as a docker-archive tar that ``tessera.localcluster.images.import_image`` loads
into real nodes. Everything lives under the cache folder; a finished tar is reused while the
inputs it was built from (Dockerfile, pyproject, lock, sources) are unchanged. The Dockerfile's
RUN steps see the host's CA bundle (read-only), so pip works behind a TLS-inspecting proxy.
Not for: the small busybox image (``tessera.localcluster.images``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from tessera.localcluster.build import LocalClusterError, Progress, _build_lock, _stderr_progress, cache_root

IMAGE = "ghcr.io/tessera-dev/tessera:0.1.0"  # the manifests' placeholder name; imported, never pulled
BASE_IMAGE = "docker.io/library/python:3.11-slim"
BASE_PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
DEBIAN_SUITE = "bookworm"
DEBIAN_TOOLS = ("buildah", "mmdebstrap")
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def own_image_possible() -> str | None:
    """None when this machine can build the image; otherwise why not, in one line."""
    missing = [t for t in DEBIAN_TOOLS if shutil.which(t) is None]
    if missing:
        return (f"building the image needs {', '.join(missing)}: "
                f"apt-get update && apt-get install -y {' '.join(DEBIAN_TOOLS)}")
    if os.geteuid() != 0:
        return "building the image without Docker needs root (buildah with chroot isolation)"
    return None


def source_digest(repo: Path) -> str:
    """A digest of everything the Dockerfile copies, and of the Dockerfile itself."""
    digest = hashlib.sha256()
    files = [repo / "Dockerfile", repo / "pyproject.toml", repo / "requirements.lock", repo / "README.md"]
    files += sorted(p for p in (repo / "operator" / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _buildah(store: Path) -> list[str]:
    return ["buildah", "--root", str(store / "storage"), "--runroot", str(store / "run"), "--storage-driver", "vfs"]


def _run(argv: list[str], what: str, timeout: float = 1800, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-30:])
        raise LocalClusterError(f"{what} failed ({' '.join(argv[:6])} ...):\n{tail}")
    return proc.stdout


def _base_image(store: Path, progress: Progress) -> None:
    """Commit a Debian Python 3.11 root filesystem as ``python:3.11-slim`` in buildah's store."""
    probe = subprocess.run([*_buildah(store), "inspect", "--type", "image", BASE_IMAGE], capture_output=True,
                           check=False)
    if probe.returncode == 0:
        return
    started = time.monotonic()
    rootfs = store / "base-rootfs.tar"
    progress(f"making the base image {BASE_IMAGE} from Debian {DEBIAN_SUITE} packages (mmdebstrap)")
    _run(["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
          "--customize-hook=rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED",
          "--customize-hook=rm -rf \"$1\"/var/cache/apt/archives/*.deb \"$1\"/var/lib/apt/lists/*",
          DEBIAN_SUITE, str(rootfs)], "mmdebstrap")
    container = _run([*_buildah(store), "from", "scratch"], "buildah from scratch").strip()
    try:
        _run([*_buildah(store), "add", container, str(rootfs), "/"], "buildah add")
        _run([*_buildah(store), "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--env", "LANG=C.UTF-8", "--cmd", "python3", container], "buildah config")
        _run([*_buildah(store), "commit", "--quiet", container, BASE_IMAGE], "buildah commit")
    finally:
        subprocess.run([*_buildah(store), "rm", container], capture_output=True, check=False)
        rootfs.unlink(missing_ok=True)
    progress(f"base image ready in {time.monotonic() - started:.0f}s")


def build_own_image(repo: Path, progress: Progress = _stderr_progress) -> Path:
    """The docker-archive tar of Tessera's image built from ``repo``'s Dockerfile (cached)."""
    why_not = own_image_possible()
    if why_not:
        raise LocalClusterError(why_not)
    root = cache_root()
    store = root / "buildah"
    out = root / "images" / f"tessera-{source_digest(repo)}.tar"
    if out.exists():
        return out
    store.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / "image.lock", progress):
        if out.exists():
            return out
        _base_image(store, progress)
        started = time.monotonic()
        progress(f"building {IMAGE} from {repo / 'Dockerfile'} with buildah (no Docker)")
        # RUN steps trust what the host trusts (an egress proxy's CA, say); the image keeps its own.
        cas = ["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if Path(HOST_CA_BUNDLE).is_file() else []
        _run([*_buildah(store), "bud", "--isolation", "chroot", "--pull=never", "--layers=false", *cas,
              "-f", str(repo / "Dockerfile"), "-t", IMAGE, str(repo)], "buildah bud", cwd=repo)
        tmp = out.with_suffix(".partial")
        tmp.unlink(missing_ok=True)
        _run([*_buildah(store), "push", "--quiet", IMAGE, f"docker-archive:{tmp}:{IMAGE}"], "buildah push")
        tmp.replace(out)
        for old in out.parent.glob("tessera-*.tar"):
            if old != out:
                old.unlink(missing_ok=True)  # built from sources that have changed since
        progress(f"built {IMAGE} in {time.monotonic() - started:.0f}s → {out}")
    return out
