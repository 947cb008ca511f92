"""``tessera plan --live``: what applying policy files would do to the cluster as it is now.

It reads the cluster's Nodes (labels), NodeLayouts (what each agent reports exists, and the
layout the operator last asked for), SharingPolicies and ResourceClaim allocations, lets
the policies of the files replace the cluster's policies of the same name, and asks the
operator's own decision code (``tessera.controller.decide.decide_node``) what it would do.
Per GPU it shows today's layout (what exists), the new layout, the published devices the
change would drain and the claims (namespace/name) that hold them; then the GPUs several
policies select (conflicts); and, where an ``Adaptive`` policy governs GPUs, what the
operator's demand room would recut now for the claims whose Pods are Unschedulable (the
debounce aside), which claims wait, and which no menu could ever satisfy. Nothing is written.

``live_rows`` and ``render_live`` are pure (a ``Fleet`` in, rows and text out); ``read_fleet``
is the I/O. Not for: the offline preview from an inventory file (``tessera.cli.plan``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import API_GROUP, API_VERSION
from tessera.adaptive.choose import RecutPlan
from tessera.controller.decide import NodeDecision, decide_node
from tessera.controller.demand import PODS, AdaptiveDemand
from tessera.controller.state import Fleet
from tessera.kube.http import KubeClient
from tessera.kube.objects import CLAIMS, Api
from tessera.models.layout import GpuLayout, GpuStatus
from tessera.models.policy import SharingPolicy, Strategy
from tessera.planner.fleet import Conflict


@dataclass(frozen=True)
class LiveGpuRow:
    """One GPU: today, after the change, and what stands in the way."""

    node: str
    index: int
    model: str
    policy_today: str | None
    policy_new: str | None
    today: str
    new: str
    drains: tuple[str, ...]  # published devices the new layout changes or removes
    holders: tuple[tuple[str, str], ...]  # (device, namespace/name of a claim holding it)
    error: str | None = None

    @property
    def changes(self) -> bool:
        return self.today != self.new or self.policy_today != self.policy_new


@dataclass(frozen=True)
class LivePlan:
    rows: tuple[LiveGpuRow, ...]
    conflicts: tuple[Conflict, ...]
    unreadable: tuple[str, ...] = ()  # nodes whose NodeLayout could not be read


def describe_status(gpu: GpuStatus) -> str:
    """What exists on a GPU, as the agent reports it."""
    return _describe(gpu.strategy, [f"{i.profile}@{i.start}" for i in gpu.mig_instances], gpu)


def describe_layout(layout: GpuLayout) -> str:
    """A layout the operator would write."""
    return _describe(layout.strategy, [f"{i.profile}@{i.start}" for i in layout.mig_instances], layout)


def _new_text(gpu: GpuStatus, policy: str | None, target: GpuLayout | None, error: str | None) -> str:
    if policy is None and error is None:
        return describe_status(gpu)  # unmanaged: no policy selects it, it stays exactly as it is
    if target is None:
        return "(unchanged: it cannot be planned)"
    return describe_layout(target)


def _describe(strategy: Strategy, instances: list[str], layout: GpuLayout | GpuStatus) -> str:
    text = strategy.value
    if strategy is Strategy.MIG:
        text += " " + (" ".join(instances) or "(no instances)")
        if layout.mig_sharing is not None:
            text += f" shared by {layout.mig_sharing.value}"
    elif strategy is Strategy.DYNAMIC_MIG:
        text += " (instances made per claim)"
    elif strategy is Strategy.TIME_SLICING and layout.time_slicing is not None:
        text += f" x{layout.time_slicing.replicas}"
    return text


def with_policies(fleet: Fleet, policies: Sequence[SharingPolicy]) -> Fleet:
    """A copy of ``fleet`` in which ``policies`` replace those of the same name (or join)."""
    return Fleet(
        policies={**fleet.policies, **{p.name: p for p in policies}},
        policy_bodies=dict(fleet.policy_bodies),
        policy_errors={k: v for k, v in fleet.policy_errors.items() if k not in {p.name for p in policies}},
        nodes=fleet.nodes,
        layouts=fleet.layouts,
        claims=fleet.claims,
    )


def live_rows(fleet: Fleet, policies: Sequence[SharingPolicy]) -> LivePlan:
    """Per GPU of every node with a NodeLayout: today, and what ``policies`` would make of it."""
    changed = with_policies(fleet, policies)
    rows: list[LiveGpuRow] = []
    conflicts: list[Conflict] = []
    for view in fleet.gpu_nodes():
        decision = decide_node(changed, view.name, now=0.0)
        status = view.layout.status if view.layout is not None else None
        if decision is None or status is None:
            continue
        by_uuid = {g.uuid: g for g in status.gpus}
        today_spec = view.layout.spec if view.layout is not None else None
        holders = fleet.holders(view.name)
        conflicts += decision.plan.conflicts
        for gpu_decision in decision.gpus:
            gpu = by_uuid[gpu_decision.uuid]
            drain = gpu_decision.drain
            devices = tuple(sorted(drain.devices if drain is not None else gpu_decision.changing))
            held = tuple(sorted((d, h.key) for d in devices for h in holders.get(d, [])))
            before = today_spec.for_gpu(gpu.uuid) if today_spec is not None else None
            rows.append(LiveGpuRow(
                node=view.name,
                index=gpu.index,
                model=gpu.model or gpu.product_name,
                policy_today=before.policy if before is not None else gpu.policy,
                policy_new=gpu_decision.policy,
                today=describe_status(gpu),
                new=_new_text(gpu, gpu_decision.policy, gpu_decision.target, gpu_decision.error),
                drains=devices,
                holders=held,
                error=gpu_decision.error,
            ))
    unreadable = tuple(sorted(v.name for v in fleet.nodes.values() if v.layout_error is not None))
    return LivePlan(tuple(rows), tuple(conflicts), unreadable)


@dataclass
class _PreviewController:
    """The Controller as the demand room sees it, from decisions made for the preview."""

    fleet: Fleet
    decisions: dict[str, NodeDecision] = field(default_factory=dict)

    def enqueue(self, *nodes: str) -> None:
        """A preview reconciles nothing."""


async def _no_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A preview posts nothing."""


