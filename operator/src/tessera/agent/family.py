"""The seam a device family fills: what the node agent needs of GPUs, of NICs, of anything next.

A family discovers its devices on the node, prepares a claim's share of one (remembering in
its own checkpoint what it made, so that unprepare and a restarted agent can undo exactly that),
unprepares it, and reports health as a fresh inventory (a device whose link or driver is gone
says so in its own fields). Publishing is not here: the agent reports the inventory and the
operator turns it into devices (``tessera.dra``), one pure module per family.

The NIC family (``tessera.agent.nics.family.NicFamily``) implements it; the GPU family today is
the ``DeviceBackend`` + ``tessera.agent.plugin.prepare`` pair, which this protocol is shaped to
wrap without change (discover = ``inventory()``; prepare/unprepare = the plugin's per-claim work).
Not for: gRPC, CDI files or Kubernetes objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

InventoryT = TypeVar("InventoryT", covariant=True)
ShareT = TypeVar("ShareT", contravariant=True)


class DeviceFamily(Protocol[InventoryT, ShareT]):
    """One family of devices on one node."""

    @property
    def driver(self) -> str:
        """The DRA driver name its devices are published and prepared under."""
        ...

    def discover(self) -> Sequence[InventoryT]:
        """Every device of the family on the node, as it is now (also the health probe)."""
        ...

    def prepare(self, claim_uid: str, shares: Sequence[ShareT]) -> None:
        """Make the claim's shares, all or nothing; recorded in the family's checkpoint first."""
        ...

    def unprepare(self, claim_uid: str) -> None:
        """Undo what ``prepare`` made for the claim; nothing of it is left, even after a crash."""
        ...

    def recover(self) -> None:
        """After a restart: finish any half-done prepare or unprepare the checkpoint records."""
        ...
