"""Leader election through a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

One Lease names the holder (``holderIdentity``), how long a holder's claim lasts after its
last renewal (``leaseDurationSeconds``, 15 s by default), when the current holder acquired it
and last renewed it (``acquireTime``, ``renewTime``) and how often it changed hands
(``leaseTransitions``). Every write is an update at the resourceVersion last read, so of two
candidates racing for an expired lease the apiserver lets one win (409 Conflict for the other).

Timing follows client-go, on this process's monotonic clock only (never on the timestamps in
the Lease, which another machine's clock wrote):

- a candidate takes the lease only when its record has not changed for a whole lease duration
  since this process saw it change (it watches the Lease, so it sees a renewal within
  milliseconds and tries again the moment the duration has passed, not a retry period later);
- the leader renews every ``retry_period`` (2 s); each success opens the write fence
  (``tessera.kube.fence``) until the moment that renewal was sent plus ``renew_deadline``
  (10 s). Others can take the lease no sooner than a lease duration after they saw that
  renewal, which they cannot see before it was sent: so the fence shuts at least
  ``lease_duration - renew_deadline`` (5 s) before anyone else may write, whether or not this
  process is running to notice. A leader that sees another holder, or passes its deadline
  without a renewal, stops leading;
- ``release()`` (on a clean shutdown) shuts the fence first, then hands the lease over at once
  (an empty holder, a one-second duration), as client-go's ReleaseOnCancel does.

Not for: what a leader does (``tessera.controller.leadership`` starts and stops the work), nor
the write fence's check (``tessera.kube.http``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from tessera.kube.fence import WriteFence
from tessera.kube.http import ApiError, KubeClient, resource_path, retry_delay
from tessera.tasks import cancel

log = structlog.get_logger("tessera.kube.lease")

LEASES = ("coordination.k8s.io", "v1", "leases")
JITTER = 1.2  # client-go's JitterFactor: a candidate waits retry_period * (1 + up to 1.2)


@dataclass(frozen=True)
class LeaseTiming:
    """client-go's defaults. The renew deadline must be shorter than the lease duration (the
    gap is the margin between the leader's fence shutting and a standby taking over), and the
    retry period shorter than the renew deadline."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"lease timing: need 0 < retry period ({self.retry_period}) < renew deadline "
                f"({self.renew_deadline}) < lease duration ({self.lease_duration})"
            )


