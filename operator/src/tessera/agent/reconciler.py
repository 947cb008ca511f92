"""The reconciler: what one GPU should become (``GpuLayout``) against what it is (``GpuInfo``).

``plan_gpu`` is pure: it returns the minimal, ordered operations that move the GPU toward its
desired layout, and the blockers that stop the rest, each with a reason and a message a person
can act on. Planning always starts from what the hardware says now, so a crash half-way is
healed by planning again; a converged GPU plans nothing (idempotent).

Rules it keeps:

- Never destroy an instance in use, never change MIG mode of a GPU in use, never stop an MPS
  daemon that clients use: report ``InstanceInUse`` / ``GpuInUse`` instead, and do every
  other step that is safe (a desired instance that does not overlap the busy one is created).
- Order: stop MPS daemons → destroy instances → set MIG mode → create instances → time slice
  → start MPS daemons. An instance's MPS daemon needs its ``MIG-…`` UUID, which exists only
  after creation, so ``apply_layout`` plans again after each round.
- MPS: a daemon per shared device, with the policy's default compute share and memory set as
  the daemon's defaults; a daemon the agent started that died is started again (``restart``).
- ``DynamicMIG``: MIG mode on; instances belong to the kubelet plugin (made at prepare
  time). Idle leftovers are destroyed, instances in use are kept.
- MIG mode pending (Ampere): the agent does not reset GPUs. It reports ``ResetRequired`` and
  waits; it never calls ``set_mig_mode`` again for a mode that is already pending.
- A GPU absent from the spec is left as it is; nobody asked for anything.

``apply_layout`` runs the plans through a ``DeviceBackend`` (blocking; call it in a thread).
Before each operation it asks an optional ``guard`` (the agent passes one that checks claim
allocations against the API, ``tessera.agent.claimguard``); a guard that answers with a
``Blocker`` stops that GPU's operations for the call, like a failure. ``devices_changed`` says
which published devices an operation destroys or reshapes, so a guard knows what to look for.
Not for: Kubernetes, status conditions (``tessera.agent.status``), or choosing layouts
(``tessera.planner``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from tessera.agent.backends.base import (
    BackendError,
    DeviceBackend,
    GpuInfo,
    InUseError,
    Inventory,
    MigInstanceInfo,
    MpsDefaults,
)
from tessera.models.devices import DeviceKind, DeviceRef, parse_device_name
from tessera.models.layout import GpuLayout, GpuStatus, Health, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import MpsSpec, ShareStrategy, Strategy, TimeSliceInterval
from tessera.models.quantity import parse_quantity

log = structlog.get_logger("tessera.agent")


class OpKind(StrEnum):
    STOP_MPS = "StopMps"
    DESTROY_INSTANCE = "DestroyInstance"
    SET_MIG_MODE = "SetMigMode"
    CREATE_INSTANCE = "CreateInstance"
    SET_TIME_SLICE = "SetTimeSlice"
    START_MPS = "StartMps"
    SET_MPS_DEFAULTS = "SetMpsDefaults"


@dataclass(frozen=True, slots=True)
class Operation:
    """One step on one GPU; ``describe()`` is what logs and events show."""

    kind: OpKind
    gpu_uuid: str
    gpu_index: int
    profile: str | None = None
    start: int | None = None
    gpu_instance_id: int | None = None
    enabled: bool | None = None
    interval: TimeSliceInterval | None = None
    device_uuid: str | None = None
    mps_defaults: MpsDefaults | None = None
    restart: bool = False  # START_MPS for a daemon the agent started that died

    def describe(self) -> str:
        where = f"GPU {self.gpu_index}"
        match self.kind:
            case OpKind.STOP_MPS:
                return f"{where}: stop the MPS daemon of {self.device_uuid}"
            case OpKind.DESTROY_INSTANCE:
                return f"{where}: destroy {self.profile} at slice {self.start} (GPU instance {self.gpu_instance_id})"
            case OpKind.SET_MIG_MODE:
                return f"{where}: turn MIG mode {'on' if self.enabled else 'off'}"
            case OpKind.CREATE_INSTANCE:
                return f"{where}: create {self.profile} at slice {self.start}"
            case OpKind.SET_TIME_SLICE:
                return f"{where}: set the time-slice interval to {self.interval}"
            case OpKind.START_MPS:
                if self.restart:
                    return f"{where}: restart the crashed MPS daemon of {self.device_uuid}{_defaults(self)}"
                return f"{where}: start an MPS daemon for {self.device_uuid}{_defaults(self)}"
            case OpKind.SET_MPS_DEFAULTS:
                return f"{where}: set the MPS defaults of {self.device_uuid}{_defaults(self)}"


def _defaults(op: Operation) -> str:
    d = op.mps_defaults
    if d is None:
        return ""
    parts = []
    if d.active_thread_percentage is not None:
        parts.append(f"{d.active_thread_percentage}% of SMs")
    if d.pinned_memory_mib is not None:
        parts.append(f"{d.pinned_memory_mib} MiB pinned")
    return f" (clients get {', '.join(parts)} by default)" if parts else ""


def mps_defaults(desired: GpuLayout, memory_mib: int) -> MpsDefaults:
    """What a client of this device that sets no limit gets: the policy's default compute share
    and memory, the memory capped at the device's."""
    spec = desired.mps or MpsSpec()
    memory = parse_quantity(spec.memory.default) // (1024 * 1024)
    return MpsDefaults(active_thread_percentage=spec.compute.default, pinned_memory_mib=min(memory, memory_mib))


