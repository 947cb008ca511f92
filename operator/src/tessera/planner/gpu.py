"""One policy on one GPU: :func:`plan_gpu_layout` turns a SharingPolicySpec and the GPU as
its agent reports it into the GpuLayout the operator writes to NodeLayout.spec.

Static MIG profiles are resolved against the GPU's catalog model (a preset becomes that
model's profiles), placed by ``tessera.planner.mig`` around the instances in use, and the
GPU's existing instances are kept wherever the new layout wants them. Anything that cannot
be done becomes a :class:`PlanError` naming what blocks it.
Not for: choosing which policy applies to a GPU (``tessera.planner.fleet``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from tessera.models.catalog import MODELS_BY_KEY, GpuModel, MigProfile, ProfileKind, catalog_model
from tessera.models.layout import GpuLayout, GpuStatus, MigInstanceStatus, PlacedInstance
from tessera.models.policy import MigPreset, SharingPolicySpec, Strategy
from tessera.planner.mig import Blocked, Impossible, Placement, place, request_of

PRESETS: dict[MigPreset, tuple[tuple[ProfileKind, int], ...]] = {
    MigPreset.ALL_1G: ((ProfileKind.ONE, 7),),
    MigPreset.ALL_BALANCED: ((ProfileKind.ONE, 2), (ProfileKind.TWO, 1), (ProfileKind.THREE, 1)),
    MigPreset.WHOLE: ((ProfileKind.SEVEN, 1),),
}

_MIG_STRATEGIES = (Strategy.MIG, Strategy.DYNAMIC_MIG)


class PlanErrorReason(StrEnum):
    """Why a GPU has no layout; a condition reason the operator can publish as it is."""

    NO_MIG = "MigUnsupported"  # the GPU cannot do MIG, or is not in the catalog
    UNKNOWN_PROFILE = "UnknownProfile"  # the policy names a profile this model lacks
    DOES_NOT_FIT = "DoesNotFit"  # the profiles fit no GPU of this model
    BLOCKED = "InUse"  # it would fit, but instances (or the GPU) in use stand in the way
    SELECTOR = "SelectorError"  # the policy's gpuSelector fails on this GPU


class PlanError(Exception):
    """A GPU that cannot get the layout its policy asks for, and why, in words.

    ``when_idle`` is the layout the GPU would get once nothing is in use (only for
    ``BLOCKED``), so the operator can drain the ``blocking`` instances and apply it."""

    def __init__(
        self,
        reason: PlanErrorReason,
        message: str,
        *,
        blocking: Sequence[MigInstanceStatus] = (),
        when_idle: GpuLayout | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.blocking = tuple(blocking)
        self.when_idle = when_idle


def requested_profiles(spec: SharingPolicySpec, model: GpuModel) -> list[MigProfile]:
    """The MIG profiles ``spec`` asks for on ``model``, one entry per instance.

    Raises :class:`PlanError` (``UNKNOWN_PROFILE``) when the model lacks a named profile."""
    if spec.mig is None:
        return []
    if spec.mig.preset is not None:
        return [model.profile_of_kind(kind) for kind, n in PRESETS[spec.mig.preset] for _ in range(n)]
    out: list[MigProfile] = []
    for name, count in sorted((spec.mig.profiles or {}).items()):
        try:
            profile = model.profile(name)
        except ValueError as exc:
            raise PlanError(PlanErrorReason.UNKNOWN_PROFILE, str(exc)) from None
        out.extend([profile] * count)
    return out


def _slices_text(kind_slices: int, start: int) -> str:
    end = start + kind_slices - 1
    return f"memory slice {start}" if end == start else f"memory slices {start}-{end}"


def _describe(instance: MigInstanceStatus) -> str:
    return f"{instance.profile} at slice {instance.start}"


def plan_gpu_layout(spec: SharingPolicySpec, gpu: GpuStatus, *, policy: str | None = None) -> GpuLayout:
    """The layout ``spec`` asks for on ``gpu``, or a :class:`PlanError` saying what blocks it.

    Keeps every MIG instance that is in use exactly where it is (an in-use instance counts
    towards the profiles asked for), keeps idle instances the new layout also wants, and is
    deterministic. Leaving or entering MIG mode needs an idle GPU: an in-use GPU or
    instance blocks it. ``policy`` is the policy's name, recorded in the layout."""
    sharing = spec.mig.sharing.strategy if spec.mig is not None and spec.mig.sharing is not None else None
    base = GpuLayout(
        uuid=gpu.uuid,
        policy=policy,
        strategy=spec.strategy,
        mig_sharing=sharing if spec.strategy is Strategy.MIG else None,
        time_slicing=spec.effective_time_slicing(),
        mps=spec.effective_mps(),
    )
    in_use = [i for i in gpu.mig_instances if i.in_use]
    if spec.strategy not in _MIG_STRATEGIES:
        busy = in_use if gpu.mig_mode_current else []
        if busy:
            _raise_blocked_mode(gpu, base, busy, f"strategy {spec.strategy.value} turns MIG off")
        return base
    model = catalog_model(gpu.model, gpu.product_name)
    if model is None or not model.mig_capable or not gpu.mig_capable:
        raise PlanError(PlanErrorReason.NO_MIG, _no_mig_message(gpu, spec.strategy, model))
    if not gpu.mig_mode_current and gpu.in_use:
        raise PlanError(
            PlanErrorReason.BLOCKED,
            f"strategy {spec.strategy.value} turns MIG on, which needs an idle GPU; the GPU is in use",
            when_idle=_when_idle_layout(spec, gpu, model, base),
        )
    if spec.strategy is Strategy.DYNAMIC_MIG:
        static = [i for i in in_use if not i.dynamic]
        if static:
            _raise_blocked_mode(gpu, base, static, "DynamicMIG has no static instances")
        return base
    return _place_static(spec, gpu, model, base)