def micro_time(moment: datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_of(lease: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies one renewal of a Lease: any change to it means its holder is alive."""
    spec = lease.get("spec") or {}
    return tuple(spec.get(k) for k in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime",
                                       "leaseTransitions"))


class LeaseElector:
    """Campaigns for one Lease and keeps it while it can; ``run()`` until cancelled.

    ``on_started_leading`` and ``on_stopped_leading`` are called (plain calls, on the loop)
    when this process becomes the leader and when it stops; the fence is opened and shut by
    the elector itself, so the writes stop even when nobody acts on the callback in time."""

    def __init__(self, client: KubeClient, namespace: str, name: str, identity: str, fence: WriteFence, *,
                 timing: LeaseTiming | None = None,
                 on_started_leading: Callable[[], None] = lambda: None,
                 on_stopped_leading: Callable[[], None] = lambda: None,
                 on_observed: Callable[[dict[str, Any]], None] = lambda lease: None,
                 rng: random.Random | None = None) -> None:
        self.client = client  # its own client, without the fence: the lease itself must always be writable
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.fence = fence
        self.timing = timing or LeaseTiming()
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_observed = on_observed
        self.rng = rng or random.Random()
        self.clock = fence.clock
        self.leading = False
        self.holder: str | None = None  # as last seen
        self.transitions = 0  # leaseTransitions as last seen
        self._lease: dict[str, Any] | None = None  # the Lease as last read or written
        self._record: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # when this process last saw the record change (monotonic)
        self._changed = asyncio.Event()  # the watch saw a change
        self._path = resource_path(*LEASES, namespace=namespace)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch(), name="tessera-lease-watch")
        try:
            while True:
                await self._acquire()
                self._become_leader()
                await self._keep()
                self._stop_leading("lost the lease")
        finally:
            await cancel(watcher)

    async def _acquire(self) -> None:
        """Until this process holds the lease."""
        attempt = 0
        while True:
            try:
                if await self.try_acquire_or_renew():
                    return
                attempt = 0
                wait = self._wait_for_expiry()
            except Exception as exc:  # the apiserver away, a timeout: try again after a backoff
                log.warning("cannot read or take the lease", lease=self.name, error=repr(exc))
                wait = retry_delay(attempt)
                attempt += 1
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=wait)

    def _wait_for_expiry(self) -> float:
        """Seconds until the lease as last seen may be taken: at once when it has no holder;
        otherwise when a whole duration has passed since it last changed, but no later than a
        jittered retry period (the watch may have missed something)."""
        retry = self.timing.retry_period * (1 + self.rng.random() * JITTER)
        if not self.holder:
            return 0.0
        return max(0.0, min(retry, self._expires_at() - self.clock()))

    async def _keep(self) -> None:
        """Renew every retry period while the fence is open; return when the lease is lost."""
        while True:
            await asyncio.sleep(self.timing.retry_period)
            while self.fence.is_open():
                try:
                    if await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(0.01, self.fence.remaining())):
                        break
                    return  # another holder
                except Exception as exc:  # (a timeout, the apiserver away: retry until the deadline)
                    log.warning("cannot renew the lease", lease=self.name, error=repr(exc),
                                seconds_left=round(self.fence.remaining(), 1))
                    await asyncio.sleep(min(self.timing.retry_period / 4, self.fence.remaining()))
            else:
                return  # the renew deadline passed without a renewal

    # -- one attempt -------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """One try: True when this process holds the lease afterwards (the fence is then open
        until this try's start plus the renew deadline)."""
        sent = self.clock()  # before anything is sent: the conservative end of the window
        now = datetime.now(UTC)
        lease = self._lease if self.leading and self._lease is not None else await self._get()
        if lease is None:
            return await self._create(sent, now)
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity and self.clock() < self._expires_at():
            return False
        if holder != self.identity:
            self.fence.shut()  # another's lease until this write succeeds
        ours = holder == self.identity
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": _whole_seconds(self.timing.lease_duration),
            "acquireTime": spec.get("acquireTime") if ours and spec.get("acquireTime") else micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
        }
        body = {**lease, "spec": {**spec, **new_spec}}
        try:
            written = await self.client.replace(resource_path(*LEASES, self.name, namespace=self.namespace), body,
                                                timeout_s=self.timing.renew_deadline)
        except ApiError as exc:
            if exc.status == 409:  # someone wrote it since we read it: read again next time
                self._lease = None
                if self.leading:
                    return await self.try_acquire_or_renew()
                return False
            raise
        self._took(written, sent)
        return True

    async def _get(self) -> dict[str, Any] | None:
        try:
            return await self.client.get(resource_path(*LEASES, self.name, namespace=self.namespace),
                                         timeout_s=self.timing.renew_deadline)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _create(self, sent: float, now: datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"holderIdentity": self.identity,
                     "leaseDurationSeconds": _whole_seconds(self.timing.lease_duration),
                     "acquireTime": micro_time(now), "renewTime": micro_time(now), "leaseTransitions": 0},
        }
        try:
            written = await self.client.create(self._path, body, timeout_s=self.timing.renew_deadline)
        except ApiError as exc:
            if exc.status == 409:  # another candidate created it first
                return False
            raise
        self._took(written, sent)
        return True

    def _took(self, lease: dict[str, Any], sent: float) -> None:
        self._lease = lease
        self._observe(lease)
        self.fence.open_until(sent + self.timing.renew_deadline)

    def _observe(self, lease: dict[str, Any]) -> None:
        record = record_of(lease)
        spec = lease.get("spec") or {}
        if record != self._record:
            self._record = record
            self._observed_at = self.clock()
            self.holder = spec.get("holderIdentity") or None
            self.transitions = int(spec.get("leaseTransitions") or 0)
            self.on_observed(lease)
        if not self.leading:
            self._lease = lease

    def _expires_at(self) -> float:
        spec = (self._lease or {}).get("spec") or {}
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        return self._observed_at + duration

    # -- watching the lease (a standby sees renewals at once) --------------------------------

    async def _watch(self) -> None:
        attempt = 0
        while True:
            try:
                async for kind, lease in self.client.watch(self._path, field_selector=f"metadata.name={self.name}",
                                                           timeout_seconds=60):
                    attempt = 0
                    if kind in ("ADDED", "MODIFIED") and not self.leading:
                        self._observe(lease)
                        self._changed.set()
                    elif kind == "DELETED" and not self.leading:
                        self._lease, self.holder = None, None
                        self._changed.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # (the campaign goes on by its own reads meanwhile)
                log.debug("lease watch ended; watching again", error=repr(exc))
                await asyncio.sleep(retry_delay(attempt))
                attempt += 1

    # -- changes of role ---------------------------------------------------------------------

    def _become_leader(self) -> None:
        self.leading = True
        self.holder = self.identity
        log.info("leading", lease=f"{self.namespace}/{self.name}", identity=self.identity,
                 transitions=self.transitions)
        self.on_started_leading()

    def _stop_leading(self, why: str) -> None:
        self.fence.shut()
        self.leading = False
        self._lease = None
        log.warning("stopped leading", lease=f"{self.namespace}/{self.name}", identity=self.identity, why=why)
        self.on_stopped_leading()

    async def release(self) -> None:
        """Shut the fence, then hand the lease over at once (a clean shutdown)."""
        if not self.leading:
            return
        lease = self._lease
        self._stop_leading("shutting down")
        if lease is None:
            return
        now = micro_time(datetime.now(UTC))
        spec = {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1,
                "acquireTime": now, "renewTime": now}
        try:
            await self.client.replace(resource_path(*LEASES, self.name, namespace=self.namespace),
                                      {**lease, "spec": spec}, timeout_s=self.timing.retry_period)
        except Exception as exc:  # (the standby takes over when the lease expires anyway)
            log.warning("could not release the lease", error=repr(exc))


def _whole_seconds(seconds: float) -> int:
    return max(1, round(seconds))


def default_identity(pod_name: str | None, hostname: str) -> str:
    """``<pod or host>_<random>``: unique per process, so a restarted replica is a new candidate."""
    return f"{pod_name or hostname}_{random.getrandbits(32):08x}"

