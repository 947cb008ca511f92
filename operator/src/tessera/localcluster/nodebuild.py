"""Build, cache and find what a real node runs: the kubelet, containerd with its runc shim,
runc, the CNI plugins and a one-file userland for images.

The kubelet comes from the same wrapper module as the control plane (``build.py``) and lands
beside it; containerd and its shim are built from the Go module proxy (``CGO_ENABLED=0``,
without the btrfs/devmapper/zfs snapshotters) into their own cache folder, behind the same
file lock. runc, the CNI plugins (bridge, host-local, loopback) and busybox come from
Debian's packages (``runc``, ``containernetworking-plugins``, ``busybox-static``): Debian's
runc is built with libseccomp, which the ``RuntimeDefault`` seccomp profile of the operator's
Pod needs, and installs in seconds where building runc needs cgo and libseccomp's headers.
Not for: starting anything (``tessera.localcluster.nodes``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tessera.localcluster.build import (
    KUBERNETES_VERSION,
    LocalClusterError,
    Progress,
    _build_lock,
    _find_go,
    _go_env,
    _install,
    _run_go,
    _stderr_progress,
    cache_root,
    kubernetes_wrapper_gomod,
    version_ldflags,
)

CONTAINERD_VERSION = "v2.4.2"
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
CONTAINERD_TAGS = "no_btrfs no_devmapper no_zfs"
MIN_RUNC = (1, 1)
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
# Everything a real node needs from Debian (iptables: the DNAT to the apiserver; iproute2: the
# bridge; util-linux: unshare and nsenter). scripts/bootstrap installs them when run as root on Debian.
DEBIAN_PACKAGES = ("runc", "containernetworking-plugins", "busybox-static", "iptables", "iproute2", "util-linux")


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path
    runc: Path
    cni_bin_dir: Path
    busybox: Path

    @property
    def runtime_path(self) -> str:
        """A PATH for containerd: its shim and runc first."""
        folders = dict.fromkeys(str(p.parent) for p in (self.containerd_shim, self.runc))
        return ":".join([*folders, os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")])


def parse_runc_version(output: str) -> tuple[int, int, int] | None:
    """``runc --version`` output → (major, minor, patch); None when it does not say."""
    match = re.search(r"^runc version (\d+)\.(\d+)\.(\d+)", output, re.M)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def find_runc() -> Path:
    """A runc of at least ``MIN_RUNC`` on PATH (or in /usr/sbin), else a clear error."""
    found = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise LocalClusterError(_missing("runc is not installed"))
    proc = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    version = parse_runc_version(proc.stdout)
    if version is None or version[:2] < MIN_RUNC:
        raise LocalClusterError(_missing(f"{found} is too old or unreadable ({proc.stdout.strip()!r})"))
    return Path(found)


def find_cni_bin_dir(folders: tuple[Path, ...] = CNI_DIRS) -> Path:
    """The first folder holding every CNI plugin a real node uses."""
    for folder in folders:
        if all((folder / plugin).is_file() for plugin in CNI_PLUGINS):
            return folder
    raise LocalClusterError(_missing(f"no folder of {folders} holds the CNI plugins {', '.join(CNI_PLUGINS)}"))


def find_busybox() -> Path:
    """A statically linked busybox (its one file is the userland of the local images)."""
    for candidate in (Path("/bin/busybox"), Path("/usr/bin/busybox")):
        if candidate.is_file() and b"ld-linux" not in candidate.read_bytes()[:8192]:
            return candidate
    raise LocalClusterError(_missing("no statically linked busybox"))


def _missing(what: str) -> str:
    return (f"{what}. Real nodes need Debian's {', '.join(DEBIAN_PACKAGES)}: "
            f"apt-get update && apt-get install -y {' '.join(DEBIAN_PACKAGES)}")


def ensure_node_binaries(
    kubernetes_version: str = KUBERNETES_VERSION,
    containerd_version: str = CONTAINERD_VERSION,
    progress: Progress = _stderr_progress,
) -> NodeBinaries:
    """The real node's binaries: Debian's are found, the kubelet and containerd are built
    into the cache first when they are missing."""
    runc, cni, busybox = find_runc(), find_cni_bin_dir(), find_busybox()
    root = cache_root()
    k8s_dir = root / "bin" / f"kubernetes-{kubernetes_version}"
    containerd_dir = root / "bin" / f"containerd-{containerd_version}"
    binaries = NodeBinaries(
        kubelet=k8s_dir / "kubelet",
        containerd=containerd_dir / "containerd",
        containerd_shim=containerd_dir / "containerd-shim-runc-v2",
        ctr=containerd_dir / "ctr",
        runc=runc,
        cni_bin_dir=cni,
        busybox=busybox,
    )
    built = (binaries.kubelet, binaries.containerd, binaries.containerd_shim, binaries.ctr)
    if all(p.exists() for p in built):
        return binaries
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / "build.lock", progress):
        go = _find_go()
        if not binaries.kubelet.exists():
            build_kubelet(go, kubernetes_version, k8s_dir, root, progress)
        if not all(p.exists() for p in built[1:]):
            build_containerd(go, containerd_version, containerd_dir, root, progress)
    return binaries


def build_kubelet(go: str, version: str, out_dir: Path, root: Path, progress: Progress) -> None:
    env = _go_env(root)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kubelet-build-", dir=root) as tmp:
        work = Path(tmp)
        info = json.loads(_run_go(go, ["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], work, env,
                                  "downloading Kubernetes"))
        (work / "go.mod").write_text(kubernetes_wrapper_gomod(Path(info["GoMod"]).read_text(), version))
        progress(f"building kubelet {version} (first run only; several minutes on 2 cores)")
        staging = work / "out"
        staging.mkdir()
        _run_go(go, ["build", "-trimpath", "-ldflags", version_ldflags(version), "-o", str(staging / "kubelet"),
                     "k8s.io/kubernetes/cmd/kubelet"], work, env, "building the kubelet")
        _install(staging, out_dir)
    progress(f"built kubelet {version} in {time.monotonic() - started:.0f}s → {out_dir}")


def containerd_install_args(version: str, staging: Path) -> list[str]:
    """``go install`` of containerd's commands at ``version`` (its go.mod has no replace
    directives, so ``pkg@version`` builds exactly its own dependency versions)."""
    ldflags = f"-s -w -X {CONTAINERD_MODULE}/version.Version={version}"
    return ["install", "-trimpath", "-tags", CONTAINERD_TAGS, "-ldflags", ldflags,
            *(f"{CONTAINERD_MODULE}/cmd/{c}@{version}" for c in CONTAINERD_COMMANDS)]


def build_containerd(go: str, version: str, out_dir: Path, root: Path, progress: Progress) -> None:
    env = _go_env(root)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="containerd-build-", dir=root) as tmp:
        staging = Path(tmp) / "out"
        staging.mkdir()
        env["GOBIN"] = str(staging)
        env.pop("GOFLAGS", None)  # -mod=mod is refused outside a module
        progress(f"building containerd {version} and its runc shim (first run only)")
        _run_go(go, containerd_install_args(version, staging), Path(tmp), env, "building containerd")
        _install(staging, out_dir)
    progress(f"built containerd {version} in {time.monotonic() - started:.0f}s → {out_dir}")