def _place_static(spec: SharingPolicySpec, gpu: GpuStatus, model: GpuModel, base: GpuLayout) -> GpuLayout:
    profiles = requested_profiles(spec, model)
    by_kind = {p.kind: p for p in profiles}
    request = request_of(p.kind for p in profiles)
    in_use, existing, foreign = _current_placements(gpu, model)
    if foreign:
        unknown = ", ".join(_describe(i) for i in foreign)
        raise PlanError(
            PlanErrorReason.BLOCKED,
            f"{unknown} is in use and is not a {model.key} profile Tessera can keep",
            blocking=foreign,
            when_idle=_when_idle_layout(spec, gpu, model, base),
        )
    result = place(request, frozenset(in_use), frozenset(existing))
    if isinstance(result, Impossible):
        asked = ", ".join(f"{n} x {by_kind[k].name}" for k, n in request)
        raise PlanError(
            PlanErrorReason.DOES_NOT_FIT,
            f"{asked} do not fit one {model.key}: {'; '.join(result.problems)}",
        )
    if isinstance(result, Blocked):
        when_idle = base.model_copy(update={"mig_instances": _instances(result.when_idle, model)})
        blocking, reasons = _blocked_reasons(result, in_use, by_kind, request, model)
        raise PlanError(PlanErrorReason.BLOCKED, "; ".join(reasons), blocking=blocking, when_idle=when_idle)
    return base.model_copy(update={"mig_instances": _instances(result.layout, model)})


def _current_placements(
    gpu: GpuStatus, model: GpuModel
) -> tuple[dict[Placement, MigInstanceStatus], dict[Placement, MigInstanceStatus], list[MigInstanceStatus]]:
    """The GPU's instances as placements: in use, idle, and in use but unknown to the catalog."""
    in_use: dict[Placement, MigInstanceStatus] = {}
    existing: dict[Placement, MigInstanceStatus] = {}
    foreign: list[MigInstanceStatus] = []
    for instance in gpu.mig_instances:
        try:
            kind = model.profile(instance.profile).kind
        except ValueError:
            if instance.in_use:
                foreign.append(instance)
            continue
        (in_use if instance.in_use else existing)[(kind, instance.start)] = instance
    return in_use, existing, foreign


