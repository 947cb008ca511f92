"""NodeLayout.status from what the hardware says and what the reconciler could not do.

Pure: inventory + spec + plans in, ``NodeLayoutStatus`` out. The status describes what really
exists (the operator publishes ResourceSlices from it), so a GPU's ``strategy`` is the one in
force on the hardware, which is the desired one only once it is applied.

Conditions, each with an honest reason and a message naming GPUs:

- ``Ready``: True (``Applied``) when every GPU in the spec matches it and every GPU is healthy;
  otherwise False with the most important reason (``GpuLost``, ``DriverUnavailable``,
  ``InvalidLayout``, ``OperationFailed``, ``MigNotSupported``, ``ResetRequired``,
  ``InstanceInUse``, ``GpuInUse``, ``ClaimCheckFailed``, ``GpuUnhealthy``, ``Applying``).
- ``Progressing``: True while the agent is moving GPUs or waiting for something that clears
  by itself (an instance in use, a pending reset); False (``Applied`` or ``Blocked``) otherwise.
- ``Degraded``: True when something needs a person: a lost or unhealthy GPU, no driver, a
  layout that cannot exist, an operation that failed; False (``AsExpected``) otherwise.

Not for: talking to Kubernetes or to GPUs.
"""

from __future__ import annotations

from tessera.agent.backends.base import GpuInfo, Inventory
from tessera.agent.reconciler import BlockReason, GpuChangePlan
from tessera.models.catalog import model_for_product
from tessera.models.conditions import Condition, set_condition
from tessera.models.layout import (
    GpuLayout,
    GpuStatus,
    Health,
    MigInstanceStatus,
    NodeLayoutSpec,
    NodeLayoutStatus,
)
from tessera.models.policy import ShareStrategy, Strategy, TimeSliceInterval

# Most important first: the reason of a False Ready / True Degraded condition.
_PRIORITY = (
    "GpuLost",
    "DriverUnavailable",
    BlockReason.INVALID_LAYOUT.value,
    BlockReason.OPERATION_FAILED.value,
    BlockReason.MIG_NOT_SUPPORTED.value,
    "GpuUnhealthy",
    BlockReason.RESET_REQUIRED.value,
    BlockReason.INSTANCE_IN_USE.value,
    BlockReason.GPU_IN_USE.value,
    BlockReason.CLAIM_CHECK_FAILED.value,
    "Applying",
)
_NEEDS_A_PERSON = frozenset(
    {
        "GpuLost",
        "DriverUnavailable",
        "GpuUnhealthy",
        BlockReason.INVALID_LAYOUT.value,
        BlockReason.OPERATION_FAILED.value,
        BlockReason.MIG_NOT_SUPPORTED.value,
    }
)
_WAITING = frozenset(
    {
        BlockReason.RESET_REQUIRED.value,
        BlockReason.INSTANCE_IN_USE.value,
        BlockReason.GPU_IN_USE.value,
        BlockReason.CLAIM_CHECK_FAILED.value,
        "Applying",
    }
)


def _observed_strategy(gpu: GpuInfo, desired: GpuLayout | None) -> Strategy:
    """The strategy the hardware is in now."""
    want = desired.strategy if desired is not None else None
    if gpu.mig_mode_current:
        return Strategy.DYNAMIC_MIG if want is Strategy.DYNAMIC_MIG else Strategy.MIG
    if gpu.mps_running or gpu.mps_crashed:  # a dead daemon is restarted; what is published stays
        return Strategy.MPS
    if want is Strategy.TIME_SLICING:
        interval = desired.time_slicing.interval if desired and desired.time_slicing else TimeSliceInterval.DEFAULT
        if gpu.time_slice in (None, interval):
            return Strategy.TIME_SLICING
    return Strategy.EXCLUSIVE


def gpu_status(
    gpu: GpuInfo,
    desired: GpuLayout | None,
    plan: GpuChangePlan | None,
    driver_version: str = "",
    cuda_version: str = "",
) -> GpuStatus:
    """One GPU's status: inventory, the layout in force, and whether it matches the spec."""
    strategy = _observed_strategy(gpu, desired)
    same = desired is not None and desired.strategy is strategy
    applied = desired is None or (plan is not None and plan.converged)
    sharing: ShareStrategy | None = None
    if (
        same
        and desired is not None
        and desired.mig_sharing is not None
        and (
            desired.mig_sharing is ShareStrategy.TIME_SLICING
            or all(i.mps_running or i.mps_crashed for i in gpu.instances if i.uuid is not None)
        )
    ):
        sharing = desired.mig_sharing
    dynamic = strategy is Strategy.DYNAMIC_MIG
    instances = [
        MigInstanceStatus(
            profile=i.profile or f"profile-{i.profile_id}",
            start=i.start,
            size=i.size,
            uuid=i.uuid or "",
            gpu_instance_id=i.gpu_instance_id,
            compute_instance_id=i.compute_instance_id or 0,
            memory_mib=i.memory_mib,
            multiprocessors=i.multiprocessors,
            in_use=i.in_use,
            dynamic=dynamic,
        )
        for i in sorted(gpu.instances, key=lambda i: (i.start, i.gpu_instance_id))
        if i.uuid is not None  # a GI without its CI is not a usable device; the reconciler heals it
    ]
    message = "; ".join(b.message for b in plan.blockers) if plan is not None else ""
    reason = plan.blockers[0].reason.value if plan is not None and plan.blockers else ""
    if not applied and not message and plan is not None:
        message = "; ".join(op.describe() for op in plan.operations)
    if not applied and not reason:
        reason = "Applying"
    return GpuStatus(
        uuid=gpu.uuid,
        index=gpu.index,
        product_name=gpu.product_name,
        model=_model_key(gpu.product_name),
        memory_mib=gpu.memory_mib,
        multiprocessors=gpu.multiprocessors,
        cuda_compute_capability=gpu.cuda_compute_capability,
        architecture=gpu.architecture,
        driver_version=driver_version,
        cuda_version=cuda_version,
        pci_bus_id=gpu.pci_bus_id,
        pcie_root=gpu.pcie_root,
        numa_node=gpu.numa_node,
        mig_capable=gpu.mig_capable,
        mig_mode_current=gpu.mig_mode_current,
        mig_mode_pending=gpu.mig_mode_pending,
        strategy=strategy,
        policy=desired.policy if same and desired is not None else None,
        mig_instances=instances,
        mig_sharing=sharing,
        time_slicing=desired.time_slicing if same and desired is not None else None,
        mps=desired.mps if same and desired is not None else None,
        in_use=gpu.in_use,
        health=gpu.health,
        health_message=gpu.health_message,
        applied=applied,
        message=message[:4096],
        reason=reason,
    )


