"""Adaptive layouts in the operator: waiting claims in, recuts of idle GPUs out.

A claim is **pending** for Tessera when it is unallocated, every request asks for one of
Tessera's device classes, and a Pod that uses it has been ``PodScheduled=False`` with reason
``Unschedulable`` for longer than the debounce (the shortest ``pendingAfter`` of the Adaptive
policies). Claims come from the Controller's claim events (the Kopf handler stays as it is);
Pods from a list-watch of this module's own.

Every ``interval`` the pass collects the GPUs of ``Adaptive`` policies from the Controller's
last decisions, marks a GPU recuttable only when no claim holds any of its devices, nothing
on it is in use, its cooldown has passed and no recut of it is under way, and asks the pure
room (``tessera.adaptive.choose.plan_recuts``) what to recut, offering it too the devices
of those GPUs (not being recut) that no claim holds, so a claim that needs a recut GPU and a
device free beside it is served. A recut is only a choice in
``Fleet.adaptive_choices`` and a reconcile of its node: the Controller then hands the GPU over
as for any layout change (taint, grace, a fresh claim list, then the spec) and the agent's
claim guard checks again, unchanged. GPUs whose devices are all free go back to the idle
layout once their cooldown has passed, unless the pass has just planned them for a claim, or
claims that arrived within the cooldown would use them as they are (``plan_ahead``'s ``lately``:
recuts ahead look back one lead time, keeping looks back one cooldown, so a sliding lead window
does not flap a GPU), so alternating demand recuts a GPU at most once per cooldown. The moment of each choice is kept in
the policy status (``adaptive[].since``), so a restarted operator counts the cooldown from it
rather than from its own start.

A waiting claim that no single GPU can host keeps a node (``plan_reservations``): the
devices of that node's Adaptive GPUs are published with the ``tessera.dev/reserved`` taint
(``Fleet.adaptive_reserved``, laid on by the decision like a drain taint but never counted by
the handover) until its free devices can hold the claim; then untainted, the scheduler places
it. The taint only keeps new allocations off; it never touches one.

People hear of it: an Event on the claim when a GPU is recut for it or a node kept, one Warning (once per
claim) when no layout of any menu could ever satisfy it, and metrics: pending claims, recuts,
seconds from pending to allocated, and the fragmentation score of the last plan.
Not for: deciding the layouts (``tessera.adaptive``) or writing NodeLayouts (the Controller).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Gauge, Histogram

from tessera.adaptive.choose import (
    AdaptiveGpu,
    AheadPlan,
    MenuCache,
    RecutPlan,
    Reservation,
    back_to_idle,
    plan_ahead,
    plan_recuts,
    plan_reservations,
)
from tessera.adaptive.claims import ClaimDemand, Slot, claim_demand, class_selectors
from tessera.adaptive.layouts import slots_of
from tessera.controller.decide import NodeDecision
from tessera.controller.periodic import Periodic
from tessera.controller.state import Fleet
from tessera.dra.deviceclasses import device_classes
from tessera.dra.devices import RESERVED_TAINT_KEY, build_gpu_devices
from tessera.models.conditions import format_rfc3339, parse_rfc3339
from tessera.models.devices import parse_device_name
from tessera.models.layout import GpuLayout, GpuStatus
from tessera.models.policy import AdaptiveGpuLayout, SharingPolicy, SharingPolicyStatus, Strategy

log = structlog.get_logger("tessera.operator.adaptive")

PENDING = Gauge("tessera_operator_adaptive_pending_claims", "Claims on Tessera's classes waiting past the debounce")
RECUTS = Counter("tessera_operator_adaptive_recuts_total", "GPUs recut by Adaptive policies", ["why"])
PENDING_SECONDS = Histogram(
    "tessera_operator_adaptive_pending_to_allocated_seconds",
    "From a claim's Pod first seen Unschedulable to the claim allocated",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
RESERVED = Gauge("tessera_operator_adaptive_reserved_nodes",
                 "Nodes kept for waiting claims that need several of their GPUs")
FRAGMENTATION = Gauge(
    "tessera_operator_adaptive_fragmentation",
    "GPU capacity the last adaptive plan leaves free that recent claims could not use (in GPUs)",
)

DEFAULT_INTERVAL = 1.0  # seconds between passes
RECUT_SECONDS = 20.0  # what a recut is taken to last (handover grace, agent apply, publish), for the lead time
AHEAD_FACTOR = 2.0  # the lead time's claims forecast the next: twice the wait a recut would cost


@dataclass(frozen=True)
class _Pass:
    plan: RecutPlan
    gpus: list[AdaptiveGpu]
    free: dict[str, list[Slot]]
    left: dict[str, int]
    lead: float  # seconds of arrivals that forecast the next claims
    cooldown: float  # seconds of arrivals whose free devices stay off back_to_idle (the longest cooldown)
    reservations: list[Reservation]
    node_gpus: dict[str, frozenset[str]]  # node -> its Adaptive GPUs (UUIDs)


@dataclass(frozen=True)
class _Gpus:
    """What :meth:`AdaptiveDemand.adaptive_gpus` finds."""

    gpus: list[AdaptiveGpu]
    under_way: dict[str, int]  # policy -> recuts under way
    free: dict[str, list[Slot]]  # node -> devices no claim holds, of GPUs not being recut
    node_gpus: dict[str, frozenset[str]]  # node -> its Adaptive GPUs (UUIDs)
    busy: frozenset[str]  # UUIDs of GPUs a claim holds or uses


RECENT_CLAIMS = 64  # claim shapes kept for the fragmentation score
ARRIVALS_KEPT = 1024  # claims kept with their arrival, for recuts ahead and the GPUs kept from idle


class ControllerView(Protocol):
    """What the demand loop needs of the Controller."""

    fleet: Fleet
    decisions: dict[str, NodeDecision]

    def enqueue(self, *nodes: str) -> None: ...


@dataclass
class _Choice:
    layout: str
    reason: str
    since: float  # monotonic time it was chosen (-inf: never chosen, as far as anyone recorded)
    chosen_at: str | None = None  # the same instant in RFC 3339, as the policy status keeps it


PODS = ("", "v1", "pods")


def _gpu_index(device: str) -> int | None:
    try:
        return parse_device_name(device).gpu_index
    except ValueError:
        return None


def _has_layout(gpu: GpuStatus, layout: GpuLayout | None) -> bool:
    """The agent reports ``layout`` applied: its strategy, sharing and MIG instances."""
    if layout is None or not gpu.applied:
        return False
    have = sorted((i.profile, i.start) for i in gpu.mig_instances if not i.dynamic)
    want = sorted((p.profile, p.start) for p in layout.mig_instances)
    return (gpu.strategy, gpu.mig_sharing, have) == (layout.strategy, layout.mig_sharing, want)


def pod_stub(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the Pod watch keeps of a Pod: enough to name its claims when it is deleted."""
    status = pod.get("status") or {}
    return {
        "metadata": {k: v for k, v in (pod.get("metadata") or {}).items() if k in ("name", "namespace",
                                                                                   "resourceVersion", "uid")},
        "spec": {"resourceClaims": (pod.get("spec") or {}).get("resourceClaims") or []},
        "status": {"resourceClaimStatuses": status.get("resourceClaimStatuses") or []},
    }