def _blocked_reasons(
    result: Blocked,
    in_use: dict[Placement, MigInstanceStatus],
    by_kind: dict[ProfileKind, MigProfile],
    request: tuple[tuple[ProfileKind, int], ...],
    model: GpuModel,
) -> tuple[list[MigInstanceStatus], list[str]]:
    asked = dict(request)
    reasons: list[str] = []
    blocking: dict[Placement, MigInstanceStatus] = {}
    unwanted_kinds: dict[ProfileKind, list[Placement]] = {}
    for p in result.unwanted:
        unwanted_kinds.setdefault(p[0], []).append(p)
    for kind, ps in unwanted_kinds.items():
        name = model.profile_of_kind(kind).name
        where = ", ".join(str(start) for _, start in ps)
        if asked.get(kind, 0) == 0:
            reasons.append(f"{name} at slice {where} is in use and the policy asks for no {name}")
        else:
            reasons.append(f"{len(ps)} x {name} are in use (slices {where}) and the policy asks for {asked[kind]}")
        blocking.update({p: in_use[p] for p in ps})
    for wanted, holder in result.conflicts:
        wanted_profile = by_kind[wanted[0]]
        reasons.append(
            f"{wanted_profile.name} needs {_slices_text(wanted_profile.memory_slices, wanted[1])}; "
            f"{_describe(in_use[holder])} is in use"
        )
        blocking[holder] = in_use[holder]
    if not reasons:  # the in-use set is not a valid layout itself (overlapping or bad starts)
        reasons.append(
            "the instances in use (" + ", ".join(_describe(i) for i in in_use.values()) + ") do not form a valid layout"
        )
        blocking.update(in_use)
    ordered = [blocking[p] for p in sorted(blocking, key=lambda p: p[1])]
    return ordered, reasons


def _instances(layout: tuple[Placement, ...], model: GpuModel) -> list[PlacedInstance]:
    return [PlacedInstance(profile=model.profile_of_kind(kind).name, start=start) for kind, start in layout]


def _when_idle_layout(spec: SharingPolicySpec, gpu: GpuStatus, model: GpuModel, base: GpuLayout) -> GpuLayout | None:
    """The layout the GPU would get with nothing in use (None when it would get none)."""
    idle = gpu.model_copy(
        update={
            "in_use": False,
            "mig_mode_current": True,
            "mig_instances": [i.model_copy(update={"in_use": False}) for i in gpu.mig_instances],
        }
    )
    try:
        return plan_gpu_layout(spec, idle, policy=base.policy)
    except PlanError:
        return None


def _raise_blocked_mode(gpu: GpuStatus, base: GpuLayout, busy: list[MigInstanceStatus], why: str) -> None:
    names = ", ".join(_describe(i) for i in busy)
    verb = "is" if len(busy) == 1 else "are"
    raise PlanError(
        PlanErrorReason.BLOCKED,
        f"{why}, which needs every MIG instance idle; {names} {verb} in use",
        blocking=busy,
        when_idle=base,
    )


def _no_mig_message(gpu: GpuStatus, strategy: Strategy, model: GpuModel | None) -> str:
    what = gpu.product_name
    if model is None:
        return (
            f"strategy {strategy.value} needs a MIG-capable GPU Tessera's catalog knows; {what} is not in it "
            f"(known: {', '.join(MODELS_BY_KEY)}); choose Exclusive, TimeSlicing or MPS for it, "
            "or narrow the policy's gpuSelector"
        )
    return (
        f"strategy {strategy.value} needs MIG, and {what} does not support it; choose Exclusive, "
        "TimeSlicing or MPS for it, or narrow the policy's gpuSelector"
    )