def _model_key(product_name: str) -> str | None:
    m = model_for_product(product_name)
    return m.key if m is not None else None


def _reasons(inventory: Inventory, plans: list[GpuChangePlan]) -> list[tuple[str, str]]:
    """(reason, message) for every problem on the node, most important first."""
    found: list[tuple[str, str]] = []
    if inventory.problem:
        found.append(("DriverUnavailable", inventory.problem))
    for g in inventory.gpus:
        if g.health is Health.LOST:
            found.append(("GpuLost", f"GPU {g.index}: {g.health_message or 'lost'}"))
        elif g.health is Health.UNHEALTHY:
            found.append(("GpuUnhealthy", f"GPU {g.index}: {g.health_message or 'unhealthy'}"))
    for p in plans:
        for b in p.blockers:
            if b.reason is BlockReason.GPU_LOST:
                continue  # reported from health above
            found.append((b.reason.value, b.message))
        if p.operations and not p.blockers:
            found.append(("Applying", "; ".join(op.describe() for op in p.operations)))
    found.sort(key=lambda rm: _PRIORITY.index(rm[0]) if rm[0] in _PRIORITY else len(_PRIORITY))
    return found


def build_status(
    inventory: Inventory,
    spec: NodeLayoutSpec,
    plans: list[GpuChangePlan],
    *,
    backend: str,
    agent_version: str,
    observed_generation: int | None,
    previous: NodeLayoutStatus | None = None,
    now: str | None = None,
) -> NodeLayoutStatus:
    """The whole status. Conditions keep their transition times unless their status changes."""
    by_uuid = {p.gpu_uuid: p for p in plans}
    gpus = [
        gpu_status(g, spec.for_gpu(g.uuid), by_uuid.get(g.uuid), inventory.driver_version, inventory.cuda_version)
        for g in sorted(inventory.gpus, key=lambda g: g.index)
    ]
    problems = _reasons(inventory, plans)
    known = {g.uuid for g in inventory.gpus}
    missing = [g.uuid for g in spec.gpus if g.uuid not in known]
    if missing:
        problems.insert(0, ("GpuNotFound", f"the spec names GPUs this node does not have: {', '.join(missing)}"))
    conditions: list[Condition] = list(previous.conditions) if previous is not None else []
    gen = observed_generation
    in_spec = [g for g in gpus if spec.for_gpu(g.uuid) is not None]
    if not problems:
        applied_msg = f"{len(in_spec)}/{len(in_spec)} GPUs in the spec applied; {len(gpus)} GPUs healthy"
        conditions = set_condition(conditions, "Ready", True, "Applied", applied_msg, gen, now)
        conditions = set_condition(conditions, "Progressing", False, "Applied", "nothing left to do", gen, now)
        conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", gen, now)
    else:
        reason, _ = problems[0]
        message = "; ".join(m for _, m in problems)[:32000]
        conditions = set_condition(conditions, "Ready", False, reason, message, gen, now)
        waiting = [(r, m) for r, m in problems if r in _WAITING]
        if waiting:
            conditions = set_condition(
                conditions, "Progressing", True, waiting[0][0], "; ".join(m for _, m in waiting), gen, now
            )
        else:
            conditions = set_condition(conditions, "Progressing", False, "Blocked", message, gen, now)
        bad = [(r, m) for r, m in problems if r in _NEEDS_A_PERSON or r == "GpuNotFound"]
        if bad:
            conditions = set_condition(conditions, "Degraded", True, bad[0][0], "; ".join(m for _, m in bad), gen, now)
        else:
            conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", gen, now)
    return NodeLayoutStatus(
        observed_generation=observed_generation,
        backend=backend,
        agent_version=agent_version,
        gpus=gpus,
        conditions=sorted(conditions, key=lambda c: c.type),
    )
