"""The operator's work loop: one queue of node names, a few reconciles at once (never two of
the same node).

Watch events (SharingPolicies and ResourceClaims from the Kopf handlers in
``tessera.controller.handlers``; our slices, Nodes and NodeLayouts from the Controller's own
``tessera.kube.watch`` loops) update the :class:`~tessera.controller.state.Fleet` and enqueue
the nodes they touch; the loop decides (pure), then writes only what differs: NodeLayout.spec,
the node's ResourceSlices (handed to the :class:`~tessera.controller.publisher.SlicePublisher`,
which makes the fewest writes), evictions for timed-out ``Evict`` drains, and — debounced —
every SharingPolicy status.

The handover, so that no claim ends up on a device that is about to go: a change to a GPU's
published devices is (a) published first as those devices tainted ``NoSchedule`` — the write
acknowledged; then, after a grace for scheduling cycles already under way, (b) the claims are
read again, directly (a list after that moment, shared by every node waiting for one), and
only when neither that read nor the watch shows a claim holding them is (c) the new layout
written to NodeLayout.spec. The agent checks the claims once more before it destroys anything.

Failed reconciles are retried with backoff. Several nodes are reconciled at once
(``workers``): a reconcile mostly waits for API round trips, so one at a time would publish a
large fleet at the speed of the apiserver's latency.
Not for: deciding (``decide``, ``policystatus``), building slices (``tessera.dra``), or
keeping and writing them (``publisher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram

from tessera.controller.decide import MissingDevice, NodeDecision, decide_node
from tessera.controller.policystatus import policy_status, tally, transitions
from tessera.controller.publisher import OURS, SlicePublisher, slice_pool, slice_stub
from tessera.controller.state import ClaimHold, DrainState, Fleet, claim_hold
from tessera.kube.http import ApiError, retry_delay
from tessera.kube.objects import CLAIMS, LAYOUTS, NODES, POLICIES, SLICES, Api
from tessera.kube.watch import ListWatch
from tessera.models.layout import NodeLayout
from tessera.models.policy import SharingPolicyStatus

log = structlog.get_logger("tessera.operator")

RECONCILES = Counter("tessera_operator_reconciles_total", "Node reconciles", ["result"])
RECONCILE_SECONDS = Histogram("tessera_operator_reconcile_seconds", "Time to reconcile one node")
API_WRITES = Counter("tessera_operator_api_writes_total", "API writes the operator made", ["what"])
STATUS_PASSES = Counter("tessera_operator_policy_status_passes", "Passes over every SharingPolicy status")
DRAINING = Gauge("tessera_operator_draining_gpus", "GPUs waiting for claims to release their devices")
MISSING = Gauge(
    "tessera_operator_claims_on_missing_devices", "Allocated claim devices that their node no longer has"
)
CLAIM_READS = Counter("tessera_operator_claim_reads_total", "Direct reads of every ResourceClaim for a handover")

DEFAULT_HANDOVER_GRACE = 1.0  # seconds between the taint's write and the claims read that may clear it
DEFAULT_WORKERS = 8  # nodes reconciled at once


class FreshClaims:
    """Every ResourceClaim's hold, read directly from the API, no older than a given moment.

    Many nodes waiting at once share one read: a caller gets the result of a list that was
    started at or after the moment it names, joining one in flight when it qualifies."""

    def __init__(self, read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> None:
        self._read = read
        self._last: tuple[float, list[ClaimHold]] | None = None
        self._inflight: tuple[float, asyncio.Task[list[ClaimHold]]] | None = None

    async def since(self, moment: float) -> list[ClaimHold]:
        while True:
            if self._last is not None and self._last[0] >= moment:
                return self._last[1]
            if self._inflight is not None:
                started, task = self._inflight
                holds = await asyncio.shield(task)
                if started >= moment:
                    return holds
                continue
            started = time.monotonic()
            task = asyncio.create_task(self._list(started))
            self._inflight = (started, task)

    async def _list(self, started: float) -> list[ClaimHold]:
        try:
            CLAIM_READS.inc()
            holds = [h for body in await self._read() if (h := claim_hold(body)) is not None]
            self._last = (started, holds)
            return holds
        finally:
            self._inflight = None

class Controller:
    """Owns the fleet view, the queue, and every write."""

    def __init__(
        self, api: Api, fleet: Fleet | None = None, workers: int = DEFAULT_WORKERS,
        handover_grace: float = DEFAULT_HANDOVER_GRACE,
    ) -> None:
        self.api = api
        self.fleet = fleet or Fleet()
        self.handover_grace = handover_grace
        self.fresh_claims = FreshClaims(lambda: api.list_all(*CLAIMS))
        # node -> GPU UUID -> (devices published tainted, when that write was acknowledged)
        self._tainted: dict[str, dict[str, tuple[frozenset[str], float]]] = {}
        self._missing_reported: dict[str, set[tuple[str, str]]] = {}  # node -> (claim, device) told
        self._missing_counts: dict[str, int] = {}
        self.decisions: dict[str, NodeDecision] = {}
        self.publisher = SlicePublisher(api, self._write)
        self.evicted: set[tuple[str, str]] = set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._active: set[str] = set()  # nodes being reconciled now
        self._again: set[str] = set()  # nodes enqueued while being reconciled: once more afterwards
        self.workers = workers
        self._draining: dict[str, int] = {}  # node -> GPUs draining there (for the gauge)
        self._pass_cost = 0.0  # seconds the last status pass spent computing
        self._failures: dict[str, int] = {}
        self.policy_epoch = 0  # goes up whenever what a policy asks for changes
        self._unswept: set[str] = set()  # nodes not reconciled since start: no status pass before
        self._swept = asyncio.Event()
        self._status_dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[ListWatch] = []
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.ready = asyncio.Event()

    # -- queue -----------------------------------------------------------------------------

    def enqueue(self, *nodes: str) -> None:
        for node in nodes:
            if node in self._active:
                self._again.add(node)
            elif node not in self._queued:
                self._queued.add(node)
                self._queue.put_nowait(node)

    def enqueue_all(self) -> None:
        self.enqueue(*sorted(self.fleet.nodes))

    def policies_changed(self) -> None:
        """Every node must be decided again; until it is, its GPUs do not count as applied."""
        self.policy_epoch += 1
        self.enqueue_all()
        self.status_changed()

    def status_changed(self) -> None:
        self._status_dirty.set()

    def _later(self, node: str, delay: float) -> None:
        """Reconcile ``node`` again after ``delay``, unless it is already due back sooner."""
        loop = asyncio.get_running_loop()
        old = self._timers.get(node)
        if old is not None and loop.time() < old.when() <= loop.time() + delay:
            return
        if old is not None:
            old.cancel()
        self._timers[node] = loop.call_later(delay, self.enqueue, node)

    async def start(self) -> None:
        """Read the cluster, then start deciding.

        Deciding on a partial view would be wrong in the worst way: without the policies a
        restart would rewrite every node to Exclusive, and without the claims it would hand
        over layouts that remove allocated partitions. So every policy and claim is read
        first, and the watches of our slices, the Nodes and the NodeLayouts (which keep the
        view fresh from then on) have each passed on their first list before the first
        reconcile. Their first list is the read: nothing is listed twice, and nothing is
        reconciled twice for it. Slices whose node has gone are deleted."""
        for body in await self._list_until_answered(POLICIES):
            self.fleet.set_policy(body)
        for body in await self._list_until_answered(CLAIMS):
            self.fleet.set_claim(body)
        client = self.api.client
        self._watches = [
            ListWatch(client, *SLICES, self.slice_seen, label_selector=OURS, stub=slice_stub),
            ListWatch(client, *NODES, self.node_seen),
            ListWatch(client, *LAYOUTS, self.layout_seen),
        ]
        for watch in self._watches:  # in this order: the slices are known before the nodes are
            watch.start()
            await watch.listed.wait()
        await self.publisher.remove_orphans(self.fleet.nodes)
        log.info("read the cluster", policies=len(self.fleet.policies), nodes=len(self.fleet.nodes),
                 gpu_nodes=len(self.fleet.gpu_nodes()), claims=len(self.fleet.claims))
        # A status pass on a half-swept fleet would count half the GPUs and write that.
        self._unswept = set(self.fleet.nodes)
        if not self._unswept:
            self._swept.set()
        self.enqueue_all()
        self._tasks = [
            *(asyncio.create_task(self._work(), name=f"tessera-reconcile-{i}") for i in range(self.workers)),
            asyncio.create_task(self._write_statuses(), name="tessera-policy-status"),
        ]
        self.ready.set()

    async def _list_until_answered(self, resource: tuple[str, str, str]) -> list[dict[str, Any]]:
        """A list at start, tried again after a backoff until the apiserver answers: the
        operator may start while the apiserver is away, and failing its start would leave the
        retry to Kopf's startup backoff, a whole minute."""
        for attempt in itertools.count():
            try:
                return await self.api.list_all(*resource)
            except Exception as exc:  # the connection refused, a 5xx, a 403 while RBAC is applied ...
                delay = retry_delay(attempt)
                log.warning("cannot read the cluster yet; trying again", resource=resource[2], error=repr(exc),
                            retry_in=delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        for watch in self._watches:
            await watch.stop()
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _write(self, what: str, call: Awaitable[Any]) -> Any:
        API_WRITES.labels(what).inc()
        return await call

    async def _work(self) -> None:
        while True:
            node = await self._queue.get()
            self._queued.discard(node)
            self._active.add(node)
            started = time.perf_counter()
            try:
                await self.reconcile(node)
            except ApiError as exc:
                self._retry(node, f"API error {exc.status}: {exc.reason}")
            except Exception as exc:  # a bug must not stop the loop for every other node
                log.exception("reconcile failed", node=node)
                self._retry(node, repr(exc))
            else:
                self._failures.pop(node, None)
                RECONCILES.labels("ok").inc()
            finally:
                RECONCILE_SECONDS.observe(time.perf_counter() - started)
                self._active.discard(node)
                self._unswept.discard(node)
                if not self._unswept:
                    self._swept.set()
                if node in self._again:
                    self._again.discard(node)
                    self.enqueue(node)

    def _retry(self, node: str, why: str) -> None:
        RECONCILES.labels("error").inc()
        count = self._failures[node] = self._failures.get(node, 0) + 1
        delay = retry_delay(count - 1)
        log.warning("reconcile will be retried", node=node, why=why, retry_in=delay)
        self._later(node, delay)

    # -- one node --------------------------------------------------------------------------

    async def reconcile(self, node: str) -> None:
        view = self.fleet.nodes.get(node)
        if view is None:
            await self._forget(node)
            return
        if view.layout_error is not None:
            # Nothing is decided on a NodeLayout we cannot read; the node stays as it is.
            log.warning("cannot read the NodeLayout; leaving the node as it is", node=node, error=view.layout_error)
            return
        previous = self.decisions.get(node)
        drains = previous.drains if previous else None
        decision = decide_node(self.fleet, node, time.monotonic(), drains)
        if decision is None:  # no agent has reported here (yet): nothing of ours should be published
            await self.publisher.publish(node, view.uid, ())
            self.decisions.pop(node, None)
            self._tainted.pop(node, None)
            self._set_draining(node, 0)
            self._report_missing(node, ())
            self.status_changed()
            return
        epoch = self.policy_epoch
        layout = view.layout
        assert layout is not None  # decide_node returned a decision
        # (a) Taint what the new layouts change, and know when that write was acknowledged.
        await self.publisher.publish(node, view.uid, decision.devices_to_publish())
        cleared = self._handed_over(node, decision)
        if cleared:
            # (b) Claims read after the taint's grace and after the watch view this decision
            # used (an older read would hold on to claims the watch has seen go), then decide
            # again with both: only GPUs whose changing devices were all tainted and that no
            # claim holds get their new layout.
            fresh = await self.fresh_claims.since(self._wave_read_after(cleared))
            decision = decide_node(
                self.fleet, node, time.monotonic(), drains, {u: d for u, (d, _) in cleared.items()}, fresh
            )
            if decision is None:
                return  # the NodeLayout went while we read; its deletion enqueues the node again
            layout = view.layout
            assert layout is not None
            if any(c not in self.fleet.claims for d in decision.drains.values() for c in d.claims):
                # A claim only the direct read has seen: the watch will bring it, but look again
                # anyway rather than wait on an event for a drain.
                self._later(node, self.handover_grace + 1.0)
        # (c) The new spec; devices it replaces stay tainted until the agent reports them gone.
        generation = await self._write_spec(node, layout, decision)
        await self.publisher.publish(node, view.uid, decision.devices_to_publish())
        # Carried out: what is kept is the decision without its devices (published now, and at
        # thousands of GPUs too large to hold; the next decision builds its own).
        decision = replace(decision, epoch=epoch, spec_generation=generation, published=layout.status, devices=())
        await self._evict(node, decision)
        self._follow_drains(node, decision, previous)
        self.decisions[node] = decision
        self._set_draining(node, sum(1 for d in decision.drains.values() if d.claims))
        await self._tell_missing(node, decision.missing)
        self.status_changed()

    async def _write_spec(self, node: str, layout: NodeLayout, decision: NodeDecision) -> int | None:
        """Write the decision's spec where it differs from the NodeLayout's; the generation the
        spec is at afterwards."""
        if decision.spec == layout.spec:
            return layout.metadata.generation
        body = await self._write("nodelayout/spec", self.api.patch_node_layout_spec(node, decision.spec.to_kube()))
        generation: int | None = body["metadata"].get("generation")
        view = self.fleet.nodes.get(node)
        if view is not None and view.layout is layout:
            # Only over the version this decision read: a watch event that came in while we
            # wrote (the agent's next status, say) is newer than our answer, and the watch
            # brings our write's own version in its turn anyway.
            self.fleet.set_layout(body)
        log.info("wrote NodeLayout spec", node=node, gpus=len(decision.spec.gpus))
        return generation

    async def _evict(self, node: str, decision: NodeDecision) -> None:
        """Evict the Pods of timed-out ``Evict`` drains, each once."""
        if decision.evict:  # forget evictions of Pods that no claim is reserved for any more
            self.evicted &= {pod for hold in self.fleet.claims.values() for pod in hold.pods}
        for namespace, pod in decision.evict:
            if (namespace, pod) not in self.evicted and await self._write(
                "pod/eviction", self.api.evict_pod(namespace, pod)
            ):
                self.evicted.add((namespace, pod))
                log.info("evicted a Pod to finish a drain", pod=f"{namespace}/{pod}", node=node)

    def _follow_drains(self, node: str, decision: NodeDecision, previous: NodeDecision | None) -> None:
        """Come back when a drain times out; say when a GPU starts waiting for claims."""
        for drain in decision.drains.values():
            if drain.claims and not drain.timed_out:
                self._later(node, self._drain_deadline(drain) - time.monotonic() + 0.05)
        for uuid, drain in decision.drains.items():
            if drain.claims and (previous is None or uuid not in previous.drains or not previous.drains[uuid].claims):
                log.info("draining GPU before changing its layout", node=node, gpu=drain.gpu_index,
                         waiting_for=drain.describe())

    async def _tell_missing(self, node: str, missing: tuple[MissingDevice, ...]) -> None:
        """An Event, once, for each claim allocated a device the node no longer has."""
        self._report_missing(node, missing)
        for each in missing:
            key = (each.claim.key, each.device)
            if key not in self._missing_reported.setdefault(node, set()):
                self._missing_reported[node].add(key)
                log.error("a claim is allocated a device that no longer exists", node=node, claim=each.claim.key,
                          device=each.device)
                claim = {
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": each.claim.name, "namespace": each.claim.namespace, "uid": each.claim.uid},
                }
                await self._write("event", self.api.post_event(claim, "Warning", "AllocatedDeviceMissing",
                                                               each.describe()))

    def _handed_over(self, node: str, decision: NodeDecision) -> dict[str, tuple[frozenset[str], float]]:
        """GPUs whose changing devices have been published tainted for at least the grace and
        that no claim in the watch's view holds: ready for the fresh read. Others are tracked,
        and the node comes back when their grace is over."""
        now = time.monotonic()
        tainted = self._tainted.setdefault(node, {})
        handing = {uuid: drain for uuid, drain in decision.drains.items() if not drain.claims}
        for uuid in [u for u in tainted if u not in decision.drains]:
            del tainted[uuid]  # settled, or it became something else: a new handover starts afresh
        ready: dict[str, tuple[frozenset[str], float]] = {}
        for uuid, drain in handing.items():
            known = tainted.get(uuid)
            if known is None or not drain.devices <= known[0]:
                known = tainted[uuid] = (drain.devices, now)  # published just now by the caller
            due = known[1] + self.handover_grace
            if due <= now:
                ready[uuid] = (known[0], due)
            else:
                self._later(node, self._wave_end(due) - now)  # the earliest due wins
        if not tainted:
            self._tainted.pop(node, None)
        return ready

    # One grace and one fresh claim list per wave (issue 22). Nodes handed over together end
    # their grace together: a grace that would end at ``due`` ends at the next wave boundary
    # (a multiple of half the grace), so every node whose taint was acknowledged in the same
    # half-grace comes back at the same moment and asks for a list started at or after it;
    # FreshClaims gives them all the one list (the first starts it, the others join it or take
    # its answer). Safety is the same as one list per node: every node's list still starts
    # after its own taint's grace (a boundary is never before the due it rounds up), so a
    # scheduling cycle that began before the taint has had its grace, and any claim it
    # allocated is in the list. The list may also be up to one grace older than the decision it
    # serves (not older): that can only add holds a claim's deletion has since removed, which
    # delays a GPU (it drains, and the node comes back), never cuts a device a claim holds.
    def _wave_end(self, due: float) -> float:
        step = max(self.handover_grace / 2, 0.01)
        return math.ceil(due / step) * step

    def _wave_read_after(self, cleared: Mapping[str, tuple[frozenset[str], float]]) -> float:
        """The moment a fresh claim list for ``cleared`` (GPU -> (devices, grace due)) must start
        after: its wave's end, and no more than one grace before now (so a later reconcile of the
        node, e.g. after a drain, reads claims again instead of reusing an old answer)."""
        wave = self._wave_end(max(due for _, due in cleared.values()))
        return max(wave, time.monotonic() - self.handover_grace)

    def _report_missing(self, node: str, missing: Iterable[MissingDevice]) -> None:
        """Forget what was told of claims no longer missing; keep the gauge without summing
        over every node on each reconcile."""
        current = {(m.claim.key, m.device) for m in missing}
        told = self._missing_reported.get(node)
        if told is not None:
            told &= current
            if not told:
                del self._missing_reported[node]
        self._missing_counts[node] = len(current)
        if not current:
            del self._missing_counts[node]
        MISSING.set(sum(self._missing_counts.values()))

    def _set_draining(self, node: str, gpus: int) -> None:
        """Keep the gauge without summing over every node's decision on each reconcile."""
        if gpus:
            self._draining[node] = gpus
        else:
            self._draining.pop(node, None)
        DRAINING.set(sum(self._draining.values()))

    def _drain_deadline(self, drain: DrainState) -> float:
        policy = self.fleet.policies.get(drain.policy or "")
        return drain.since + (policy.spec.drain.timeout_seconds if policy is not None else 3600.0)

    # -- watch events (what the handlers hand over) ----------------------------------------

    def policy_seen(self, body: Mapping[str, Any]) -> None:
        """A SharingPolicy was created, changed or seen at start: decide every node again
        when what it asks for changed; its status is due either way."""
        if self.fleet.set_policy(body):
            self.policies_changed()
        self.status_changed()

    def policy_deleted(self, name: str) -> None:
        """Its GPUs fall to the next policy, or stay as they are (unmanaged)."""
        self.fleet.remove_policy(name)
        self.policies_changed()

    def node_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A Node event: a deleted Node is forgotten by its next reconcile; one whose labels
        changed is decided again."""
        name = str(body["metadata"]["name"])
        if event_type == "DELETED":
            self.enqueue(name)
            self.fleet.nodes.pop(name, None)
        elif self.fleet.set_node(body):
            self.enqueue(name)

    def layout_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A NodeLayout event: its node is decided again, unless the view holds that very
        version already (the echo of the spec this operator wrote)."""
        name = str(body["metadata"]["name"])
        view = self.fleet.nodes.get(name)
        version = body["metadata"].get("resourceVersion")
        if (event_type != "DELETED" and version is not None and view is not None and view.layout is not None
                and view.layout_error is None and view.layout.metadata.resource_version == version):
            return
        if event_type == "DELETED":
            self.fleet.remove_layout(name)
        else:
            self.fleet.set_layout(body)
        self.enqueue(name)

    def claim_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A ResourceClaim event: the nodes whose devices it holds or held are decided again."""
        meta = body["metadata"]
        if event_type == "DELETED":
            nodes = self.fleet.remove_claim(str(meta.get("namespace", "")), str(meta["name"]))
        else:
            nodes = self.fleet.set_claim(body)
        self.enqueue(*sorted(nodes))

    def slice_seen(self, event_type: str, body: dict[str, Any]) -> None:
        """A watch event for one of our slices: someone else's change to a node's slices (see
        :meth:`SlicePublisher.seen`) has them planned again; our own writes change nothing."""
        if self.publisher.seen(event_type, body) and (pool := slice_pool(body)) in self.fleet.nodes:
            self.enqueue(pool)

    async def _forget(self, node: str) -> None:
        """A node is gone: delete its slices (its Node owns them; this is belt and braces)."""
        await self.publisher.forget(node)
        self.decisions.pop(node, None)
        self._tainted.pop(node, None)
        self._set_draining(node, 0)
        self._report_missing(node, ())
        self.fleet.remove_node(node)
        self.status_changed()

    # -- SharingPolicy status --------------------------------------------------------------

    async def _write_statuses(self) -> None:
        await self._swept.wait()
        while True:
            await self._status_dirty.wait()
            # Let a burst of reconciles land first. A pass costs time in proportion to the fleet,
            # so passes are spaced to spend at most a tenth of the time computing statuses.
            await asyncio.sleep(max(0.2, 10 * self._pass_cost))
            self._status_dirty.clear()
            try:
                await self.write_policy_statuses()
                STATUS_PASSES.inc()
            except Exception:  # keep the loop alive whatever one pass hit
                log.exception("writing SharingPolicy status failed; will retry")
                await asyncio.sleep(1.0)
                self._status_dirty.set()

    async def write_policy_statuses(self) -> None:
        pending = {node: d.epoch < self.policy_epoch for node, d in self.decisions.items()}
        decisions = list(self.decisions.values())
        self._pass_cost = 0.0
        for name, body in sorted(self.fleet.policy_bodies.items()):
            policy = self.fleet.policies.get(name)
            if policy is None:
                continue  # the CRD schema refuses what pydantic would; nothing to report on
            previous_raw = body.get("status")
            try:
                previous = SharingPolicyStatus.model_validate(previous_raw) if previous_raw else None
            except ValueError:
                previous = None
            started = time.perf_counter()
            status = policy_status(policy, tally(self.fleet, name, decisions, pending), previous)
            self._pass_cost += time.perf_counter() - started
            if previous is not None and status == previous:
                continue
            await self._write("sharingpolicy/status", self.api.patch_policy_status(name, status.to_kube()))
            body["status"] = status.to_kube()
            for type_, reason, message in transitions(previous, status):
                await self._write("event", self.api.post_event(body, type_, reason, message))