class BlockReason(StrEnum):
    """Why a GPU is not (yet) as the spec says. ``WAITING`` ones clear by themselves."""

    INSTANCE_IN_USE = "InstanceInUse"
    GPU_IN_USE = "GpuInUse"
    RESET_REQUIRED = "ResetRequired"
    GPU_LOST = "GpuLost"
    MIG_NOT_SUPPORTED = "MigNotSupported"
    INVALID_LAYOUT = "InvalidLayout"
    OPERATION_FAILED = "OperationFailed"
    CLAIM_CHECK_FAILED = "ClaimCheckFailed"  # the claims could not be read: nothing is destroyed


WAITING = frozenset(
    {BlockReason.INSTANCE_IN_USE, BlockReason.GPU_IN_USE, BlockReason.RESET_REQUIRED, BlockReason.CLAIM_CHECK_FAILED}
)


@dataclass(frozen=True, slots=True)
class Blocker:
    reason: BlockReason
    message: str  # starts with "GPU <index>: "

    @property
    def waiting(self) -> bool:
        return self.reason in WAITING


@dataclass(frozen=True, slots=True)
class GpuChangePlan:
    """What the agent does to one GPU this pass: the operations toward its desired layout and
    what blocks the rest (not the operator's :class:`tessera.planner.GpuPlan`, which says
    which policy won the GPU and the layout it wants)."""

    gpu_uuid: str
    gpu_index: int
    operations: tuple[Operation, ...] = ()
    blockers: tuple[Blocker, ...] = ()

    @property
    def converged(self) -> bool:
        """Nothing to do and nothing in the way: the GPU is as the spec says."""
        return not self.operations and not self.blockers


def _place(i: MigInstanceInfo | PlacedInstance) -> str:
    return f"{i.profile} at slice {i.start}"


def _wants_mig(strategy: Strategy) -> bool:
    return strategy in (Strategy.MIG, Strategy.DYNAMIC_MIG)


