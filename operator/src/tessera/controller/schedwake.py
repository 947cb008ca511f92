"""Wake kube-scheduler for Pods it refused while it counted a shared device twice.

kube-scheduler 1.36.5 sums the consumed capacity of the claims its informer shows allocated
and of the claims it still has in flight, so a claim whose allocation the informer has seen
but whose binding has not yet ended counts twice, for a few milliseconds. A Pod tried in that
moment on a shared device with just enough room left is refused ("cannot allocate all
claims"), and what comes next does not wake it: its DynamicResources plugin lets other claims'
allocations pass as no help. It waits for a claim to be released, a ResourceSlice or a
DeviceClass to change, or the unschedulable queue's sweep
(``--pod-max-in-unschedulable-pods-duration``: five minutes by default, and a flag managed
clusters do not offer). On this machine: 5 bursts in 85 of three Pods filling a 4Gi device
(``tests/integration/test_control_plane_dra.py``'s shares, run in a loop).

So the operator watches for that moment. A claim on Tessera's device classes whose Pod was
first seen Unschedulable within ``window`` seconds of a shared Tessera device's allocation (a
result with a share ID) is a suspect. ``settle`` seconds on (the in-flight record is long gone
by then) the operator writes an annotation (``WAKE_ANNOTATION``) on a DeviceClass a suspect
asks for: on any DeviceClass update the scheduler puts every Pod its DRA plugin refused
back in its active queue, and tries them again. A Pod that truly does not fit is refused again
and waits as before. Each suspect wakes the scheduler once, one DeviceClass is written at most
once per ``min_gap`` seconds for all suspects, and only the leader writes.

Claims come from the operator's claim events, Pods' refusals from the adaptive demand's Pod
watch (``AdaptiveDemand.unschedulable_since``): nothing more is watched for this.
Not for: claims that wait for room to be made (``tessera.controller.demand``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import Counter

from tessera.controller.periodic import Periodic
from tessera.controller.writes import NotLeading
from tessera.kube.http import ApiError

log = structlog.get_logger("tessera.operator")

WAKE_ANNOTATION = "tessera.dev/scheduler-woken-at"
WAKES = Counter("tessera_operator_scheduler_wakes_total",
                "DeviceClass writes that woke kube-scheduler for Pods refused on a shared device counted twice")

DEFAULT_WINDOW = 2.0  # seconds between a share's allocation and a refusal that may be its double count
DEFAULT_SETTLE = 2.0  # seconds after the refusal before the scheduler is woken
DEFAULT_MIN_GAP = 10.0  # seconds between two wakes
SHARES_KEPT = 60.0  # seconds a share's allocation is remembered

# (class, annotation value) -> the write; raises ApiError or NotLeading.
WriteClass = Callable[[str, str], Awaitable[Any]]


def _asked_classes(body: Mapping[str, Any], classes: Collection[str]) -> frozenset[str]:
    """The DeviceClasses of ``classes`` the claim's requests (or their alternatives) name."""
    names: set[str] = set()
    for request in ((body.get("spec") or {}).get("devices") or {}).get("requests") or ():
        for part in (request.get("exactly"), *(request.get("firstAvailable") or ())):
            if part and part.get("deviceClassName") in classes:
                names.add(str(part["deviceClassName"]))
    return frozenset(names)


def _allocates_a_share(body: Mapping[str, Any], drivers: Collection[str]) -> bool:
    allocation = (body.get("status") or {}).get("allocation") or {}
    return any(r.get("shareID") and r.get("driver") in drivers
               for r in (allocation.get("devices") or {}).get("results") or ())


class SchedulerWake:
    """Suspects in (claim events, and the time each claim's Pod was first seen refused),
    DeviceClass writes out (:meth:`run_pass`, every ``interval`` seconds once started)."""

    def __init__(
        self,
        classes: Collection[str],
        drivers: Collection[str],
        unschedulable_since: Mapping[str, float],
        write: WriteClass,
        *,
        window: float = DEFAULT_WINDOW,
        settle: float = DEFAULT_SETTLE,
        min_gap: float = DEFAULT_MIN_GAP,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.classes = frozenset(classes)
        self.drivers = frozenset(drivers)
        self.unschedulable_since = unschedulable_since  # claim key -> first seen refused (``clock``)
        self.write = write
        self.window, self.settle, self.min_gap, self.interval = window, settle, min_gap, interval
        self.clock, self.wall_clock = clock, wall_clock
        self.waiting: dict[str, frozenset[str]] = {}  # unallocated claim -> the classes of ours it asks for
        self.woken: set[str] = set()  # waiting claims the scheduler was woken for
        self.shares: list[float] = []  # when waiting claims were seen allocated a share, in order
        self.last_write: float | None = None  # when a DeviceClass was last written
        self._passes = Periodic(self.run_pass, lambda: self.interval, "tessera-scheduler-wake")

    def claim_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        allocated = bool((body.get("status") or {}).get("allocation"))
        if event_type == "DELETED" or allocated:
            if self.waiting.pop(key, None) is not None and allocated and _allocates_a_share(body, self.drivers):
                self.shares.append(self.clock())
            self.woken.discard(key)
            return
        asked = _asked_classes(body, self.classes)
        if asked:
            self.waiting[key] = asked

    def due(self) -> tuple[str, list[str]] | None:
        """The DeviceClass to write now and the suspects it wakes, or None. Any DeviceClass
        update wakes every Pod the DRA plugin refused, so one class is written for them all,
        at most once per ``min_gap``."""
        now = self.clock()
        del self.shares[:bisect.bisect_left(self.shares, now - SHARES_KEPT)]
        if self.last_write is not None and now - self.last_write < self.min_gap:
            return None
        suspects = []
        for key in sorted(self.waiting):
            refused = self.unschedulable_since.get(key)
            if key in self.woken or refused is None or now - refused < self.settle:
                continue
            nearest = bisect.bisect_left(self.shares, refused - self.window)  # the first share not too early
            if nearest < len(self.shares) and self.shares[nearest] <= refused + self.window:
                suspects.append(key)
        if not suspects:
            return None
        return min(self.waiting[suspects[0]]), suspects

    async def run_pass(self) -> bool:
        """Write what :meth:`due` says; True when a DeviceClass was written."""
        due = self.due()
        if due is None:
            return False
        device_class, suspects = due
        try:
            await self.write(device_class, self.wall_clock().isoformat())
        except NotLeading:
            return False
        except (ApiError, OSError, TimeoutError) as error:  # tried again after min_gap
            self.last_write = self.clock()
            log.warning("cannot wake the scheduler through a DeviceClass", device_class=device_class, error=str(error))
            return False
        self.last_write = self.clock()
        self.woken.update(suspects)
        WAKES.inc()
        log.info("woke the scheduler for claims refused beside a share's allocation", device_class=device_class,
                 claims=suspects)
        return True

    def start(self) -> None:
        self._passes.start()

    async def stop(self) -> None:
        await self._passes.stop()
