"""NICs found in Linux sysfs: ``/sys/class/net/<interface>`` and the PCI device behind it.

Read per interface: ``address`` (MAC), ``speed`` (Mbit/s; -1 or an error when the link cannot
say, as on veth or a link that is down), ``operstate``, and through the ``device`` link the PCI
function (``0000:3b:00.0``), its ``numa_node`` and its driver. A virtio NIC's ``device`` is the
virtio device, whose parent is the PCI function; the nearest folder named like a PCI address
is taken. The root complex comes from the same path (``tessera.agent.backends.pci``).
Interfaces with no ``device`` (veth, bridges, ifb) are virtual: listed only when asked for by
name, so that a test or a lab can share a veth standing in for an uplink. ``lo`` never.
Not for: changing anything on the host (``tessera.agent.nics.shaping``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path

from tessera.agent.backends.pci import root_complex_of
from tessera.models.nics import LinkState, NicStatus

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def link_state(operstate: str | None) -> LinkState:
    """``up`` (and ``unknown``, which drivers without carrier reporting say while working) is Up."""
    if operstate is None:
        return LinkState.ABSENT
    return LinkState.UP if operstate in ("up", "unknown") else LinkState.DOWN


def read_nic(sysfs: Path, interface: str) -> NicStatus | None:
    """One interface as a NIC; None when it does not exist."""
    folder = sysfs / "class" / "net" / interface
    if not folder.exists():
        return None
    speed = _int(folder / "speed")
    pci_bus_id = pcie_root = driver = None
    numa: int | None = None
    device = folder / "device"
    if device.exists():
        real = os.path.realpath(device)
        addresses = [p for p in Path(real).parts if _PCI_ADDRESS.fullmatch(p)]
        pci_bus_id = addresses[-1] if addresses else None
        pcie_root = root_complex_of(real)
        pci_folder = Path(real[: real.rindex(pci_bus_id) + len(pci_bus_id)]) if pci_bus_id else None
        if pci_folder is not None:
            value = _int(pci_folder / "numa_node")
            numa = value if value is not None and value >= 0 else None
            driver_link = pci_folder / "driver"
            driver = os.path.basename(os.path.realpath(driver_link)) if driver_link.exists() else None
    return NicStatus(
        interface=interface,
        mac=_read(folder / "address") or "",
        pci_bus_id=pci_bus_id,
        pcie_root=pcie_root,
        numa_node=numa,
        speed_mbps=speed if speed is not None and speed > 0 else None,
        driver=driver or "",
        link=link_state(_read(folder / "operstate")),
    )


def discover_nics(
    sysfs: Path = Path("/sys"), named: Collection[str] = (), last_known: Mapping[str, NicStatus] | None = None
) -> list[NicStatus]:
    """Every physical NIC (one with a PCI ``device``), plus the interfaces ``named`` or
    ``last_known`` even if virtual or gone. A NIC that is gone is reported ``Absent`` with what
    was last known of it (its speed, its PCI place), so that its device stays published, tainted,
    instead of vanishing with its allocations. Sorted by interface."""
    root = sysfs / "class" / "net"
    present = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    known = last_known or {}
    wanted = {n for n in present if n != "lo" and (root / n / "device").exists()} | set(named) | set(known)
    nics = []
    for interface in sorted(wanted):
        nic = read_nic(sysfs, interface)
        if nic is None:
            before = known.get(interface)
            gone = before.model_copy(update={"link": LinkState.ABSENT}) if before else None
            nic = gone or NicStatus(interface=interface, link=LinkState.ABSENT)
        nics.append(nic)
    return nics
