"""Which devices of one driver a ResourceClaim's allocation names: the one answer to "which of
our devices does this claim hold?".

The scheduler writes a claim's allocation as ``status.allocation.devices.results[]``, one entry
per allocated device: ``driver``, ``pool``, ``device``, and for a device that several claims
share (consumable capacity) a ``shareID``; a result with ``adminAccess: true`` is a monitoring
claim's view of a device that others may use. ``allocation_results`` reads them for one driver
(GPUs today, a NIC driver next: the driver is a parameter, never assumed), and the rules that
every caller must agree on live here, tested once:

- only results of ``driver`` with a device name count (results of other drivers are theirs);
- ``pool`` narrows them to one node's pool (Tessera's pool name is the node name);
- an admin-access result *holds* nothing: it never keeps a device from being drained, recut or
  destroyed, so holders (the operator's handover, the agent's claim guard) leave it out; the
  kubelet plugin, which must still make the device visible to the monitoring Pod, asks for it
  with ``include_admin_access``;
- a result with a ``shareID`` is one of several allocations of the same device.

Pure: a claim (JSON as the API sends it) in, values out.
Not for: checking that a claim is the one the kubelet meant, or on the right node
(``tessera.agent.plugin.claims``), or reading claims from the API (``tessera.kube.claims``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class AllocatedResult:
    """One allocation result of one driver, as the scheduler wrote it."""

    driver: str
    pool: str
    device: str
    request: str = ""  # "<request>" or "<request>/<subrequest>" for a prioritized-list choice
    share_id: str | None = None  # set: one of several allocations of a multi-allocatable device
    admin_access: bool = False  # a monitoring claim's view: holds nothing
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        return self.share_id is not None

    @property
    def key(self) -> tuple[str, str]:
        """(pool, device): the device's name in its driver's namespace of devices."""
        return self.pool, self.device


def claim_key(claim: Mapping[str, Any]) -> str:
    """``<namespace>/<name>`` of a claim."""
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def allocation_results(
    claim: Mapping[str, Any], driver: str, *, pool: str | None = None, include_admin_access: bool = False
) -> list[AllocatedResult]:
    """The results of ``claim``'s allocation that name a device of ``driver`` (in ``pool`` when
    given), in the order the scheduler wrote them. Admin-access results only with
    ``include_admin_access``: by default the answer is what the claim *holds*."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out: list[AllocatedResult] = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != driver or not result.get("device"):
            continue
        if pool is not None and result.get("pool") != pool:
            continue
        admin = result.get("adminAccess") is True
        if admin and not include_admin_access:
            continue
        share = result.get("shareID")
        out.append(
            AllocatedResult(
                driver=driver,
                pool=str(result.get("pool", "")),
                device=str(result["device"]),
                request=str(result.get("request", "")),
                share_id=str(share) if share else None,
                admin_access=admin,
                consumed_capacity={str(k): str(v) for k, v in (result.get("consumedCapacity") or {}).items()},
            )
        )
    return out


def held_devices(claim: Mapping[str, Any], driver: str, *, pool: str | None = None) -> frozenset[tuple[str, str]]:
    """(pool, device) of every device of ``driver`` the claim holds (admin access holds nothing)."""
    return frozenset(r.key for r in allocation_results(claim, driver, pool=pool))