def plan_gpu(desired: GpuLayout | None, gpu: GpuInfo) -> GpuChangePlan:
    """The operations that move ``gpu`` toward ``desired``, and what blocks the rest."""
    ops: list[Operation] = []
    blockers: list[Blocker] = []
    where = f"GPU {gpu.index}"

    def op(
        kind: OpKind,
        *,
        profile: str | None = None,
        start: int | None = None,
        gpu_instance_id: int | None = None,
        enabled: bool | None = None,
        interval: TimeSliceInterval | None = None,
        device_uuid: str | None = None,
        defaults: MpsDefaults | None = None,
        restart: bool = False,
    ) -> None:
        ops.append(
            Operation(
                kind, gpu.uuid, gpu.index, profile, start, gpu_instance_id, enabled, interval, device_uuid,
                defaults, restart,
            )
        )

    def block(reason: BlockReason, message: str) -> None:
        blockers.append(Blocker(reason, f"{where}: {message}"))

    if desired is None:
        return GpuChangePlan(gpu.uuid, gpu.index)
    if gpu.health is Health.LOST:
        block(BlockReason.GPU_LOST, gpu.health_message or "the GPU is lost; reset it or reboot the node")
        return GpuChangePlan(gpu.uuid, gpu.index, (), tuple(blockers))

    strategy = desired.strategy
    want_mig = _wants_mig(strategy)
    if want_mig and not gpu.mig_capable:
        block(
            BlockReason.MIG_NOT_SUPPORTED,
            f"{gpu.product_name} does not support MIG; strategy {strategy} cannot apply",
        )
        return GpuChangePlan(gpu.uuid, gpu.index, (), tuple(blockers))

    # -- which instances to keep, destroy, create --
    wanted: list[PlacedInstance] = list(desired.mig_instances) if strategy is Strategy.MIG else []
    invalid = _invalid_instances(wanted, gpu)
    if invalid:
        block(BlockReason.INVALID_LAYOUT, invalid)
        return GpuChangePlan(gpu.uuid, gpu.index, (), tuple(blockers))

    keep: list[MigInstanceInfo] = []
    destroy: list[MigInstanceInfo] = []
    remaining = list(wanted)
    for inst in gpu.instances:
        match = next((w for w in remaining if w.profile == inst.profile and w.start == inst.start), None)
        complete = inst.compute_instance_id is not None
        if strategy is Strategy.DYNAMIC_MIG and inst.in_use:
            keep.append(inst)  # the kubelet plugin made it for a claim
        elif match is not None and complete:
            remaining.remove(match)
            keep.append(inst)
        elif inst.in_use:
            keep.append(inst)
            wants = [w for w in wanted if inst.overlaps(w.start, _size(gpu, w))]
            instead = f"; the spec wants {', '.join(_place(w) for w in wants)}" if wants else (
                "; the spec does not want it" if want_mig else f"; the spec wants strategy {strategy}"
            )
            block(BlockReason.INSTANCE_IN_USE, f"{_place(inst)} is in use{instead}")
        else:
            destroy.append(inst)  # unwanted, or a GI left without its CI by a crash

    # -- MPS daemons that must stop (before their instance or the GPU's mode changes) --
    keep_uuids = {i.uuid for i in keep}
    reported = {i.gpu_instance_id for i in keep if i.in_use and i not in _matched(keep, desired, strategy)}
    mps_on_gpu = strategy is Strategy.MPS
    mps_on_instances = strategy is Strategy.MIG and desired.mig_sharing is ShareStrategy.MPS
    if gpu.mps_crashed and not mps_on_gpu:
        op(OpKind.STOP_MPS, device_uuid=gpu.uuid)  # forget a dead daemon nobody wants any more
    elif gpu.mps_running and not mps_on_gpu:
        if gpu.in_use:
            block(BlockReason.GPU_IN_USE, "the GPU's MPS daemon has clients; it stops when they finish")
        else:
            op(OpKind.STOP_MPS, device_uuid=gpu.uuid)
    for inst in gpu.instances:
        wanted_here = mps_on_instances and inst.uuid in keep_uuids
        if inst.mps_crashed and inst.uuid is not None and not wanted_here:
            op(OpKind.STOP_MPS, device_uuid=inst.uuid)
        elif inst.mps_running and inst.uuid is not None and not wanted_here:
            if not inst.in_use:
                op(OpKind.STOP_MPS, device_uuid=inst.uuid)
            elif inst.gpu_instance_id not in reported:
                block(
                    BlockReason.INSTANCE_IN_USE,
                    f"{_place(inst)} is in use; its MPS daemon stops when its clients finish",
                )

    for inst in destroy:
        op(OpKind.DESTROY_INSTANCE, profile=inst.profile, start=inst.start, gpu_instance_id=inst.gpu_instance_id)

    # -- MIG mode --
    mode_ok = gpu.mig_mode_current == want_mig
    if gpu.mig_capable and not mode_ok:
        if gpu.mig_mode_pending == want_mig:
            block(
                BlockReason.RESET_REQUIRED,
                f"MIG mode {'on' if want_mig else 'off'} is pending a GPU reset "
                f"(Ampere); drain the node and run nvidia-smi -r -i {gpu.index}, or reboot it",
            )
        elif any(k.in_use for k in keep):
            pass  # an instance in use keeps MIG on; reported above
        elif gpu.in_use:
            block(
                BlockReason.GPU_IN_USE,
                f"the GPU is in use; MIG mode turns {'on' if want_mig else 'off'} when it is idle",
            )
        else:
            op(OpKind.SET_MIG_MODE, enabled=want_mig)
    elif gpu.mig_capable and gpu.mig_mode_pending != gpu.mig_mode_current:
        op(OpKind.SET_MIG_MODE, enabled=want_mig)  # cancel a pending change nobody wants

    # -- instances to create (only once MIG mode is on; a pending mode waits) --
    if strategy is Strategy.MIG and mode_ok:
        for w in sorted(remaining, key=lambda w: (w.start, w.profile)):
            busy = next((k for k in keep if k.in_use and k.overlaps(w.start, _size(gpu, w))), None)
            if busy is not None:
                if not any(b.reason is BlockReason.INSTANCE_IN_USE for b in blockers):
                    block(BlockReason.INSTANCE_IN_USE, f"{_place(busy)} is in use; the spec wants {_place(w)}")
                continue
            op(OpKind.CREATE_INSTANCE, profile=w.profile, start=w.start)

    # -- time slicing --
    if strategy is Strategy.TIME_SLICING:
        interval = desired.time_slicing.interval if desired.time_slicing else TimeSliceInterval.DEFAULT
        if gpu.time_slice != interval and mode_ok:
            op(OpKind.SET_TIME_SLICE, interval=interval)
    elif gpu.time_slice not in (None, TimeSliceInterval.DEFAULT) and not want_mig:
        op(OpKind.SET_TIME_SLICE, interval=TimeSliceInterval.DEFAULT)

    # -- MPS daemons to start --
    if mps_on_gpu and mode_ok:
        wanted_defaults = mps_defaults(desired, gpu.memory_mib)
        if not gpu.mps_running:
            op(OpKind.START_MPS, device_uuid=gpu.uuid, defaults=wanted_defaults, restart=gpu.mps_crashed)
        elif gpu.mps_defaults != wanted_defaults:
            op(OpKind.SET_MPS_DEFAULTS, device_uuid=gpu.uuid, defaults=wanted_defaults)
    if mps_on_instances:
        for inst in keep:
            if inst.uuid is None or inst.compute_instance_id is None:
                continue
            wanted_defaults = mps_defaults(desired, inst.memory_mib)
            if not inst.mps_running:
                op(OpKind.START_MPS, device_uuid=inst.uuid, defaults=wanted_defaults, restart=inst.mps_crashed)
            elif inst.mps_defaults != wanted_defaults:
                op(OpKind.SET_MPS_DEFAULTS, device_uuid=inst.uuid, defaults=wanted_defaults)

    return GpuChangePlan(gpu.uuid, gpu.index, tuple(ops), tuple(blockers))


