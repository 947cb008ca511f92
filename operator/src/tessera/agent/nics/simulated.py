"""Simulated NICs: the NICs a simulation spec names, placed on the same HGX-style board as the
simulated GPUs, so that a claim can align a GPU and a NIC on one PCIe root.

NIC ``i`` sits behind root complex ``i`` (the roots ``board_slot`` gives the GPUs: two GPUs per
root), on a bus of its own below the GPUs' (``0x18`` past the root's bus), on that root's NUMA
node. Interfaces are named ``simnic<i>``, MACs seeded by the node name, so two runs describe the
same NICs. Not for: real NICs (``tessera.agent.nics.sysfs``) or traffic (nothing to shape).
"""

from __future__ import annotations

import hashlib

from tessera.agent.backends.simstate import GPUS_PER_PCIE_ROOT, NUMA_NODES
from tessera.agent.nics.spec import nic_items
from tessera.models.nics import NicStatus


def simulated_mac(node_name: str, index: int) -> str:
    """A locally administered unicast MAC seeded by node and index."""
    digest = hashlib.sha256(f"{node_name}/nic/{index}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def simulated_nics(node_name: str, spec: str, gpu_count: int) -> list[NicStatus]:
    """The NICs of ``spec`` (GPU items ignored), one behind each PCIe root of the board."""
    speeds = nic_items(spec)
    roots = max(-(-gpu_count // GPUS_PER_PCIE_ROOT), len(speeds), 1)
    nics = []
    for index, speed in enumerate(speeds):
        domain, root_bus = divmod(index, 8)
        bus = 0x10 + root_bus * 0x20
        nics.append(
            NicStatus(
                interface=f"simnic{index}",
                mac=simulated_mac(node_name, index),
                pci_bus_id=f"{domain:04x}:{bus + 0x18:02x}:00.0",
                pcie_root=f"pci{domain:04x}:{bus:02x}",
                numa_node=min(NUMA_NODES - 1, index * NUMA_NODES // roots),
                speed_mbps=speed,
                driver="simulated",
            )
        )
    return nics
