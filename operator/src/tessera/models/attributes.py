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


@cache  # pure, and a fleet has few distinct driver and CUDA versions
def semver(text: str) -> str | None:
    """A semantic version from a driver or compute-capability string: ``"580.65.06"`` →
    ``"580.65.6"``, ``"9.0"`` → ``"9.0.0"``; None when there are no numbers to read."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
    if not numbers:
        return None
    numbers += [0] * (3 - len(numbers))
    return ".".join(str(n) for n in numbers)


@cache  # pure: the planner asks for every GPU on every plan
def pcie_root(pci_bus_id: str | None) -> str | None:
    """The PCIe root complex of a bus id such as ``00000000:3B:00.0`` → ``pci0000:00``.

    Without the sysfs topology the domain and the root bus are what can be told; the agent
    fills the real root where it reads sysfs."""
    if not pci_bus_id:
        return None
    match = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):[0-9A-Fa-f]{2}\.[0-7]", pci_bus_id)
    if match is None:
        return None
    domain = match.group(1)[-4:].lower()
    return f"pci{domain}:00"


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
    root = pcie_root(gpu.pci_bus_id)
    if root:
        attrs[PCIE_ROOT_ATTRIBUTE] = {"string": root}
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