def _matched(keep: list[MigInstanceInfo], desired: GpuLayout, strategy: Strategy) -> list[MigInstanceInfo]:
    """The kept instances the spec asks for (the rest are kept only because they are in use)."""
    if strategy is Strategy.DYNAMIC_MIG:
        return keep
    if strategy is not Strategy.MIG:
        return []
    return [k for k in keep if any(w.profile == k.profile and w.start == k.start for w in desired.mig_instances)]


def _size(gpu: GpuInfo, w: PlacedInstance) -> int:
    p = gpu.profile(w.profile)
    return p.memory_slices if p is not None else 1


def _invalid_instances(wanted: list[PlacedInstance], gpu: GpuInfo) -> str:
    """Why the wanted instances cannot all exist on this GPU, or "" when they can."""
    problems: list[str] = []
    taken: list[tuple[int, int, PlacedInstance]] = []
    for w in wanted:
        p = gpu.profile(w.profile)
        if p is None:
            valid = ", ".join(x.name for x in gpu.profiles) or "none"
            problems.append(f"{gpu.product_name} has no MIG profile {w.profile} (valid: {valid})")
            continue
        if w.start not in p.starts:
            problems.append(f"{w.profile} cannot start at slice {w.start} (valid: {', '.join(map(str, p.starts))})")
            continue
        for s, size, other in taken:
            if s < w.start + p.memory_slices and w.start < s + size:
                problems.append(f"{_place(w)} overlaps {_place(other)}")
        taken.append((w.start, p.memory_slices, w))
    for p in gpu.profiles:
        n = sum(1 for w in wanted if w.profile == p.name)
        if n > p.max_count:
            problems.append(f"{n} x {p.name} asked, at most {p.max_count} fit")
    return "; ".join(problems)


