"""The whole fleet at once: which SharingPolicy each GPU gets, and the layout it gets.

:func:`plan_fleet` is the planner's entry point for the operator and ``tessera plan``:
policies and nodes (name, labels, GPUs as their agents report them) in, a :class:`FleetPlan`
out. A policy selects a GPU when its ``nodeSelector`` matches the node's labels and its
``gpuSelector`` (CEL) accepts the GPU; where several select one GPU the highest priority
wins, then the name that sorts first, and every loser is recorded as a conflict. A GPU no
policy selects is unmanaged: no policy, no layout, no error — it is left as it is. An ``Adaptive`` policy's GPU gets the
menu layout ``choices`` names for it (the operator's demand loop chooses), else the menu's
idle layout; the result records which (``GpuLayout.menu_layout``). Pure and deterministic: the same
input gives the same output, sorted by node and GPU index.
Not for: reading or writing Kubernetes objects (the operator does that with the result).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tessera.models.catalog import catalog_model
from tessera.models.layout import GpuLayout, GpuStatus
from tessera.models.policy import PolicyConflict, SharingPolicy, SharingPolicySpec, Strategy
from tessera.planner.gpu import PlanError, PlanErrorReason, plan_gpu_layout
from tessera.planner.selector import (
    CompiledGpuSelector,
    FlatDevice,
    GpuSelectorError,
    compile_gpu_selector,
    flat_device,
)


@dataclass(frozen=True)
class NodeInventory:
    """A node as the planner needs it: its name, its labels, and its GPUs (from NodeLayout.status)."""

    name: str
    labels: Mapping[str, str]
    gpus: Sequence[GpuStatus]


@dataclass(frozen=True)
class GpuPlan:
    """The verdict for one GPU: the winning policy (None: no policy selects it), and either
    the layout to write to NodeLayout.spec or the error that stops it. No policy, no layout
    and no error: the GPU is unmanaged (left exactly as it is)."""

    node: str
    gpu: GpuStatus
    policy: str | None
    layout: GpuLayout | None
    error: PlanError | None = None
    candidates: tuple[str, ...] = ()  # every policy that selects the GPU, winner first
    selector_errors: tuple[tuple[str, str], ...] = ()  # (policy, why) whose gpuSelector failed on it

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def unmanaged(self) -> bool:
        return self.policy is None and self.layout is None and self.error is None


@dataclass(frozen=True)
class Conflict:
    """A GPU that several policies select: ``winner`` applies, ``losers`` do not."""

    node: str
    gpu: str  # the GPU's UUID
    winner: str
    losers: tuple[str, ...]


@dataclass(frozen=True)
class FleetPlan:
    """What :func:`plan_fleet` decided, sorted by node name and GPU index."""

    gpus: tuple[GpuPlan, ...]
    conflicts: tuple[Conflict, ...]
    policy_errors: Mapping[str, str] = field(default_factory=dict)  # policy name -> why it selects nothing

    def for_node(self, node: str) -> tuple[GpuPlan, ...]:
        return tuple(p for p in self.gpus if p.node == node)

    def of_policy(self, policy: str) -> tuple[GpuPlan, ...]:
        """The GPUs ``policy`` won."""
        return tuple(p for p in self.gpus if p.policy == policy)

    def conflicts_of(self, policy: str) -> tuple[PolicyConflict, ...]:
        """The GPUs ``policy`` selects but loses, as its status reports them."""
        return tuple(
            PolicyConflict(node=c.node, gpu=c.gpu, winner=c.winner) for c in self.conflicts if policy in c.losers
        )


class PlanMemo:
    """GPU plans kept from one :func:`plan_fleet` call to the next: a plan depends on the
    policy's spec and the GPU's shape (model, MIG state, instances in use), not on which GPU
    it is, and a fleet has few shapes. The operator plans one node per decision, three or four
    decisions a node in a rollout: without it each planned every GPU again. A spec is known by
    its identity (specs are frozen, and replaced when a policy changes); each entry keeps its
    spec, so the identity cannot be reused while the entry lives. At ``limit`` entries it
    starts again empty: a fleet that has that many shapes at once is not one to memoise."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._plans: dict[tuple[object, ...], tuple[SharingPolicySpec, GpuLayout | PlanError]] = {}
        self._menus: dict[tuple[str, int, str], tuple[SharingPolicySpec, SharingPolicySpec]] = {}

    def plan(self, key: tuple[object, ...], spec: SharingPolicySpec) -> GpuLayout | PlanError | None:
        kept = self._plans.get(key)
        return kept[1] if kept is not None and kept[0] is spec else None

    def keep_plan(self, key: tuple[object, ...], spec: SharingPolicySpec, result: GpuLayout | PlanError) -> None:
        if len(self._plans) >= self.limit:
            self._plans.clear()
        self._plans[key] = (spec, result)

    def menu_spec(self, policy: SharingPolicy, name: str) -> SharingPolicySpec:
        """The static spec of ``policy``'s menu layout ``name``, one object per policy spec."""
        key = (policy.name, id(policy.spec), name)
        kept = self._menus.get(key)
        if kept is not None and kept[0] is policy.spec:
            return kept[1]
        if len(self._menus) >= self.limit:
            self._menus.clear()
        spec = policy.spec.for_layout(name)
        self._menus[key] = (policy.spec, spec)
        return spec


def _precedence(policy: SharingPolicy) -> tuple[int, str]:
    return (-policy.spec.priority, policy.name)


@dataclass
class _Compiled:
    policy: SharingPolicy
    selector: CompiledGpuSelector | None


