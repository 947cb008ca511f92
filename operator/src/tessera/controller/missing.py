"""Claims allocated a device that its node no longer has: a Warning Event
``AllocatedDeviceMissing`` once per claim and device, and a gauge of how many there are.

A claim is marked told only after its Event was posted, so a failed post is tried again.
What was told is forgotten when the device is no longer missing for that claim (found again,
or the claim gone), so a second loss is told again. The gauge is kept per node, so a
reconcile does not sum over every node.
Not for: finding what is missing (``decide``), which is pure.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import structlog
from prometheus_client import Gauge

from tessera.controller.decide import MissingDevice

log = structlog.get_logger("tessera.operator")

MISSING = Gauge(
    "tessera_operator_claims_on_missing_devices", "Allocated claim devices that their node no longer has"
)

PostWarning = Callable[[MissingDevice], Awaitable[object]]


class MissingDevices:
    """What each node's claims miss, and what has been told of it."""

    def __init__(self, post_warning: PostWarning) -> None:
        self._post_warning = post_warning
        self._told: dict[str, set[tuple[str, str]]] = {}  # node -> (claim, device) told
        self._counts: dict[str, int] = {}

    async def tell(self, node: str, missing: tuple[MissingDevice, ...]) -> None:
        """An Event, once, for each claim allocated a device the node no longer has.

        A claim counts as told only once its Event was posted: one whose post failed is tried
        again on the next pass. The others are still tried; then the first failure is raised,
        so the work queue brings the node back.
        """
        self.set(node, missing)
        failure: BaseException | None = None
        for each in missing:
            key = (each.claim.key, each.device)
            if key in self._told.get(node, ()):
                continue
            log.error("a claim is allocated a device that no longer exists", node=node, claim=each.claim.key,
                      device=each.device)
            try:
                await self._post_warning(each)
            except Exception as exc:  # told on the next pass; the rest are still tried now
                failure = failure or exc
                continue
            self._told.setdefault(node, set()).add(key)
        if failure is not None:
            raise failure

    def set(self, node: str, missing: Iterable[MissingDevice]) -> None:
        """Forget what was told of claims no longer missing; keep the gauge."""
        current = {(m.claim.key, m.device) for m in missing}
        told = self._told.get(node)
        if told is not None:
            told &= current
            if not told:
                del self._told[node]
        self._counts[node] = len(current)
        if not current:
            del self._counts[node]
        MISSING.set(self.total)

    def forget(self, node: str) -> None:
        self.set(node, ())

    @property
    def total(self) -> int:
        return sum(self._counts.values())


def missing_device_event(missing: MissingDevice) -> tuple[dict[str, Any], str, str, str]:
    """The Event to post for ``missing``: the claim it is about, type, reason, message."""
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": missing.claim.name, "namespace": missing.claim.namespace, "uid": missing.claim.uid},
    }
    return claim, "Warning", "AllocatedDeviceMissing", missing.describe()
