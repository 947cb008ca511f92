"""What the kubelet plugin needs from the GPUs, and the device nodes a container gets.

``PluginBackend`` is the slice of the agent's ``DeviceBackend`` the plugin calls; both
``NvmlBackend`` and ``SimulatedBackend`` satisfy it structurally, and a test double only has
to implement these six methods. Calls block; the plugin runs them in a worker thread.

Device nodes follow NVIDIA's layout: every container with a GPU needs the control and UVM
nodes; a whole GPU adds ``/dev/nvidia<minor>``; a MIG device adds its parent's node and the
two capability nodes of its GPU and compute instance, whose minors the driver publishes under
``/proc/driver/nvidia/capabilities``. Where the driver publishes nothing (the simulated
backend), only the nodes that can be named are given.
Not for: talking to NVML (``tessera.agent.backends.nvml``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from tessera.agent.backends.base import CreatedInstance, GpuInfo, Inventory, MigInstanceInfo

CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_MINOR_RE = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


class PluginBackend(Protocol):
    """The GPU operations the kubelet plugin performs (a subset of ``DeviceBackend``)."""

    def inventory(self) -> Inventory: ...

    def create_instance(self, gpu_uuid: str, profile: str, start: int, hold: str | None = None) -> CreatedInstance: ...

    def destroy_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None: ...

    def hold(self, device_uuid: str, holder: str) -> None: ...

    def release(self, device_uuid: str, holder: str) -> None: ...

    def start_mps(self, device_uuid: str) -> str: ...


def gpu_minor(gpu: GpuInfo) -> int:
    """The minor number of the GPU's ``/dev/nvidia<N>`` node: the driver's, as NVML reports it
    (``nvmlDeviceGetMinorNumber``); where a backend cannot tell, the NVML index, which follows
    the same PCI bus order on the machines NVIDIA supports."""
    return gpu.minor if gpu.minor is not None else gpu.index


def read_cap_minor(access_file: Path) -> int | None:
    """The ``DeviceFileMinor`` in a MIG capability's ``access`` file; None when unreadable."""
    try:
        match = _MINOR_RE.search(access_file.read_text())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def mig_capability_nodes(proc_root: Path, gpu: GpuInfo, instance: MigInstanceInfo) -> tuple[str, ...]:
    """``/dev/nvidia-caps/nvidia-cap<N>`` for the instance's GPU instance and compute instance,
    for those whose minor the driver publishes under ``<proc_root>/driver/nvidia/capabilities``."""
    gi_dir = proc_root / "driver/nvidia/capabilities" / f"gpu{gpu_minor(gpu)}" / "mig" / f"gi{instance.gpu_instance_id}"
    access_files = [gi_dir / "access"]
    if instance.compute_instance_id is not None:
        access_files.append(gi_dir / f"ci{instance.compute_instance_id}" / "access")
    minors = (read_cap_minor(f) for f in access_files)
    return tuple(f"/dev/nvidia-caps/nvidia-cap{m}" for m in minors if m is not None)


def device_nodes(proc_root: Path, gpu: GpuInfo, instance: MigInstanceInfo | None) -> tuple[str, ...]:
    """The device nodes one allocated device adds (the control nodes are given once per claim)."""
    nodes: tuple[str, ...] = (f"/dev/nvidia{gpu_minor(gpu)}",)
    if instance is not None:
        nodes += mig_capability_nodes(proc_root, gpu, instance)
    return nodes