def plan_fleet(
    policies: Sequence[SharingPolicy], nodes: Sequence[NodeInventory], choices: Mapping[str, str] | None = None,
    memo: PlanMemo | None = None,
) -> FleetPlan:
    """Match ``policies`` to the GPUs of ``nodes`` and plan every GPU.

    ``choices``: GPU UUID → the menu layout an ``Adaptive`` policy's GPU gets (a name not on
    the winning policy's menu falls back to its idle layout). ``memo``: plans kept from earlier
    calls (one for this call alone when None).

    Policies whose ``gpuSelector`` does not compile select nothing and appear in
    ``policy_errors``; one that fails on a GPU does not select it, and the GPU's plan carries
    the error only when no other policy selects it. Never raises for bad input."""
    policy_errors: dict[str, str] = {}
    compiled: list[_Compiled] = []
    for policy in sorted(policies, key=_precedence):
        selector = None
        if policy.spec.gpu_selector is not None:
            try:
                selector = compile_gpu_selector(policy.spec.gpu_selector.cel)
            except GpuSelectorError as exc:
                policy_errors[policy.name] = str(exc)
                continue
        compiled.append(_Compiled(policy, selector))
    memo = PlanMemo() if memo is None else memo
    plans: list[GpuPlan] = []
    conflicts: list[Conflict] = []
    by_labels: dict[tuple[tuple[str, str], ...], list[_Compiled]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        labels = tuple(sorted(node.labels.items()))
        on_node = by_labels.get(labels)
        if on_node is None:  # nodes of one pool share their labels: match each label set once
            on_node = [c for c in compiled if c.policy.spec.node_selector.matches(dict(labels))]
            by_labels[labels] = on_node
        for gpu in sorted(node.gpus, key=lambda g: (g.index, g.uuid)):
            selecting, failed = _selecting(on_node, gpu)
            if not selecting:
                if failed:
                    first, why = failed[0]
                    error = PlanError(PlanErrorReason.SELECTOR, f"policy {first}: {why}")
                    plans.append(GpuPlan(node.name, gpu, None, None, error, selector_errors=failed))
                    continue
                plans.append(GpuPlan(node.name, gpu, None, None))  # unmanaged
                continue
            winner = selecting[0]
            if len(selecting) > 1:
                conflicts.append(Conflict(node.name, gpu.uuid, winner.name, tuple(p.name for p in selecting[1:])))
            spec, menu_layout = _spec_for(memo, winner, (choices or {}).get(gpu.uuid))
            result = _plan(memo, winner.name, spec, gpu)
            if menu_layout is not None and not isinstance(result, PlanError):
                result = result.model_copy(update={"menu_layout": menu_layout})
            names = tuple(p.name for p in selecting)
            if isinstance(result, PlanError):
                plans.append(GpuPlan(node.name, gpu, winner.name, None, result, names, failed))
            else:
                plans.append(GpuPlan(node.name, gpu, winner.name, result, None, names, failed))
    return FleetPlan(tuple(plans), tuple(conflicts), policy_errors)


def _spec_for(memo: PlanMemo, policy: SharingPolicy, choice: str | None) -> tuple[SharingPolicySpec, str | None]:
    """The spec ``policy`` plans a GPU by, and the menu layout it is (None: not Adaptive)."""
    adaptive = policy.spec.adaptive
    if policy.spec.strategy is not Strategy.ADAPTIVE or adaptive is None:
        return policy.spec, None
    name = choice if choice is not None and any(lay.name == choice for lay in adaptive.layouts) else adaptive.idle
    return memo.menu_spec(policy, name), name


def _selecting(
    on_node: list[_Compiled], gpu: GpuStatus
) -> tuple[list[SharingPolicy], tuple[tuple[str, str], ...]]:
    """Policies (in precedence order) that select ``gpu``, and (policy, why) for every
    gpuSelector that failed on it (in precedence order too)."""
    flat: FlatDevice | None = None
    selecting: list[SharingPolicy] = []
    failed: list[tuple[str, str]] = []
    for c in on_node:
        if c.selector is None:
            selecting.append(c.policy)
            continue
        if flat is None:
            flat = flat_device(gpu)
        try:
            if c.selector.matches(gpu, flat):
                selecting.append(c.policy)
        except GpuSelectorError as exc:
            failed.append((c.policy.name, str(exc)))
    return selecting, tuple(failed)


def _plan(memo: PlanMemo, name: str | None, spec: SharingPolicySpec, gpu: GpuStatus) -> GpuLayout | PlanError:
    """plan_gpu_layout, memoised on everything about the GPU the plan depends on."""
    model = catalog_model(gpu.model, gpu.product_name)
    key = (
        name,
        id(spec),
        model.key if model is not None else None,
        gpu.product_name,
        gpu.mig_capable,
        gpu.mig_mode_current,
        gpu.in_use,
        tuple((i.profile, i.start, i.in_use, i.dynamic) for i in gpu.mig_instances),
    )
    cached = memo.plan(key, spec)
    if cached is None:
        try:
            cached = plan_gpu_layout(spec, gpu, policy=name)
        except PlanError as exc:
            cached = exc
        memo.keep_plan(key, spec, cached)
    if isinstance(cached, PlanError):
        return _for_gpu(cached, gpu)
    return cached.model_copy(update={"uuid": gpu.uuid})


def _for_gpu(error: PlanError, gpu: GpuStatus) -> PlanError:
    """A memoised error re-addressed to ``gpu``: its blocking instances and idle layout."""
    by_start = {i.start: i for i in gpu.mig_instances}
    when_idle = error.when_idle.model_copy(update={"uuid": gpu.uuid}) if error.when_idle is not None else None
    return PlanError(
        error.reason,
        error.message,
        blocking=[by_start.get(b.start, b) for b in error.blocking],
        when_idle=when_idle,
    )
