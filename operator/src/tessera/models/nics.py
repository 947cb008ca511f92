"""What a node agent knows about one NIC: the value discovery returns and publishing reads.

A frozen model (camelCase on the wire) so that it can travel in a NodeLayout's status like a
GPU's inventory does. Not for: discovering NICs (``tessera.agent.nics``) or building devices
(``tessera.dra.nics``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from tessera.models.base import KubeModel


class LinkState(StrEnum):
    """The uplink as the kernel reports it (``/sys/class/net/<if>/operstate``), or gone."""

    UP = "Up"
    DOWN = "Down"
    ABSENT = "Absent"


class NicStatus(KubeModel):
    """One physical NIC (or a stand-in for one) on a node."""

    interface: str = Field(min_length=1, max_length=15)
    mac: str = ""
    pci_bus_id: str | None = Field(default=None, description="sysfs form, e.g. 0000:3b:00.0")
    pcie_root: str | None = Field(default=None, description="the root complex, e.g. pci0000:3a")
    numa_node: int | None = None
    speed_mbps: int | None = Field(default=None, ge=0, description="what the link reports; None when it cannot say")
    driver: str = ""
    link: LinkState = LinkState.UP
