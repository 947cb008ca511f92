"""What the operator wants for one node: the NodeLayout.spec to write, the GPUs that must
drain first, and the Pods to evict when a drain in ``Evict`` mode times out.

Pure: the fleet view and a clock in, a :class:`NodeDecision` out. Allocated devices count
as in use for the planner, so a new layout keeps allocated MIG instances where it can.

The handover: a GPU whose new layout changes or removes a published device keeps its old
layout in the spec and *hands over* first (a :class:`DrainState`): its changing devices are
tainted. The new layout is written only once the runtime says those devices were published
tainted and then checked against claims read after that write (``cleared``), and no claim
holds them in either view (the watch's or that fresh read's). Until then a GPU whose devices
a claim holds drains. Not for: I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from tessera.controller.state import ClaimHold, DrainState, Fleet, NodeView
from tessera.dra.devices import GpuDevices, build_gpu_devices, with_drain_taints
from tessera.models.devices import DeviceKind, DeviceRef, mig_device_name, parse_device_name
from tessera.models.layout import ClaimCheck, GpuLayout, GpuStatus, NodeLayoutSpec, NodeLayoutStatus
from tessera.models.policy import DrainMode, DrainSpec, Strategy
from tessera.planner.fleet import FleetPlan, GpuPlan, NodeInventory, plan_fleet
from tessera.planner.gpu import PlanErrorReason


@dataclass(frozen=True)
class GpuDecision:
    uuid: str
    index: int
    policy: str | None
    target: GpuLayout | None  # the layout the policy wants (None: it cannot be planned)
    written: GpuLayout | None  # what NodeLayout.spec holds for the GPU after this decision
    error: str | None = None
    drain: DrainState | None = None
    # Published devices the written layout changes or removes but the agent has not yet: tainted
    # too, so no new claim lands on a device about to go (the window between spec and status).
    changing: frozenset[str] = frozenset()

    @property
    def settled(self) -> bool:
        """The spec holds the wanted layout (no error, no drain pending)."""
        return self.error is None and self.drain is None and self.target is not None and self.written == self.target


@dataclass(frozen=True)
class MissingDevice:
    """A claim allocated a device of this node that its agent no longer reports: whatever
    removed it, the claim's Pods cannot use it, and a person must hear of it."""

    node: str
    device: str
    claim: ClaimHold
    gpu_index: int | None  # the GPU the device name points at (None: not a Tessera name)
    policy: str | None  # the policy that governs that GPU now

    def describe(self) -> str:
        pods = ", ".join(f"{ns}/{name}" for ns, name in self.claim.pods) or "no Pod yet"
        return (
            f"ResourceClaim {self.claim.key} is allocated {self.device} on {self.node}, which no longer exists "
            f"(reserved for {pods}). Pods managed by a controller (Deployment, Job, StatefulSet): delete them and "
            "their controller makes new ones with new claims on devices that exist; otherwise delete and "
            "recreate the claim"
        )


@dataclass(frozen=True)
class NodeDecision:
    node: str
    spec: NodeLayoutSpec
    gpus: tuple[GpuDecision, ...]
    plan: FleetPlan
    evict: tuple[tuple[str, str], ...] = ()
    missing: tuple[MissingDevice, ...] = ()
    # What each GPU of the agent's status publishes, built once (untainted by drains), in the
    # status's order; :meth:`devices_to_publish` lays this decision's drain taints on top. The
    # operator drops them once published (they are large); their counts stay, for the status.
    devices: tuple[GpuDevices, ...] = ()
    device_counts: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> devices
    # GPUs (UUIDs) whose devices are published with the reservation taint
    # (``Fleet.adaptive_reserved``): not a drain, the handover never counts them.
    reserved: frozenset[str] = frozenset()
    # Set by the operator once the decision is carried out: the policies' epoch it was made
    # in, the NodeLayout generation its spec landed in, and the agent status its slices were
    # published from. A policy is Ready only on what has been published for its latest spec.
    epoch: int = 0
    spec_generation: int | None = None
    published: NodeLayoutStatus | None = None

    @property
    def drains(self) -> dict[str, DrainState]:
        return {g.uuid: g.drain for g in self.gpus if g.drain is not None}

    @property
    def draining_devices(self) -> frozenset[str]:
        """Devices to taint: those a drain waits for, and those a written layout is replacing."""
        draining = {d for g in self.gpus if g.drain is not None for d in g.drain.devices}
        return frozenset(draining.union(*(g.changing for g in self.gpus)))

    def devices_of(self, gpu_uuid: str) -> int:
        """How many devices the GPU publishes (drain taints change none)."""
        return self.device_counts.get(gpu_uuid, 0)

    def devices_to_publish(self) -> list[GpuDevices]:
        """Every GPU's devices, those in :attr:`draining_devices` and :attr:`reserved` tainted."""
        draining = self.draining_devices
        return [with_drain_taints(gpu, draining, self.reserved) for gpu in self.devices]


