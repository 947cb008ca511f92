"""SharingPolicy deletions that Kopf's watch cannot see, found by reading the policies again.

When Kopf's watch of SharingPolicies must start over (its resourceVersion is too old: after an
apiserver restart, or a long disconnect) it lists them again and passes each on, but says
nothing of one deleted meanwhile: the operator would go on applying a policy that no longer
exists, and write the layouts of its GPUs (a fault campaign's restarted operator found it
undoing them). Tessera's policies carry no finalizer, so the deletion leaves no other trace.
So the policies are listed again every ``EVERY_S`` seconds, and at once after an outage of
the apiserver that this process saw ends; a policy the view holds that the list lacks is read
by name, and only a 404 makes it deleted (one created after the list began is in the view and
not in the list, and still exists). A list of policies is small: a cluster has a few.
Not for: what a deletion does to the layouts (``runtime.Controller.policy_deleted``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import structlog
from prometheus_client import Counter

from tessera.controller.periodic import Periodic
from tessera.kube.outages import Outages

log = structlog.get_logger("tessera.operator")

FOUND_DELETED = Counter("tessera_operator_policies_found_deleted_total",
                        "SharingPolicies found deleted by reading them again, no watch event having said so")

EVERY_S = 30.0  # between reads when nothing suggests a watch started over
TICK_S = 1.0  # how often the sweep looks whether an outage has ended since it last read


class PolicySweep:
    """Lists the policies again now and then; tells ``deleted`` of those gone unannounced."""

    def __init__(self, list_policies: Callable[[], Awaitable[list[dict[str, Any]]]],
                 get_policy: Callable[[str], Awaitable[dict[str, Any] | None]],
                 known: Callable[[], Iterable[str]], deleted: Callable[[str], None], outages: Outages,
                 every: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._list, self._get, self._known, self._deleted = list_policies, get_policy, known, deleted
        self.outages = outages
        self.every = every
        self._clock = clock
        self._read_at: float | None = None  # when the last read began
        self.deletions = 0  # policies found gone that no watch event had removed
        self._passes = Periodic(self.run_pass, lambda: TICK_S, "tessera-policy-sweep")

    def start(self) -> None:
        self._passes.start()

    async def stop(self) -> None:
        await self._passes.stop()

    def due(self) -> bool:
        """Whether to read now: never while the apiserver is away; after ``every`` seconds, or
        once an outage that ended since the last read is over."""
        if self.outages.since is not None:
            return False
        if self._read_at is None:
            return True
        ended = max((spell.ended for spell in self.outages.spells), default=None)
        return self._clock() - self._read_at >= self.every or (ended is not None and ended > self._read_at)

    async def run_pass(self) -> None:
        if not self.due():
            return
        self._read_at = self._clock()
        listed = {str(body["metadata"]["name"]) for body in await self._list()}
        for name in sorted(set(self._known()) - listed):
            if await self._get(name) is None:
                log.warning("a SharingPolicy was deleted without a watch event reaching the operator; "
                            "forgetting it", policy=name)
                self.deletions += 1
                FOUND_DELETED.inc()
                self._deleted(name)
