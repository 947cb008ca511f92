"""The attributes and capacity a GPU is published with, in the ``gpu.tessera.dev`` domain.

One definition serves the publisher (ResourceSlice devices) and the planner (a
SharingPolicy's ``gpuSelector`` CEL sees a GPU exactly as a DeviceClass selector sees the
published device). Values are in the DRA wire shape: ``{"string": ...}``, ``{"int": ...}``,
``{"bool": ...}`` or ``{"version": ...}`` (semantic versions).
Not for: building whole slices (``tessera.dra``).
"""

from __future__ import annotations

import re
from functools import cache

from tessera.models.layout import GpuStatus
from tessera.models.quantity import MIB

Attribute = dict[str, str | int | bool]
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"

# The capacities a device is published with (``device.capacity["gpu.tessera.dev"].<name>``),
# which claims consume and the kubelet plugin reads back from ``consumedCapacity``.
MEMORY_CAPACITY = "memory"  # bytes: every device; consumable on shared (time-sliced, MPS) devices
COMPUTE_CAPACITY = "compute"  # percent of the SMs, on MPS devices
SHARES_CAPACITY = "shares"  # time-slicing replicas


@cache  # pure, and a fleet has few distinct driver and CUDA versions
def semver(text: str) -> str | None:
    """A semantic version from a driver or compute-capability string: ``"580.65.06"`` →
    ``"580.65.6"``, ``"9.0"`` → ``"9.0.0"``; None when there are no numbers to read."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
    if not numbers:
        return None
    numbers += [0] * (3 - len(numbers))
    return ".".join(str(n) for n in numbers)


def gpu_attributes(gpu: GpuStatus) -> dict[str, Attribute]:
    """Attributes every device cut from ``gpu`` carries (whole GPU, MIG instance or share)."""
    attrs: dict[str, Attribute] = {
        "productName": {"string": gpu.product_name},
        "architecture": {"string": gpu.architecture},
        "index": {"int": gpu.index},
        "migCapable": {"bool": gpu.mig_capable},
    }
    if gpu.model:
        attrs["model"] = {"string": gpu.model}
    cc = semver(gpu.cuda_compute_capability)
    if cc:
        attrs["cudaComputeCapability"] = {"version": cc}
    driver = semver(gpu.driver_version)
    if driver:
        attrs["driverVersion"] = {"version": driver}
    if gpu.numa_node is not None:
        attrs["numaNode"] = {"int": gpu.numa_node}
    if gpu.pcie_root:  # only where the agent read it from sysfs: a guess would make matchAttribute lie
        attrs[PCIE_ROOT_ATTRIBUTE] = {"string": gpu.pcie_root}
    return attrs


def whole_gpu_attributes(gpu: GpuStatus) -> dict[str, Attribute]:
    """The whole GPU as one device (Exclusive, or the base a GPU selector sees)."""
    return {
        **gpu_attributes(gpu),
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "strategy": {"string": gpu.strategy.value},
    }


def memory_bytes(memory_mib: int) -> int:
    return memory_mib * MIB