def published_device_names(gpu: GpuStatus) -> frozenset[str]:
    """The devices Tessera publishes for ``gpu`` as it is now."""
    return device_names(build_gpu_devices(gpu))


def device_names(gpu: GpuDevices) -> frozenset[str]:
    return frozenset(str(d["name"]) for d in gpu.devices)


def _sharing(layout: GpuLayout | GpuStatus) -> tuple[object, ...]:
    return (layout.strategy, layout.mig_sharing, layout.time_slicing, layout.mps)


def affected_devices(gpu: GpuStatus, published: frozenset[str], target: GpuLayout) -> frozenset[str]:
    """Published devices of ``gpu`` that ``target`` changes or removes.

    A change of strategy or of how devices are shared changes every device; within static
    MIG only the instances the new layout drops; otherwise nothing."""
    if _sharing(gpu) != _sharing(target):
        return published
    if target.strategy is Strategy.MIG:
        kept = {mig_device_name(gpu.index, i.profile, i.start) for i in target.mig_instances}
        return (published - kept) or frozenset()  # nothing: the one empty frozenset, not one per GPU kept
    return frozenset()


def _with_allocations(gpu: GpuStatus, held: Collection[str]) -> GpuStatus:
    """``gpu`` with every allocated device marked in use, for the planner."""
    if not held:
        return gpu
    instances = [
        i.model_copy(update={"in_use": True})
        if DeviceRef(DeviceKind.DYNAMIC_MIG if i.dynamic else DeviceKind.MIG, gpu.index, i.profile, i.start).name
        in held
        else i
        for i in gpu.mig_instances
    ]
    whole = DeviceRef(DeviceKind.GPU, gpu.index).name in held
    return gpu.model_copy(update={"mig_instances": instances, "in_use": gpu.in_use or whole})


def decide_node(
    fleet: Fleet,
    node: str,
    now: float,
    previous_drains: Mapping[str, DrainState] | None = None,
    cleared: Mapping[str, frozenset[str]] | None = None,
    fresh_claims: Collection[ClaimHold] = (),
) -> NodeDecision | None:
    """The decision for ``node``, or None when it has no NodeLayout (no agent) yet.

    ``cleared``: GPU UUID → devices the runtime published tainted and then checked with
    ``fresh_claims`` (every claim as read after that write). A GPU's new layout is written only
    when every device it changes is among them and no claim holds one."""
    view = fleet.nodes.get(node)
    if view is None or view.layout is None:
        return None
    status = view.layout.status
    gpus = list(status.gpus) if status is not None else []
    holders = fleet.holders(node, fresh_claims)
    built = tuple(build_gpu_devices(g) for g in gpus)  # once per decision: it is not cheap
    published = {b.gpu_uuid: device_names(b) for b in built}
    planned = [_with_allocations(g, [d for d in published[g.uuid] if d in holders]) for g in gpus]
    current = view.layout.spec
    choices = {g.uuid: g.menu_layout for g in current.gpus if g.menu_layout} | fleet.adaptive_choices
    plan = plan_fleet(list(fleet.policies.values()), [NodeInventory(node, view.labels, planned)], choices,
                      fleet.plan_memo)
    drains = dict(previous_drains or {})
    decisions: list[GpuDecision] = []
    kept_plans: list[GpuPlan] = []
    evict: set[tuple[str, str]] = set()
    for gpu_plan, gpu in zip(plan.for_node(node), sorted(gpus, key=lambda g: (g.index, g.uuid)), strict=True):
        written = current.for_gpu(gpu.uuid)
        decision = _decide_gpu(
            fleet,
            view,
            gpu_plan,
            gpu,
            published[gpu.uuid],
            written,
            holders,
            drains,
            (cleared or {}).get(gpu.uuid, frozenset()),
            now,
        )
        decisions.append(decision)
        if decision.target is written and gpu_plan.layout is not None and gpu_plan.layout is not written:
            # The target equals the spec (_decide_gpu keeps the spec's copy): the plan keeps it
            # too, and the planner's equal copy goes. A decision is kept per node; at 5,000
            # nodes those copies were ~29 MiB (bench_operator_memory).
            gpu_plan = replace(gpu_plan, layout=written)
        kept_plans.append(gpu_plan)
        drain = decision.drain
        if drain is not None and drain.timed_out and _drain_spec(fleet, decision).mode is DrainMode.EVICT:
            for claim in drain.claims:
                hold = fleet.claims.get(claim)
                evict.update(hold.pods if hold else ())
    plan = replace(plan, gpus=tuple(kept_plans))
    spec = NodeLayoutSpec(gpus=sorted((d.written for d in decisions if d.written is not None), key=lambda g: g.uuid),
                          claim_check=ClaimCheck.OPERATOR)
    missing = _missing_devices(node, status, published, holders, decisions)
    counts = {b.gpu_uuid: len(b.devices) for b in built}
    return NodeDecision(
        node, spec, tuple(decisions), plan, tuple(sorted(evict)), missing, devices=built, device_counts=counts,
        reserved=fleet.adaptive_reserved.get(node, frozenset()),
    )