def plan_node(spec: NodeLayoutSpec, inventory: Inventory) -> list[GpuChangePlan]:
    """One plan per GPU of the node, in index order."""
    return [plan_gpu(spec.for_gpu(g.uuid), g) for g in sorted(inventory.gpus, key=lambda g: g.index)]


# --- which published devices an operation changes ----------------------------------------------


@dataclass(frozen=True, slots=True)
class ChangedDevices:
    """Published devices (names as ``tessera.models.devices`` builds them) that an operation
    destroys or reshapes: ``names``, or with ``whole_gpu`` every device of GPU ``gpu_index``."""

    gpu_index: int
    names: frozenset[str] = frozenset()
    whole_gpu: bool = False

    def covers(self, device_name: str) -> bool:
        if device_name in self.names:
            return True
        if not self.whole_gpu:
            return False
        try:
            return parse_device_name(device_name).gpu_index == self.gpu_index
        except ValueError:
            return False  # not a Tessera name: not one of ours

    def describe(self) -> str:
        return f"any device of GPU {self.gpu_index}" if self.whole_gpu else ", ".join(sorted(self.names))


def _instance_devices(gpu: GpuInfo, profile: str, start: int) -> ChangedDevices:
    """A MIG instance is published as a static (``mig``) or DynamicMIG (``dyn``) device."""
    try:
        names = {DeviceRef(kind, gpu.index, profile, start).name for kind in (DeviceKind.MIG, DeviceKind.DYNAMIC_MIG)}
    except ValueError:  # a profile the names cannot spell (unknown to the driver table): be safe
        return ChangedDevices(gpu.index, whole_gpu=True)
    return ChangedDevices(gpu.index, frozenset(names))


def _device(gpu: GpuInfo, device_uuid: str | None) -> ChangedDevices:
    if device_uuid == gpu.uuid:
        return ChangedDevices(gpu.index, frozenset({DeviceRef(DeviceKind.GPU, gpu.index).name}))
    inst = next((i for i in gpu.instances if i.uuid == device_uuid), None)
    if inst is None:
        return ChangedDevices(gpu.index, whole_gpu=True)
    return _instance_devices(gpu, inst.profile, inst.start)


def devices_changed(
    op: Operation, gpu: GpuInfo, desired: GpuLayout | None, published: GpuStatus | None
) -> ChangedDevices | None:
    """The published devices ``op`` destroys or changes the sharing of; None when it changes
    none (it only creates, or it restores what is published already).

    ``published`` is the GPU as the agent last reported it (what the slices show). Starting an
    MPS daemon for a device already published as MPS-shared (one that died, or vanished with a
    reboot) changes nothing a claim holds; neither does a new interval for a GPU that is
    time-sliced already and stays so. Everything else that is not a create does."""
    match op.kind:
        case OpKind.CREATE_INSTANCE | OpKind.SET_MPS_DEFAULTS:
            return None  # new defaults reach new clients only; nothing published changes
        case OpKind.DESTROY_INSTANCE:
            return _instance_devices(gpu, op.profile or "", op.start if op.start is not None else -1)
        case OpKind.SET_MIG_MODE:
            return ChangedDevices(gpu.index, whole_gpu=True)
        case OpKind.STOP_MPS:
            return _device(gpu, op.device_uuid)
        case OpKind.START_MPS:
            if published is not None and _published_with_mps(published, op.device_uuid):
                return None
            return _device(gpu, op.device_uuid)
        case OpKind.SET_TIME_SLICE:
            staying = desired is not None and desired.strategy is Strategy.TIME_SLICING
            if staying and published is not None and published.strategy is Strategy.TIME_SLICING:
                return None
            return _device(gpu, gpu.uuid)


def _published_with_mps(published: GpuStatus, device_uuid: str | None) -> bool:
    if device_uuid == published.uuid:
        return published.strategy is Strategy.MPS
    return published.mig_sharing is ShareStrategy.MPS and any(i.uuid == device_uuid for i in published.mig_instances)


# An operation about to run on a GPU -> a Blocker to refuse it, or None to let it run.
Guard = Callable[[Operation, GpuInfo], Blocker | None]


# --- running plans through a backend -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperationFailure:
    operation: Operation
    error: BackendError


