"""Simulated NICs in the node's simulation spec: the items that name NICs.

The one node configuration that describes simulated GPUs (``--simulate``) describes simulated
NICs too: ``8xH100-80GB,4xNIC-400G`` is eight GPUs and four 400 Gbit/s NICs. This module only
tells the two kinds of item apart, so that the GPU spec parser can skip NIC items without
knowing anything else of NICs. Not for: building the NICs (``tessera.agent.nics.simulated``).
"""

from __future__ import annotations

import re

NIC_ITEM = re.compile(r"^(?:(\d+)\s*[xX]\s*)?NIC-(\d+)G$", re.IGNORECASE)


def is_nic_item(item: str) -> bool:
    """``4xNIC-40G`` and ``NIC-100G`` are NIC items; anything else is not."""
    return NIC_ITEM.match(item.strip()) is not None


def nic_items(spec: str) -> list[int]:
    """The speeds in Mbit/s of the NICs a spec names, in order: ``2xNIC-40G`` → ``[40000, 40000]``."""
    speeds: list[int] = []
    for raw in spec.split(","):
        match = NIC_ITEM.match(raw.strip())
        if match is None:
            continue
        count = int(match.group(1) or "1")
        if not 1 <= count <= 32:
            raise ValueError(f"bad NIC spec {raw.strip()!r}: the count must be between 1 and 32")
        speeds.extend([int(match.group(2)) * 1000] * count)
    return speeds
