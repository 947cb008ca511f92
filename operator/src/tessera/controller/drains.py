"""GPUs draining before their layout changes: when to look again, whom to evict, how many wait.

A drain waits for claims to release a GPU's changing devices; in ``Evict`` mode, once its
timeout passes, the Pods those claims are reserved for are evicted, each once (a Pod no claim
is reserved for any more is forgotten). The node is brought back when a drain times out. The
gauge of draining GPUs is kept per node, so a reconcile does not sum over every decision.
Not for: deciding who drains (``decide``) or the handover of GPUs no claim holds (``handover``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog
from prometheus_client import Gauge

from tessera.controller.decide import NodeDecision
from tessera.controller.state import DrainState, Fleet

log = structlog.get_logger("tessera.operator")

DRAINING = Gauge("tessera_operator_draining_gpus", "GPUs waiting for claims to release their devices")

DEFAULT_DRAIN_TIMEOUT = 3600.0  # seconds, for a drain whose policy has gone


class Drains:
    """Evictions made, GPUs draining per node, and the timers that end drains."""

    def __init__(self, fleet: Fleet, evict_pod: Callable[[str, str], Awaitable[bool]],
                 come_back: Callable[[str, float], None]) -> None:
        self._fleet = fleet
        self._evict_pod = evict_pod
        self._come_back = come_back
        self.evicted: set[tuple[str, str]] = set()
        self._draining: dict[str, int] = {}  # node -> GPUs draining there

    async def evict(self, node: str, decision: NodeDecision) -> None:
        """Evict the Pods of timed-out ``Evict`` drains, each once."""
        if decision.evict:  # forget evictions of Pods that no claim is reserved for any more
            self.evicted &= {pod for hold in self._fleet.claims.values() for pod in hold.pods}
        for namespace, pod in decision.evict:
            if (namespace, pod) not in self.evicted and await self._evict_pod(namespace, pod):
                self.evicted.add((namespace, pod))
                log.info("evicted a Pod to finish a drain", pod=f"{namespace}/{pod}", node=node)

    def follow(self, node: str, decision: NodeDecision, previous: NodeDecision | None) -> None:
        """Come back when a drain times out; say when a GPU starts waiting for claims; count them."""
        for drain in decision.drains.values():
            if drain.claims and not drain.timed_out:
                self._come_back(node, self.deadline(drain) - time.monotonic() + 0.05)
        for uuid, drain in decision.drains.items():
            if drain.claims and (previous is None or uuid not in previous.drains or not previous.drains[uuid].claims):
                log.info("draining GPU before changing its layout", node=node, gpu=drain.gpu_index,
                         waiting_for=drain.describe())
        self.set(node, sum(1 for d in decision.drains.values() if d.claims))

    def deadline(self, drain: DrainState) -> float:
        policy = self._fleet.policies.get(drain.policy or "")
        return drain.since + (policy.spec.drain.timeout_seconds if policy is not None else DEFAULT_DRAIN_TIMEOUT)

    def set(self, node: str, gpus: int) -> None:
        if gpus:
            self._draining[node] = gpus
        else:
            self._draining.pop(node, None)
        DRAINING.set(self.total)

    def forget(self, node: str) -> None:
        self.set(node, 0)

    @property
    def total(self) -> int:
        return sum(self._draining.values())