@dataclass
class ApplyResult:
    """What ``apply_layout`` did and what is left: the last inventory and plans tell the status."""

    inventory: Inventory
    plans: list[GpuChangePlan]
    executed: list[Operation] = field(default_factory=list)
    failures: list[OperationFailure] = field(default_factory=list)
    refusals: list[tuple[Operation, Blocker]] = field(default_factory=list)  # what the guard stopped
    rounds: int = 0

    def plan(self, gpu_uuid: str) -> GpuChangePlan | None:
        return next((p for p in self.plans if p.gpu_uuid == gpu_uuid), None)

    def failures_of(self, gpu_uuid: str) -> list[OperationFailure]:
        return [f for f in self.failures if f.operation.gpu_uuid == gpu_uuid]

    def refusals_of(self, gpu_uuid: str) -> list[Blocker]:
        return [b for op, b in self.refusals if op.gpu_uuid == gpu_uuid]


def execute(backend: DeviceBackend, op: Operation) -> None:
    """Run one operation. Raises BackendError."""
    match op.kind:
        case OpKind.STOP_MPS:
            assert op.device_uuid is not None
            backend.stop_mps(op.device_uuid)
        case OpKind.DESTROY_INSTANCE:
            assert op.gpu_instance_id is not None
            backend.destroy_instance(op.gpu_uuid, op.gpu_instance_id)
        case OpKind.SET_MIG_MODE:
            assert op.enabled is not None
            backend.set_mig_mode(op.gpu_uuid, op.enabled)
        case OpKind.CREATE_INSTANCE:
            assert op.profile is not None
            assert op.start is not None
            backend.create_instance(op.gpu_uuid, op.profile, op.start)
        case OpKind.SET_TIME_SLICE:
            assert op.interval is not None
            backend.set_time_slice(op.gpu_uuid, op.interval)
        case OpKind.START_MPS | OpKind.SET_MPS_DEFAULTS:
            assert op.device_uuid is not None
            backend.start_mps(op.device_uuid, op.mps_defaults)


def apply_layout(
    backend: DeviceBackend, spec: NodeLayoutSpec, max_rounds: int = 4, guard: Guard | None = None
) -> ApplyResult:
    """Plan from the hardware, run the operations, plan again, until nothing is left to do,
    only blockers remain, or ``max_rounds`` passed. A failed operation stops the rest of its
    GPU's operations for this call (they depend on order); other GPUs go on. A GPU whose
    operation failed is not retried within the call: the next resync tries again.

    ``guard`` is asked right before each operation runs (not when it was planned), with the
    GPU as the last inventory saw it; a refusal stops that GPU like a failure does."""
    inventory = backend.inventory()
    plans = plan_node(spec, inventory)
    result = ApplyResult(inventory, plans)
    failed: set[str] = set()
    for round_no in range(1, max_rounds + 1):
        todo = [p for p in plans if p.operations and p.gpu_uuid not in failed]
        if not todo:
            break
        result.rounds = round_no
        gpus = {g.uuid: g for g in inventory.gpus}
        for plan in todo:
            for op in plan.operations:
                refusal = guard(op, gpus[plan.gpu_uuid]) if guard is not None else None
                if refusal is not None:
                    log.warning("operation refused", operation=op.describe(), reason=refusal.reason.value,
                                why=refusal.message)
                    result.refusals.append((op, refusal))
                    failed.add(plan.gpu_uuid)
                    break
                try:
                    execute(backend, op)
                except BackendError as e:
                    log.warning("operation failed", operation=op.describe(), reason=e.reason, error=str(e))
                    result.failures.append(OperationFailure(op, e))
                    failed.add(plan.gpu_uuid)
                    break
                log.info("operation done", operation=op.describe())
                result.executed.append(op)
        inventory = backend.inventory()
        plans = plan_node(spec, inventory)
    result.inventory = inventory
    result.plans = [_with_failures(p, result) for p in plans]
    return result


def _with_failures(plan: GpuChangePlan, result: ApplyResult) -> GpuChangePlan:
    failures = result.failures_of(plan.gpu_uuid)
    refusals = result.refusals_of(plan.gpu_uuid)
    if not (failures or refusals) or not plan.operations:
        return plan
    extra = list(refusals)
    for f in failures:
        reason = BlockReason.INSTANCE_IN_USE if isinstance(f.error, InUseError) else BlockReason.OPERATION_FAILED
        step = f.operation.describe().split(": ", 1)[1]
        extra.append(Blocker(reason, f"GPU {plan.gpu_index}: {step} failed: {f.error}"))
    return GpuChangePlan(plan.gpu_uuid, plan.gpu_index, plan.operations, (*plan.blockers, *extra))
