"""Where a GPU sits on the PCI Express fabric, read from Linux sysfs: its PCIe root complex
and its NUMA node, by the PCI bus id NVML reports.

``/sys/bus/pci/devices/<domain:bus:device.function>`` is a link into
``/sys/devices/pci<domain>:<bus>/…/<bdf>``; the first folder under ``/sys/devices`` is the
root complex (the host bridge) the device hangs off, which is what the standard DRA attribute
``resource.kubernetes.io/pcieRoot`` names. Two GPUs with the same root share a PCIe switch
tree, so a claim's ``matchAttribute`` on it keeps peer-to-peer traffic off the CPU link.
``<bdf>/numa_node`` is the device's NUMA node (-1: the firmware does not say).
Not for: NVML calls (``tessera.agent.backends.nvml``), or guessing topology without sysfs.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

_NVML_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")
_ROOT_COMPLEX = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


@dataclass(frozen=True, slots=True)
class PciTopology:
    pcie_root: str | None = None  # e.g. "pci0000:3a"
    numa_node: int | None = None


def sysfs_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's ``00000000:3B:00.0`` as sysfs names it, ``0000:3b:00.0``; None when it is not a bus id."""
    match = _NVML_BUS_ID.fullmatch(nvml_bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    domain = domain.lower().lstrip("0").rjust(4, "0")
    return f"{domain}:{bus.lower()}:{device.lower()}.{function}"


def root_complex_of(link_target: str) -> str | None:
    """The root complex in a ``/sys/bus/pci/devices/<bdf>`` link target
    (``../../../devices/pci0000:3a/0000:3a:00.0/…/0000:3b:00.0`` → ``pci0000:3a``)."""
    parts = Path(link_target).parts
    for before, part in itertools.pairwise(parts):
        if before == "devices" and _ROOT_COMPLEX.fullmatch(part):
            return part
    return None


def read_topology(sysfs: Path, nvml_bus_id: str | None) -> PciTopology:
    """The device's root complex and NUMA node; fields sysfs cannot tell stay None."""
    bdf = sysfs_bus_id(nvml_bus_id) if nvml_bus_id else None
    if bdf is None:
        return PciTopology()
    device = sysfs / "bus" / "pci" / "devices" / bdf
    try:
        root = root_complex_of(os.readlink(device))
    except OSError:
        return PciTopology()
    numa: int | None = None
    try:
        value = int((device / "numa_node").read_text().strip())
        numa = value if value >= 0 else None
    except (OSError, ValueError):
        numa = None
    return PciTopology(root, numa)