def adaptive_preview(
    fleet: Fleet, policies: Sequence[SharingPolicy], claims: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]
) -> RecutPlan | None:
    """What the operator's demand room would recut now with ``policies`` applied, taking every
    Unschedulable Pod's claim as pending (a preview does not wait out the debounce); None
    where no Adaptive policy applies."""
    changed = with_policies(fleet, policies)
    view = _PreviewController(changed)
    for node in changed.gpu_nodes():
        decision = decide_node(changed, node.name, now=0.0)
        if decision is not None:
            view.decisions[node.name] = decision
    clock = [0.0]
    demand = AdaptiveDemand(view, _no_event, clock=lambda: clock[0])
    for claim in claims:
        demand.claim_seen("ADDED", claim)
    for pod in pods:
        demand.pod_seen("ADDED", pod)
    clock[0] = 1e12  # long past any debounce
    chosen = demand.choose()
    return chosen[0] if chosen is not None else None


def render_adaptive(plan: RecutPlan | None) -> str:
    if plan is None:
        return ""
    lines = ["", "adaptive layouts (claims whose Pods are Unschedulable now):"]
    lines += [f"  recut {r.node} GPU {r.index} to {r.layout!r} ({r.policy}): {r.reason}" for r in plan.recuts]
    lines += [f"  keep {node} for {claim} (no single GPU can host it; new claims go elsewhere while it waits)"
              for node, claim in sorted(plan.kept.items())]
    if plan.waiting:
        lines.append(f"  waiting for a free GPU or the recut cap: {', '.join(plan.waiting)}")
    lines += [f"  never: {u.claim}: {u.message}" for u in plan.unsatisfiable]
    if len(lines) == 2:
        lines.append("  nothing waits: no recut")
    return "\n".join(lines)


def render_live(plan: LivePlan) -> str:
    """The plan as text: a block per GPU, then conflicts."""
    lines: list[str] = []
    for row in plan.rows:
        mark = "changes" if row.changes or row.drains else "no change"
        lines.append(f"{row.node} GPU {row.index} ({row.model}): {mark}")
        lines.append(f"  policy  {row.policy_today or '(none)'} -> {row.policy_new or '(none)'}")
        lines.append(f"  today   {row.today}")
        lines.append(f"  new     {row.new}")
        if row.error:
            lines.append(f"  error   {row.error}")
        if row.drains:
            held = {d for d, _ in row.holders}
            free = [d for d in row.drains if d not in held]
            lines.append(f"  drains  {len(row.drains)} device(s); {len(held)} held by a claim")
            for device, claim in row.holders:
                lines.append(f"    {device}  held by {claim}")
            if free:
                lines.append(f"    free: {' '.join(free)}")
    if not plan.rows:
        lines.append("no node reports GPUs (no NodeLayout has a status)")
    if plan.conflicts:
        lines.append("")
        lines.append(f"{len(plan.conflicts)} GPU(s) selected by more than one policy (priority, then name, decides):")
        lines.extend(f"  {c.node} {c.gpu}: {c.winner} wins over {', '.join(c.losers)}" for c in plan.conflicts)
    for node in plan.unreadable:
        lines.append(f"note: the NodeLayout of {node} could not be read; its last readable one is used")
    return "\n".join(lines)


async def read_demand(kubeconfig: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every ResourceClaim and Pod, for the adaptive preview."""
    async with KubeClient.from_environment(str(kubeconfig) if kubeconfig else None) as client:
        api = Api(client)
        claims, pods = await asyncio.gather(api.list_all(*CLAIMS), api.list_all(*PODS))
    return claims, pods


async def read_fleet(kubeconfig: Path | None) -> Fleet:
    """The cluster as the operator would see it: Nodes, NodeLayouts, policies, claims."""
    async with KubeClient.from_environment(str(kubeconfig) if kubeconfig else None) as client:
        api = Api(client)
        nodes, layouts, policies, claims = await asyncio.gather(
            api.list_nodes(),
            api.list_all(API_GROUP, API_VERSION, "nodelayouts"),
            api.list_all(API_GROUP, API_VERSION, "sharingpolicies"),
            api.list_all(*CLAIMS),
        )
    fleet = Fleet()
    for node in nodes:
        fleet.set_node(node)
    for layout in layouts:
        fleet.set_layout(layout)
    for policy in policies:
        fleet.set_policy(policy)
    for claim in claims:
        fleet.set_claim(claim)
    return fleet
