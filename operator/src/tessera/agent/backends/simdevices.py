"""Character devices standing for /dev/nvidia* on a simulated node, so a container given a
simulated GPU sees the device nodes it would see on a GPU node (no driver answers them).

Not for: the simulated driver (``simulated``) or what a container is given (the kubelet
plugin's CDI specs).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from tessera.agent.backends.base import BackendError

NVIDIA_MAJOR = 195  # the driver's fixed major number; nvidiactl is minor 255
UVM_MAJOR = 235  # dynamic on real machines; any free number serves a simulated node


def simulated_device_nodes(gpu_minors: list[int]) -> list[tuple[str, int, int]]:
    """(name under /dev, major, minor) of the character devices a node with these GPUs has."""
    nodes = [("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0), ("nvidia-uvm-tools", UVM_MAJOR, 1)]
    return nodes + [(f"nvidia{m}", NVIDIA_MAJOR, m) for m in gpu_minors]


def make_device_nodes(device_dir: Path, gpu_minors: list[int]) -> None:
    """Character devices standing for /dev/nvidia* under ``device_dir`` (no driver answers
    them: a container sees them, as it would on a GPU node, and cannot use them)."""
    device_dir.mkdir(parents=True, exist_ok=True)
    for name, major, minor in simulated_device_nodes(gpu_minors):
        path = device_dir / name
        wanted = os.makedev(major, minor)
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == wanted:
                continue
            path.unlink()
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, wanted)
        except PermissionError as error:
            raise BackendError(
                f"cannot make the simulated device node {path} ({error}); simulated device nodes need "
                "root (CAP_MKNOD): run as root or leave --simulated-dev-dir unset"
            ) from error