def pod_claims(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims (namespace/name) a Pod uses: named ones and those made from templates."""
    namespace = str(pod.get("metadata", {}).get("namespace", ""))
    names = [str(c["resourceClaimName"]) for c in (pod.get("spec") or {}).get("resourceClaims") or ()
             if c.get("resourceClaimName")]
    names += [str(s["resourceClaimName"]) for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
              if s.get("resourceClaimName")]
    return [f"{namespace}/{n}" for n in sorted(set(names))]


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """``PodScheduled=False`` with reason ``Unschedulable``, and not bound or nominated."""
    status = pod.get("status") or {}
    if (pod.get("spec") or {}).get("nodeName") or status.get("nominatedNodeName"):
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ()
    )


class AdaptiveDemand:
    """Owns the pending claims, the choices per GPU, and the passes that recut."""

    def __init__(
        self,
        controller: ControllerView,
        post_event: Callable[[dict[str, Any], str, str, str], Awaitable[None]],
        *,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.controller = controller
        self.post_event = post_event
        self.interval = interval
        self.clock = clock
        self.wall_clock = wall_clock
        self.classes = class_selectors(device_classes())
        self.claims: dict[str, ClaimDemand] = {}  # unallocated claims on our classes
        self.unschedulable_since: dict[str, float] = {}  # claim -> first seen with an Unschedulable Pod
        self.choices: dict[str, _Choice] = {}  # GPU UUID -> the layout chosen and why
        self.warned: set[str] = set()  # claim UIDs told that nothing can satisfy them
        self.recent: list[ClaimDemand] = []
        self.arrivals: list[tuple[float, ClaimDemand]] = []  # (first seen, claim), the last ARRIVALS_KEPT
        self.menus = MenuCache()
        self.last_plan: RecutPlan | None = None
        self.reserved: dict[str, str] = {}  # claim -> the node kept for it
        self._passes = Periodic(self.run_pass, lambda: self.interval, "tessera-adaptive")

    # -- events ----------------------------------------------------------------------------

    def claim_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        demand = None if event_type == "DELETED" else claim_demand(body, self.classes)
        if demand is None:
            self.claims.pop(key, None)
            since = self.unschedulable_since.pop(key, None)
            allocated = event_type != "DELETED" and (body.get("status") or {}).get("allocation")
            if since is not None and allocated:
                PENDING_SECONDS.observe(self.clock() - since)
            return
        if key not in self.claims:
            self.recent = [*self.recent[-(RECENT_CLAIMS - 1):], demand]
            self.arrivals = [*self.arrivals[-(ARRIVALS_KEPT - 1):], (self.clock(), demand)]
        self.claims[key] = demand

    def pod_seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        waiting = event_type != "DELETED" and unschedulable(body)
        for claim in pod_claims(body):
            if waiting:
                self.unschedulable_since.setdefault(claim, self.clock())
            elif claim not in self.claims or event_type == "DELETED":
                self.unschedulable_since.pop(claim, None)

    # -- the pass ----------------------------------------------------------------------------

    def start(self) -> None:
        self._passes.start()

    async def stop(self) -> None:
        await self._passes.stop()

    def adaptive_policies(self) -> dict[str, SharingPolicy]:
        return {n: p for n, p in self.controller.fleet.policies.items() if p.spec.strategy is Strategy.ADAPTIVE}

    def pending(self, policies: Mapping[str, SharingPolicy]) -> list[ClaimDemand]:
        """Claims waiting past the debounce, oldest first."""
        if not policies:
            return []
        debounce = min(p.spec.adaptive.pending_after_seconds for p in policies.values() if p.spec.adaptive)
        now = self.clock()
        waiting = [(since, key) for key, since in self.unschedulable_since.items()
                   if key in self.claims and now - since >= debounce]
        return [self.claims[key] for _, key in sorted(waiting)]

    def adaptive_gpus(self, policies: Mapping[str, SharingPolicy]) -> _Gpus:
        """Every GPU an Adaptive policy won, whether it may be recut now, per policy how many
        recuts are under way, per node the devices of those GPUs that no claim holds and no
        recut is replacing (a claim may need one of them beside a recut GPU) and its Adaptive
        GPUs, and which of them a claim holds or uses."""
        fleet = self.controller.fleet
        now = self.clock()
        out: list[AdaptiveGpu] = []
        under_way: dict[str, int] = dict.fromkeys(policies, 0)
        free: dict[str, list[Slot]] = {}
        node_gpus: dict[str, set[str]] = {}  # node -> its Adaptive GPUs (UUIDs)
        busy_gpus: set[str] = set()
        for node, decision in sorted(self.controller.decisions.items()):
            view = fleet.nodes.get(node)
            if view is None or view.layout is None:
                continue
            held = fleet.holders(node)
            status = view.layout.status
            decided = {g.uuid: g for g in decision.gpus}
            for plan in decision.plan.for_node(node):
                policy = policies.get(plan.policy or "")
                if policy is None or policy.spec.adaptive is None:
                    continue
                gpu = plan.gpu
                current, choice = self._choice(policy, view.layout.spec.for_gpu(gpu.uuid), gpu.uuid, now)
                reported = status.gpu(gpu.uuid) if status is not None else None
                wanted = decided.get(gpu.uuid)
                applying = (
                    wanted is None
                    or not wanted.settled
                    or reported is None
                    or not _has_layout(reported, wanted.target)
                    or current != choice.layout
                )
                if applying:
                    under_way[policy.name] += 1
                elif reported is not None:
                    built = slots_of(build_gpu_devices(reported))
                    free.setdefault(node, []).extend(s for s in built if s.name not in held)
                node_gpus.setdefault(node, set()).add(gpu.uuid)
                busy = gpu.in_use or any(i.in_use for i in gpu.mig_instances) or any(
                    _gpu_index(device) == gpu.index for device in held
                )
                if busy:
                    busy_gpus.add(gpu.uuid)
                cooled = now - choice.since >= policy.spec.adaptive.cooldown_seconds
                out.append(AdaptiveGpu(node, gpu, policy, current, not busy and not applying and cooled))
        return _Gpus(out, under_way, free, {n: frozenset(u) for n, u in node_gpus.items()}, frozenset(busy_gpus))

    def _choice(self, policy: SharingPolicy, spec: GpuLayout | None, gpu: str, now: float) -> tuple[str, _Choice]:
        """The menu layout a GPU's ``spec`` names (the idle one when it names none), and this
        process's choice for the GPU: when first seen, or after a restart, ``_remembered``."""
        assert policy.spec.adaptive is not None
        current = spec.menu_layout if spec is not None and spec.menu_layout else policy.spec.adaptive.idle
        choice = self.choices.get(gpu)
        if choice is None:
            choice = self.choices[gpu] = self._remembered(policy, gpu, current, now)
        return current, choice

    def _remembered(self, policy: SharingPolicy, gpu: str, layout: str, now: float) -> _Choice:
        """A GPU this process has not chosen for yet: what the policy's status recorded of it.

        The status row of ``layout`` gives the reason (kept, so no status is rewritten for
        nothing) and ``since``, when it was chosen: the cooldown counts from that instant, not
        from this process's start, so a restart never lets a GPU flap. Without a recorded time a
        GPU on a layout other than the idle one was cut at some unknown moment before now: its
        cooldown starts now (the safe side). A GPU on the idle layout with nothing recorded was
        never recut by anyone: it may be recut at once."""
        assert policy.spec.adaptive is not None
        idle = layout == policy.spec.adaptive.idle
        status = self.controller.fleet.policy_bodies.get(policy.name, {}).get("status") or {}
        rows: list[dict[str, Any]] = status.get("adaptive") or []
        row = next((r for r in rows if r.get("gpu") == gpu and r.get("layout") == layout), {})
        why = str(row.get("reason") or "") or ("idle default" if idle else "kept from before")
        chosen_at = parse_rfc3339(row.get("since"))
        if chosen_at is not None:
            age = max(0.0, (self.wall_clock() - chosen_at).total_seconds())
            return _Choice(layout, why, now - age, format_rfc3339(chosen_at))
        if not idle:
            return _Choice(layout, why, now, format_rfc3339(self.wall_clock()))
        return _Choice(layout, why, -math.inf)

    def choose(self) -> tuple[RecutPlan, list[AdaptiveGpu]] | None:
        """What the pure room would recut now (None: no Adaptive policy); changes nothing
        (``tessera plan --live`` shows it as it is)."""
        chosen = self._choose()
        return (chosen.plan, chosen.gpus) if chosen is not None else None

    def _choose(self) -> _Pass | None:
        policies = self.adaptive_policies()
        pending = self.pending(policies)
        PENDING.set(len(pending))
        if not policies:
            return None
        found = self.adaptive_gpus(policies)
        gpus, free = found.gpus, found.free
        left = {n: max(0, p.spec.adaptive.max_recuts - found.under_way.get(n, 0))
                for n, p in policies.items() if p.spec.adaptive}
        limit = max(p.spec.adaptive.max_recuts for p in policies.values() if p.spec.adaptive)
        reservations = plan_reservations(pending, gpus, self.classes, free=free, busy=found.busy,
                                         previous=self.reserved, limit=limit, menus=self.menus)
        plan = plan_recuts(pending, gpus, self.classes, left, free=free, recent=self.recent,
                           reserved={r.node: r.claim for r in reservations}, menus=self.menus)
        cooldown = max(p.spec.adaptive.cooldown_seconds for p in policies.values() if p.spec.adaptive)
        return _Pass(plan, gpus, free, left, self.lead_time(policies), cooldown, reservations, found.node_gpus)

    def lead_time(self, policies: Mapping[str, SharingPolicy]) -> float:
        """How far back the claims that forecast the next ones reach: twice the time a claim
        that fits nothing published would wait (the debounce, a pass, a recut)."""
        debounce = min(p.spec.adaptive.pending_after_seconds for p in policies.values() if p.spec.adaptive)
        return AHEAD_FACTOR * (debounce + self.interval + RECUT_SECONDS)

    def _ahead(self, chosen: _Pass) -> AheadPlan:
        """Recuts ahead for claims like those that arrived within the lead time and were placed;
        the free devices claims of the cooldown before it would use are kept from idle too."""
        now = self.clock()
        self.arrivals = [(at, c) for at, c in self.arrivals if now - at <= max(chosen.lead, chosen.cooldown)]
        plan = chosen.plan
        busy = {r.gpu for r in plan.recuts} | {u for uuids in plan.placed.values() for u in uuids}
        left = {n: v - sum(1 for r in plan.recuts if r.policy == n) for n, v in chosen.left.items()}
        # Claims still unallocated are not a forecast: they wait out the debounce like any other.
        placed = [(at, c) for at, c in self.arrivals if c.key not in self.claims]
        expected = [c for at, c in placed if now - at <= chosen.lead]
        lately = [c for at, c in reversed(placed) if now - at > chosen.lead]  # newest first
        return plan_ahead(expected, chosen.gpus, self.classes, left, free=chosen.free, busy=busy, lately=lately,
                          reserved={r.node for r in chosen.reservations}, menus=self.menus)

    async def run_pass(self) -> RecutPlan | None:
        chosen = self._choose()
        if chosen is None:
            return None
        plan, gpus = chosen.plan, chosen.gpus
        self.last_plan = plan
        FRAGMENTATION.set(float(plan.fragmentation))
        now = self.clock()
        touched: set[str] = set()
        stamp = format_rfc3339(self.wall_clock())
        for recut in plan.recuts:
            self.choices[recut.gpu] = _Choice(recut.layout, recut.reason, now, stamp)
            self.controller.fleet.adaptive_choices[recut.gpu] = recut.layout
            touched.add(recut.node)
            RECUTS.labels("demand").inc()
            log.info("recutting an idle GPU for waiting claims", node=recut.node, gpu=recut.index,
                     layout=recut.layout, policy=recut.policy, claims=list(recut.claims))
            for claim in recut.claims:
                await self._tell(claim, "Normal", "AdaptiveRecut",
                                 f"GPU {recut.index} on {recut.node} is being recut to layout {recut.layout!r} "
                                 f"of SharingPolicy {recut.policy} for this claim")
        for never in plan.unsatisfiable:
            demand = self.claims.get(never.claim)
            uid = demand.uid if demand is not None else never.claim
            if uid not in self.warned:
                self.warned.add(uid)
                log.warning("no adaptive layout can satisfy a claim", claim=never.claim, why=never.message)
                await self._tell(never.claim, "Warning", "NoAdaptiveLayoutFits", never.message)
        ahead = self._ahead(chosen)
        for recut in ahead.recuts:
            self.choices[recut.gpu] = _Choice(recut.layout, recut.reason, now, stamp)
            self.controller.fleet.adaptive_choices[recut.gpu] = recut.layout
            touched.add(recut.node)
            RECUTS.labels("ahead").inc()
            log.info("recutting an idle GPU ahead of claims like recent ones", node=recut.node, gpu=recut.index,
                     layout=recut.layout, policy=recut.policy, like=list(recut.claims))
        touched |= await self._reserve(chosen)
        keep = ahead.keep | {r.gpu for r in ahead.recuts}
        for gpu in back_to_idle(gpus, plan, keep=keep):
            assert gpu.policy.spec.adaptive is not None
            idle = gpu.policy.spec.adaptive.idle
            self.choices[gpu.gpu.uuid] = _Choice(idle, "idle default", now, stamp)
            self.controller.fleet.adaptive_choices[gpu.gpu.uuid] = idle
            touched.add(gpu.node)
            RECUTS.labels("idle").inc()
            log.info("returning a free GPU to its idle layout", node=gpu.node, gpu=gpu.gpu.index, layout=idle)
        if touched:
            self.controller.enqueue(*sorted(touched))
        return plan

    async def _reserve(self, chosen: _Pass) -> set[str]:
        """Publish the reservations of this pass: the devices of a reserved node's Adaptive GPUs
        tainted (by GPU, so a recut's new devices are too) until its claim fits the free ones
        (then untainted, for the scheduler), and nothing reserved elsewhere. The nodes whose
        reservation changed, to reconcile."""
        fleet = self.controller.fleet
        wanted = {r.node: chosen.node_gpus.get(r.node, frozenset()) for r in chosen.reservations if not r.ready}
        changed = {n for n in set(wanted) | set(fleet.adaptive_reserved)
                   if wanted.get(n) != fleet.adaptive_reserved.get(n)}
        fleet.adaptive_reserved = wanted
        RESERVED.set(len(chosen.reservations))
        before = self.reserved
        self.reserved = {r.claim: r.node for r in chosen.reservations}
        for r in chosen.reservations:
            if before.get(r.claim) != r.node:
                log.info("keeping a node for a claim that needs several of its GPUs", node=r.node, claim=r.claim)
                await self._tell(r.claim, "Normal", "AdaptiveReserve",
                                 f"Node {r.node} is kept for this claim, which no single GPU can host: until "
                                 f"its free devices can hold it they carry the {RESERVED_TAINT_KEY} taint, so "
                                 "new claims go elsewhere")
        return changed

    async def _tell(self, claim: str, type_: str, reason: str, message: str) -> None:
        namespace, _, name = claim.partition("/")
        demand = self.claims.get(claim)
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": demand.uid if demand else ""}}
        try:
            await self.post_event(body, type_, reason, message)
        except Exception as exc:  # an Event is news, not state: never fail the pass for it
            log.warning("could not post an Event on a claim", claim=claim, reason=reason, error=repr(exc))

    # -- status ----------------------------------------------------------------------------

    def with_status(self, policy: SharingPolicy, status: SharingPolicyStatus) -> SharingPolicyStatus:
        """``status`` with, for an Adaptive policy, each GPU's layout now and why."""
        adaptive = policy.spec.adaptive
        if adaptive is None:
            return status
        rows: list[AdaptiveGpuLayout] = []
        now = self.clock()
        for node, decision in sorted(self.controller.decisions.items()):
            view = self.controller.fleet.nodes.get(node)
            specs = view.layout.spec if view is not None and view.layout is not None else None
            for plan in decision.plan.for_node(node):
                if plan.policy != policy.name:
                    continue
                # A status pass may come before this process's first demand pass (it has just
                # started): the choice is then what the status recorded, as that pass would take it.
                spec = specs.for_gpu(plan.gpu.uuid) if specs is not None else None
                _, choice = self._choice(policy, spec, plan.gpu.uuid, now)
                rows.append(AdaptiveGpuLayout(node=node, gpu=plan.gpu.uuid, index=plan.gpu.index, layout=choice.layout,
                                              reason=choice.reason[:256], since=choice.chosen_at))
        recut = sum(1 for r in rows if r.layout != adaptive.idle)
        return status.model_copy(update={"adaptive": rows[:100], "gpus_recut": recut})