def _missing_devices(
    node: str,
    status: NodeLayoutStatus | None,
    published: Mapping[str, frozenset[str]],
    holders: Mapping[str, list[ClaimHold]],
    decisions: Collection[GpuDecision],
) -> tuple[MissingDevice, ...]:
    """Allocated devices of ``node`` that its agent's status does not have (nothing can be
    said before the agent has reported)."""
    if status is None:
        return ()
    exists = frozenset().union(*published.values())
    policy_of = {d.index: d.policy for d in decisions}
    out = []
    for device, holds in sorted(holders.items()):
        if device in exists:
            continue
        try:
            index: int | None = parse_device_name(device).gpu_index
        except ValueError:
            index = None
        for hold in sorted(holds, key=lambda h: h.key):
            out.append(MissingDevice(node, device, hold, index, policy_of.get(index) if index is not None else None))
    return tuple(out)


def _drain_spec(fleet: Fleet, decision: GpuDecision) -> DrainSpec:
    policy = fleet.policies.get(decision.policy or "")
    return policy.spec.drain if policy is not None else DrainSpec()


def _decide_gpu(
    fleet: Fleet,
    view: NodeView,
    gpu_plan: GpuPlan,
    gpu: GpuStatus,
    published: frozenset[str],
    current: GpuLayout | None,
    holders: Mapping[str, list[ClaimHold]],
    drains: Mapping[str, DrainState],
    cleared: frozenset[str],
    now: float,
) -> GpuDecision:
    target = gpu_plan.layout
    error = None
    if gpu_plan.policy is None and gpu_plan.error is None:
        # Unmanaged: no policy selects the GPU, so it stays exactly as it is. A layout a
        # deleted policy left in the spec stays too (without its policy): nothing is undone.
        kept = current if current is None or current.policy is None else current.model_copy(update={"policy": None})
        return GpuDecision(gpu.uuid, gpu.index, None, kept, kept)
    if target is None and gpu_plan.error is not None:
        if gpu_plan.error.reason is PlanErrorReason.BLOCKED and gpu_plan.error.when_idle is not None:
            target = gpu_plan.error.when_idle  # wanted once the devices in the way are free
        else:
            error = str(gpu_plan.error)
    base = GpuDecision(gpu.uuid, gpu.index, gpu_plan.policy, target, current, error)
    if target is None:
        return base
    changed = affected_devices(gpu, published, target)
    if target == current:
        return replace(base, target=current, changing=changed)  # the spec's own copy (see decide_node)
    held_by = sorted({h.key for d in changed for h in holders.get(d, [])})
    if not held_by and changed <= cleared:  # nothing published changes, or it was handed over
        return GpuDecision(gpu.uuid, gpu.index, gpu_plan.policy, target, target, error, changing=changed)
    previous = drains.get(gpu.uuid)
    since = previous.since if previous is not None and previous.target == target else now
    policy = fleet.policies.get(gpu_plan.policy or "")
    timeout = (policy.spec.drain if policy is not None else DrainSpec()).timeout_seconds
    drain = DrainState(
        node=view.name,
        gpu_uuid=gpu.uuid,
        gpu_index=gpu.index,
        policy=gpu_plan.policy,
        target=target,
        devices=changed,
        claims=tuple(held_by),
        since=since,
        timed_out=bool(held_by) and now - since >= timeout,
    )
    return GpuDecision(gpu.uuid, gpu.index, gpu_plan.policy, target, current, error, drain)
