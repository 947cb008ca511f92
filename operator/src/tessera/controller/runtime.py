"""The operator: the fleet view, the rooms it is made of, and one node's reconcile.

Watch events (SharingPolicies and ResourceClaims from the Kopf handlers in
``tessera.controller.handlers``; our slices, Nodes and NodeLayouts from the Controller's own
``tessera.kube.watch`` loops) update the :class:`~tessera.controller.state.Fleet` and enqueue
the nodes they touch; a reconcile decides (pure, ``decide``), then writes only what differs:
NodeLayout.spec, the node's ResourceSlices (the
:class:`~tessera.controller.publisher.SlicePublisher`, which makes the fewest writes),
evictions for timed-out ``Evict`` drains, and — debounced — every SharingPolicy status.

The Controller composes rooms, each with its own module and tests: the work queue
(``workqueue``: a few nodes at once, never two of the same, retries with backoff), the
handover (``handover``: taint, grace, then a fresh read of claims from ``freshclaims``
before a new layout), drains (``drains``: timeouts, evictions), claims on missing devices
(``missing``), the policy status passes (``statuswriter``), and the one door for writes
(``writes``), whose gate is where leader election shuts a standby out. Adaptive layouts
plug in beside ``decide``: a recut the demand room chooses is a change of a GPU's wanted
layout, carried out by the same handover.
Only a leader writes (``tessera.controller.leadership``): a standby reads the cluster and
follows every watch like a leader, so its view is warm, but its queue's workers and its status
passes wait on :attr:`Controller.leading` (:meth:`lead`, :meth:`follow`), which is also the
write door's gate; a write refused there or by the client's fence (``NotLeading``) puts its
node back for the next term.
Not for: deciding (``decide``, ``policystatus``), building slices (``tessera.dra``), or
keeping and writing them (``publisher``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any

import structlog

from tessera import INSTALL_NAMESPACE
from tessera.controller.claimchecks import ClaimChecks
from tessera.controller.decide import MissingDevice, NodeDecision, decide_node
from tessera.controller.demand import PODS, AdaptiveDemand, pod_stub
from tessera.controller.drains import Drains
from tessera.controller.freshclaims import FreshClaims
from tessera.controller.handover import APISERVER_START_WAIT_S, STARTING_S, Handover
from tessera.controller.missing import MissingDevices, missing_device_event
from tessera.controller.policysweep import PolicySweep
from tessera.controller.publisher import OURS, SlicePublisher, slice_pool, slice_stub
from tessera.controller.schedwake import WAKE_ANNOTATION, SchedulerWake
from tessera.controller.state import Fleet
from tessera.controller.statuswriter import PolicyStatusWriter
from tessera.controller.workqueue import WorkQueue
from tessera.controller.writes import ApiWrites, NotLeading
from tessera.dra.deviceclasses import device_classes
from tessera.dra.devices import DRIVER
from tessera.dra.nics import NIC_DRIVER
from tessera.kube.apiserverstarts import IDENTITY_SELECTOR, LEASES, started_ago
from tessera.kube.claims import NOT_FENCE_CLAIMS, write_claim_check_answer
from tessera.kube.http import ApiError, resource_path, retry_delay
from tessera.kube.objects import CLAIMS, DEVICE_CLASSES, LAYOUTS, NODES, POLICIES, SLICES, Api
from tessera.kube.watch import ListWatch, OnEvent
from tessera.models.layout import NodeLayout
from tessera.tasks import cancel

log = structlog.get_logger("tessera.operator")

DEFAULT_HANDOVER_GRACE = 1.0  # seconds between the taint's write and the claims read that may clear it
# Nodes reconciled at once. 16 made no 1,000-node rollout faster on the benchmark's machine, and
# the answers to the agents' claim checks, which share the client's connections, took twice as long.
DEFAULT_WORKERS = 8
# Kopf's finalizer from before leader election (Kopf now writes nothing): lifted by the leader.
LEGACY_FINALIZER = "tessera.dev/operator"
# How long a deleted claim's uid is remembered: far longer than one claim watch can run behind the
# other (a watch silent for 90 s is reopened), short enough that the set stays small.
DELETED_CLAIM_MEMORY_S = 600.0


class Controller:
    """Owns the fleet view and composes the rooms that queue, hand over and write."""

    def __init__(
        self, api: Api, fleet: Fleet | None = None, workers: int = DEFAULT_WORKERS,
        handover_grace: float = DEFAULT_HANDOVER_GRACE, leading: bool = True,
    ) -> None:
        self.api = api
        self.fleet = fleet or Fleet()
        self.decisions: dict[str, NodeDecision] = {}
        self.leading = asyncio.Event()  # set while this replica may write (see lead and follow)
        if leading:
            self.leading.set()
        self._terms = int(leading)
        self._term_tasks: list[asyncio.Task[None]] = []
        self.writes = ApiWrites(self.leading.is_set)
        self.queue = WorkQueue(self.reconcile, workers, self.leading)
        # The handover's fresh reads leave out the agents' fence claims: one a node, holding nothing.
        fresh = FreshClaims(lambda: self.api.list_all(*CLAIMS, NOT_FENCE_CLAIMS))
        self.handover = Handover(fresh, handover_grace, self.queue.later, self.enqueue, self.api.client.outages,
                                 known=lambda: self.ready.is_set())
        # The agents' checks of their nodes' claims (for specs that say claimCheck: Operator).
        self.claim_checks = ClaimChecks(self.api.client, self._answer_claim_check, INSTALL_NAMESPACE, self.leading,
                                        gone=self._claim_gone)
        self.publisher = SlicePublisher(api, self.writes, self._slices_changed)
        self.drains = Drains(self.fleet, self._evict_pod, self.queue.later)
        self.missing = MissingDevices(self._post_missing)
        self.demand = AdaptiveDemand(self, self._post_event)  # adaptive layouts: waiting claims -> recuts
        # Pods kube-scheduler refused while it counted a shared device twice: woken once.
        self.wake = SchedulerWake({c["metadata"]["name"] for c in device_classes()}, (DRIVER, NIC_DRIVER),
                                  self.demand.unschedulable_since, self._wake_scheduler)
        self.statuses = PolicyStatusWriter(self.fleet, self.decisions, self._patch_policy_status, self._post_event,
                                           self.demand.with_status)
        self._status_task: asyncio.Task[None] | None = None
        # Policies deleted while Kopf's watch was starting over (it says nothing of those).
        self.policy_sweep = PolicySweep(lambda: self.api.list_all(*POLICIES), self._read_policy,
                                        lambda: self.fleet.policy_bodies.keys() | self.fleet.policy_errors.keys(),
                                        self.policy_deleted, self.api.client.outages)
        self._watches: list[ListWatch] = []
        self._oldest_slice: str | None = None  # creationTimestamp of the oldest slice of ours at start
        # node -> the NodeLayout versions the watch brought while our spec write was in flight
        self._spec_in_flight: dict[str, list[str | None]] = {}
        self.ready = asyncio.Event()
        # Another room that reads Nodes and NodeLayouts (the NIC room): it gets every event of this
        # room's watches, so the cluster's largest objects are watched and decoded once.
        self._node_followers: list[OnEvent] = []
        self._layout_followers: list[OnEvent] = []
        # uid -> when it went: claims deleted, as either claim watch told it (see claim_seen).
        self._deleted_claims: dict[str, float] = {}

    @property
    def policy_epoch(self) -> int:
        return self.statuses.epoch

    # -- queue -----------------------------------------------------------------------------

    def enqueue(self, *nodes: str, bulk: bool = False) -> None:
        self.queue.enqueue(*nodes, bulk=bulk)

    def enqueue_all(self) -> None:
        """Every node, behind any node an event or a timer asks for (``WorkQueue``)."""
        self.enqueue(*sorted(self.fleet.nodes), bulk=True)

    def policies_changed(self) -> None:
        """Every node must be decided again; until it is, its GPUs do not count as applied."""
        self.statuses.policies_changed()
        self.enqueue_all()

    def status_changed(self) -> None:
        self.statuses.changed()

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
        for body in await self._list_until_answered(CLAIMS, NOT_FENCE_CLAIMS):
            self.fleet.set_claim(body)
            self.demand.claim_seen("ADDED", body)
            self.wake.claim_seen("ADDED", body)
        client = self.api.client
        self._watches = [
            # Pages of 100: a node's slice of 8 MIG GPUs is ~23 KB of JSON, and a NodeLayout of 8
            # GPUs ~15 KB and ~45 KiB parsed (a real Node is as large), so a page of 500 would add
            # tens of MB to the start's peak for nothing.
            ListWatch(client, *SLICES, self.slice_seen, label_selector=OURS, field_selector=f"spec.driver={DRIVER}",
                      stub=slice_stub, page_size=100),  # the NIC room's slices are not this room's to decode
            ListWatch(client, *NODES, self.node_seen, page_size=100),
            ListWatch(client, *LAYOUTS, self.layout_seen, page_size=100),
            ListWatch(client, *PODS, self.demand.pod_seen, stub=pod_stub),  # adaptive layouts' demand
        ]
        for watch in self._watches:  # in this order: the slices are known before the nodes are
            watch.start()
            await watch.listed.wait()
        await self._learn_apiserver_starts()
        if self.leading.is_set():  # else the first term removes them
            with contextlib.suppress(NotLeading):
                await self.publisher.remove_orphans(self.fleet.nodes)
        log.info("read the cluster", policies=len(self.fleet.policies), nodes=len(self.fleet.nodes),
                 gpu_nodes=len(self.fleet.gpu_nodes()), claims=len(self.fleet.claims))
        # A status pass on a half-swept fleet would count half the GPUs and write that.
        self.queue.sweep(self.fleet.nodes)
        self.enqueue_all()
        self.queue.start()
        self._status_task = asyncio.create_task(self.statuses.run(self.queue.swept, self.leading),
                                                name="tessera-policy-status")
        self.demand.start()
        self.wake.start()
        self.policy_sweep.start()
        self.claim_checks.start()
        self.ready.set()

    async def _learn_apiserver_starts(self) -> None:
        """An apiserver that started shortly before this process, while slices of ours existed,
        ended an outage this process did not see: kube-scheduler may still be coming back from
        it, so the handover holds for it as for one it saw (``tessera.kube.apiserverstarts``).
        Without leave to read the identity Leases, only the outages this process sees count."""
        try:
            leases = await self.api.client.list(LEASES, label_selector=IDENTITY_SELECTOR)
        except Exception as exc:  # forbidden, or the apiserver away again: not worth failing the start for
            log.info("cannot read the apiservers' identity leases; an apiserver restart before this process "
                     "started is not waited for", error=str(exc))
            return
        now = time.monotonic()
        for age in started_ago(leases, self._oldest_slice):
            if age < APISERVER_START_WAIT_S:
                log.info("an apiserver started shortly before this process; handovers wait for kube-scheduler",
                         started_s_ago=round(age, 1))
                self.api.client.outages.learned(now - age + STARTING_S)

    # -- leadership (the elector in tessera.controller.leadership calls these) ---------------

    def lead(self) -> None:
        """This replica holds the lease: reconcile every node, after removing orphaned slices.
        What an earlier term of ours proved about handovers counts no more (another leader may
        have written since), and statuses wait for this term's sweep."""
        if self._terms:
            self.handover.stop()
            self.handover = Handover(self.handover.fresh_claims, self.handover.grace, self.queue.later,
                                     self.enqueue, self.handover.outages, self.handover.known)
            self.queue.sweep(self.fleet.nodes)
        self._terms += 1
        self.leading.set()
        if self.ready.is_set():  # else start() is still reading the cluster, and does this itself
            self._spawn(self._begin_term())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._term_tasks = [t for t in self._term_tasks if not t.done()]
        self._term_tasks.append(asyncio.create_task(work, name="tessera-term"))

    def follow(self) -> None:
        """Another replica leads (or may): stop taking work; writes under way meet the gate or the fence."""
        self.leading.clear()

    async def _begin_term(self) -> None:
        self.enqueue_all()
        self.status_changed()
        for body in list(self.fleet.policy_bodies.values()):
            await self._lift_legacy_finalizer(body)
        try:
            await self.publisher.remove_orphans(self.fleet.nodes)
        except NotLeading:
            pass
        except Exception as exc:  # the apiserver away: the next term (or the Node's ownership of them) clears them
            log.warning("could not remove orphaned slices", error=repr(exc))

    async def _lift_legacy_finalizer(self, body: Mapping[str, Any]) -> None:
        """A policy from before leader election carries Kopf's old finalizer: take it off once
        the policy is being deleted (the leader's write), so that the deletion completes."""
        meta = body.get("metadata") or {}
        if not self.leading.is_set() or not meta.get("deletionTimestamp"):
            return
        if LEGACY_FINALIZER not in (meta.get("finalizers") or []):
            return
        try:
            await self.writes("sharingpolicy/finalizer", self.api.remove_policy_finalizer(dict(body), LEGACY_FINALIZER))
        except (NotLeading, ApiError) as exc:  # not leading, or the policy changed: its next event comes here again
            log.info("did not lift the old finalizer", policy=meta.get("name"), why=repr(exc))

    async def _list_until_answered(self, resource: tuple[str, str, str],
                                   label_selector: str = "") -> list[dict[str, Any]]:
        """A list at start, tried again after a backoff until the apiserver answers: the
        operator may start while the apiserver is away, and failing its start would leave the
        retry to Kopf's startup backoff, a whole minute."""
        for attempt in itertools.count():
            try:
                return await self.api.list_all(*resource, label_selector)
            except Exception as exc:  # the connection refused, a 5xx, a 403 while RBAC is applied ...
                delay = retry_delay(attempt)
                log.warning("cannot read the cluster yet; trying again", resource=resource[2], error=repr(exc),
                            retry_in=delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        for task in self._term_tasks:
            task.cancel()
        self.handover.stop()
        await self.demand.stop()
        await self.wake.stop()
        await self.policy_sweep.stop()
        for watch in self._watches:
            await watch.stop()
        await self.queue.stop()
        await self.claim_checks.stop()
        await cancel(self._status_task)

    # -- writes (each through the one door) ------------------------------------------------

    async def _read_policy(self, name: str) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = await self.api.client.get(resource_path(*POLICIES, name))
            return body
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _answer_claim_check(self, namespace: str, name: str, answer: str) -> None:
        await self.writes("claimcheck/answer", write_claim_check_answer(self.api.client, namespace, name, answer))

    async def _evict_pod(self, namespace: str, pod: str) -> bool:
        evicted: bool = await self.writes("pod/eviction", self.api.evict_pod(namespace, pod))
        return evicted

    async def _post_missing(self, missing: MissingDevice) -> None:
        await self.writes("event", self.api.post_event(*missing_device_event(missing)))

    async def _patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        await self.writes("sharingpolicy/status", self.api.patch_policy_status(name, status))

    async def _wake_scheduler(self, device_class: str, at: str) -> None:
        path = resource_path(*DEVICE_CLASSES, device_class)
        await self.writes("deviceclass/annotation",
                          self.api.client.patch(path, {"metadata": {"annotations": {WAKE_ANNOTATION: at}}}))

    async def _post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await self.writes("event", self.api.post_event(body, type_, reason, message))

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
            self.handover.forget(node)
            self.drains.forget(node)
            self.missing.forget(node)
            self.status_changed()
            return
        epoch = self.policy_epoch
        layout = view.layout
        assert layout is not None  # decide_node returned a decision
        # (a) Taint what the new layouts change, and know when that write was acknowledged.
        published = decision.devices_to_publish()
        await self.publisher.publish(node, view.uid, published)
        cleared = self.handover.handed_over(node, decision)
        if cleared:
            # (b) Claims read after the taint's grace and after the watch view this decision
            # used (an older read would hold on to claims the watch has seen go), then decide
            # again with both: only GPUs whose changing devices were all tainted and that no
            # claim holds get their new layout.
            fresh = self.handover.fresh_for(node, cleared)
            if fresh is None:
                # No worker waits for the list (of every claim: a while, in a large cluster);
                # the node comes back once it is read.
                return
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
                self.queue.later(node, self.handover.grace + 1.0)
        # (c) The new spec; devices it replaces stay tainted until the agent reports them gone.
        generation = await self._write_spec(node, layout, decision)
        devices = decision.devices_to_publish()
        if devices != published:  # unchanged, the publisher would build and compare them for nothing
            await self.publisher.publish(node, view.uid, devices)
        # Carried out: what is kept is the decision without its devices (published now, and at
        # thousands of GPUs too large to hold; the next decision builds its own).
        decision = replace(decision, epoch=epoch, spec_generation=generation, published=layout.status, devices=())
        await self.drains.evict(node, decision)
        self.drains.follow(node, decision, previous)
        self.decisions[node] = decision
        await self.missing.tell(node, decision.missing)
        self.status_changed()

    async def _write_spec(self, node: str, layout: NodeLayout, decision: NodeDecision) -> int | None:
        """Write the decision's spec where it differs from the NodeLayout's; the generation the
        spec is at afterwards."""
        if decision.spec == layout.spec:
            return layout.metadata.generation
        self._spec_in_flight[node] = []
        try:
            body = await self.writes("nodelayout/spec",
                                     self.api.patch_node_layout_spec(node, decision.spec.to_kube()))
        except BaseException:
            if self._spec_in_flight.pop(node, None):
                self.enqueue(node)  # what the watch brought meanwhile is not lost with the write
            raise
        brought = self._spec_in_flight.pop(node, [])
        generation: int | None = body["metadata"].get("generation")
        ours = body["metadata"].get("resourceVersion")
        if any(version != ours for version in brought):
            self.enqueue(node)  # someone else's version (the agent's status) came while we wrote
        view = self.fleet.nodes.get(node)
        if view is not None and view.layout is layout:
            # Only over the version this decision read: a watch event that came in while we
            # wrote (the agent's next status, say) is newer than our answer, and the watch
            # brings our write's own version in its turn anyway.
            self.fleet.set_layout(body)
        log.info("wrote NodeLayout spec", node=node, gpus=len(decision.spec.gpus))
        return generation

    # -- watch events (what the handlers hand over) ----------------------------------------

    def policy_seen(self, body: Mapping[str, Any]) -> None:
        """A SharingPolicy was created, changed or seen at start: decide every node again
        when what it asks for changed; its status is due either way."""
        if self.fleet.set_policy(body):
            self.policies_changed()
        self.status_changed()
        if LEGACY_FINALIZER in ((body.get("metadata") or {}).get("finalizers") or ()) and self.leading.is_set():
            self._spawn(self._lift_legacy_finalizer(body))

    def policy_deleted(self, name: str) -> None:
        """Its GPUs fall to the next policy, or stay as they are (unmanaged)."""
        self.fleet.remove_policy(name)
        self.policies_changed()

    def share_watches(self, node_seen: OnEvent, layout_seen: OnEvent) -> None:
        """Hand every Node and NodeLayout event of this room's watches on to another room as
        well, the start's lists included (so before :meth:`start`)."""
        self._node_followers.append(node_seen)
        self._layout_followers.append(layout_seen)

    @staticmethod
    def _hand_on(followers: list[OnEvent], event_type: str, body: dict[str, Any]) -> None:
        for follower in followers:
            try:
                follower(event_type, body)
            except Exception:  # another room's failure stays in that room: this one still sees the event
                log.exception("a room sharing this watch failed on an event", kind=event_type,
                              name=(body.get("metadata") or {}).get("name"))

    def node_seen(self, event_type: str, body: dict[str, Any]) -> None:
        """A Node event: a deleted Node is forgotten by its next reconcile; one whose labels
        changed is decided again."""
        self._hand_on(self._node_followers, event_type, body)
        name = str(body["metadata"]["name"])
        if event_type == "DELETED":
            self.enqueue(name)
            self.fleet.nodes.pop(name, None)
        elif self.fleet.set_node(body):
            self.enqueue(name)

    def layout_seen(self, event_type: str, body: dict[str, Any]) -> None:
        """A NodeLayout event: its node is decided again, unless the view holds that very
        version already or it is the echo of the spec this operator is writing now (the watch
        is often faster than the write's answer; ``_write_spec`` judges such events)."""
        self._hand_on(self._layout_followers, event_type, body)
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
        flight = self._spec_in_flight.get(name)
        if flight is not None and event_type != "DELETED":
            flight.append(version)  # judged when our spec write answers: its echo, or not
            return
        self.enqueue(name)

    def claim_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A ResourceClaim event: the nodes whose devices it holds or held are decided again.

        Two watches tell claim events: Kopf's (every event) and the ordered one of
        ``ClaimChecks`` (deletions, ``_claim_gone``), and either may run behind the other. A
        uid is never reused, so an event of a claim already deleted is old news and changes
        nothing: without that, Kopf's late events would bring a deleted claim back, holding its
        devices for good if Kopf's watch then started over (a relist says nothing of a claim
        that is gone). And a deletion of an older claim of the same name leaves the newer
        claim's hold where it is."""
        meta = body["metadata"]
        uid = str(meta.get("uid") or "")
        if event_type == "DELETED":
            if uid:
                self._bury_claim(uid)
            key = f"{meta.get('namespace', '')}/{meta['name']}"
            held = self.fleet.claims.get(key)
            if uid and held is not None and held.uid and held.uid != uid:
                return
            nodes = self.fleet.remove_claim(str(meta.get("namespace", "")), str(meta["name"]))
        elif uid in self._deleted_claims:
            return
        else:
            nodes = self.fleet.set_claim(body)
        self.demand.claim_seen(event_type, body)
        self.wake.claim_seen(event_type, body)
        self.enqueue(*sorted(nodes))

    def _claim_gone(self, body: Mapping[str, Any]) -> None:
        """A claim deletion the ordered claim watch saw (``ClaimChecks``): Kopf's handler
        usually has it already; after Kopf's watch started over it never will. Its uid is
        remembered even when the view does not hold it (yet): Kopf may not have told its
        creation."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if key in self.fleet.claims or key in self.fleet.pending_claims:
            self.claim_seen("DELETED", body)
        elif uid := str(meta.get("uid") or ""):
            self._bury_claim(uid)

    def _bury_claim(self, uid: str) -> None:
        now = time.monotonic()
        self._deleted_claims.pop(uid, None)
        self._deleted_claims[uid] = now  # the dict stays in the order of these times
        for old, when in list(itertools.islice(self._deleted_claims.items(), 64)):
            if when > now - DELETED_CLAIM_MEMORY_S:
                break
            del self._deleted_claims[old]

    def slice_seen(self, event_type: str, body: dict[str, Any]) -> None:
        """A watch event for one of our slices: someone else's change to a node's slices (see
        :meth:`SlicePublisher.seen`) has them planned again; our own writes change nothing."""
        if not self.ready.is_set():  # the start's list: how long slices of ours have existed
            created = (body.get("metadata") or {}).get("creationTimestamp")
            if isinstance(created, str) and (self._oldest_slice is None or created < self._oldest_slice):
                self._oldest_slice = created
        if self.publisher.seen(event_type, body) and (pool := slice_pool(body)) in self.fleet.nodes:
            self.enqueue(pool)

    def _slices_changed(self, pool: str) -> None:
        """Someone else changed a node's slices while we wrote to them: plan the node again."""
        if pool in self.fleet.nodes:
            self.enqueue(pool)

    async def _forget(self, node: str) -> None:
        """A node is gone: delete its slices (its Node owns them; this is belt and braces)."""
        await self.publisher.forget(node)
        self.decisions.pop(node, None)
        self.handover.forget(node)
        self.drains.forget(node)
        self.missing.forget(node)
        self.fleet.remove_node(node)
        self.status_changed()
