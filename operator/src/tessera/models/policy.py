"""The SharingPolicy API (``tessera.dev/v1alpha1``): what a platform team declares.

The pydantic models are the single source of truth: the CRD schema in ``crds/`` is generated
from them, and the cross-field rules are written twice on purpose, once as pydantic validators
(``tessera plan`` checks files offline) and once as CEL ``x-kubernetes-validations`` (the
apiserver refuses bad input at admission); tests hold the two to the same verdicts.
Not for: matching or planning (``tessera.planner``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Self

from pydantic import ConfigDict, Field, JsonValue, model_validator

from tessera.models.base import KubeModel
from tessera.models.catalog import KNOWN_PROFILE_NAMES
from tessera.models.conditions import Condition
from tessera.models.quantity import Duration, Quantity, parse_duration, parse_quantity


class Strategy(StrEnum):
    """How one GPU is cut and shared."""

    EXCLUSIVE = "Exclusive"
    MIG = "MIG"
    DYNAMIC_MIG = "DynamicMIG"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"
    ADAPTIVE = "Adaptive"  # Tessera picks each GPU's layout from ``spec.adaptive.layouts`` to fit demand


class ShareStrategy(StrEnum):
    """How a GPU or a MIG instance is shared between claims."""

    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class MigPreset(StrEnum):
    ALL_1G = "all-1g"  # seven 1g instances
    ALL_BALANCED = "all-balanced"  # 2 x 1g, 1 x 2g, 1 x 3g
    WHOLE = "whole"  # one 7g instance


class TimeSliceInterval(StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


class DrainMode(StrEnum):
    WAIT = "Wait"  # wait for claims to go, however long; past the timeout, report Degraded
    EVICT = "Evict"  # past the timeout, evict the Pods that hold the claims (PDBs respected)


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


_NO_VALUES = (LabelSelectorOperator.EXISTS, LabelSelectorOperator.DOES_NOT_EXIST)


class LabelSelectorRequirement(KubeModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) "
                    ": (!has(self.values) || size(self.values) == 0)",
                    "message": "operators In and NotIn need values; Exists and DoesNotExist take none",
                }
            ]
        }
    )

    key: str = Field(min_length=1, max_length=317)
    operator: LabelSelectorOperator
    values: list[str] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        if (self.operator in _NO_VALUES) == bool(self.values):
            raise ValueError(
                f"operators In and NotIn need values; Exists and DoesNotExist take none (key {self.key!r})"
            )
        return self


class LabelSelector(KubeModel):
    """A Kubernetes LabelSelector; empty selects everything, as in Kubernetes."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=32)

    def matches(self, labels: dict[str, str]) -> bool:
        """Kubernetes' semantics: every matchLabels pair and every expression must hold."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            match req.operator:
                case LabelSelectorOperator.IN:
                    ok = present and labels[req.key] in req.values
                case LabelSelectorOperator.NOT_IN:
                    ok = not present or labels[req.key] not in req.values
                case LabelSelectorOperator.EXISTS:
                    ok = present
                case LabelSelectorOperator.DOES_NOT_EXIST:
                    ok = not present
            if not ok:
                return False
        return True


class GpuSelector(KubeModel):
    """A CEL expression over a GPU as Tessera publishes it (``device.attributes[...]``)."""

    cel: str = Field(min_length=1, max_length=10240)


_KNOWN = ", ".join(f"'{n}'" for n in KNOWN_PROFILE_NAMES)


class MigSharing(KubeModel):
    strategy: ShareStrategy


class MigSpec(KubeModel):
    """Static MIG: exact profile counts or a preset, optionally shared again."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.profiles) != has(self.preset)",
                    "message": "spec.mig needs exactly one of profiles or preset",
                }
            ]
        }
    )

    profiles: dict[str, int] | None = Field(
        default=None,
        max_length=7,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # A static message: a messageExpression naming the unknown keys costs more
                    # than the apiserver's CEL budget allows (map keys have no length bound).
                    "rule": f"self.all(k, k in [{_KNOWN}])",
                    "message": f"unknown MIG profile; known profiles: {', '.join(KNOWN_PROFILE_NAMES)}",
                },
                {
                    "rule": "self.all(k, self[k] >= 1 && self[k] <= 7)",
                    "message": "a MIG profile count must be between 1 and 7",
                },
            ]
        },
    )
    preset: MigPreset | None = None
    sharing: MigSharing | None = None

    @model_validator(mode="after")
    def _profiles_or_preset(self) -> Self:
        if (self.profiles is None) == (self.preset is None):
            raise ValueError("spec.mig needs exactly one of profiles or preset")
        if self.profiles is not None:
            unknown = sorted(k for k in self.profiles if k not in KNOWN_PROFILE_NAMES)
            if unknown:
                raise ValueError(
                    f"unknown MIG profile {', '.join(unknown)}; known profiles: {', '.join(KNOWN_PROFILE_NAMES)}"
                )
            bad = sorted(k for k, n in self.profiles.items() if not 1 <= n <= 7)
            if bad:
                raise ValueError("a MIG profile count must be between 1 and 7")
        return self


class TimeSlicingSpec(KubeModel):
    replicas: int = Field(default=4, ge=2, le=64, description="claims that may share one device")
    interval: TimeSliceInterval = TimeSliceInterval.DEFAULT


# The schema's pattern already refuses a malformed quantity with a clear message; without this
# guard each rule below would add a second, cryptic one ("quantities must match ...").
_IF_QUANTITIES = "!(isQuantity(self.default) && isQuantity(self.min) && isQuantity(self.step)) || "


class MpsMemory(KubeModel):
    """Pinned device memory per MPS client; becomes the capacity requestPolicy validRange."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": _IF_QUANTITIES + "quantity(self.step).isGreaterThan(quantity('0'))",
                    "message": "mps.memory.step must be greater than zero",
                },
                {
                    "rule": _IF_QUANTITIES + "quantity(self.min).compareTo(quantity(self.default)) <= 0",
                    "message": "mps.memory.default must be at least mps.memory.min",
                },
                {
                    "rule": _IF_QUANTITIES + "!quantity(self.step).isGreaterThan(quantity('0')) || "
                    "(quantity(self.default).asInteger() - quantity(self.min).asInteger()) "
                    "% quantity(self.step).asInteger() == 0",
                    "message": "mps.memory.default must be mps.memory.min plus a whole number of steps",
                },
            ]
        }
    )

    default: Quantity = "4Gi"
    min: Quantity = "1Gi"
    step: Quantity = "1Gi"

    @model_validator(mode="after")
    def _range_holds(self) -> Self:
        default, low, step = (parse_quantity(v) for v in (self.default, self.min, self.step))
        if step <= 0:
            raise ValueError("mps.memory.step must be greater than zero")
        if default < low:
            raise ValueError("mps.memory.default must be at least mps.memory.min")
        if (default - low) % step:
            raise ValueError("mps.memory.default must be mps.memory.min plus a whole number of steps")
        return self


class MpsCompute(KubeModel):
    """Active-thread percentage per MPS client; reserved, so the shares of one GPU sum to <= 100."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.values) || self.default in self.values",
                    "message": "mps.compute.values must contain mps.compute.default",
                },
                {
                    "rule": "!has(self.values) || self.values.isSorted()",
                    "message": "mps.compute.values must be sorted",
                },
            ]
        }
    )

    default: int = Field(default=10, ge=1, le=100)
    values: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=10,
        json_schema_extra={"x-kubernetes-list-type": "set", "items": {"minimum": 1, "maximum": 100}},
    )

    @model_validator(mode="after")
    def _values_hold_default(self) -> Self:
        if self.values is not None:
            if any(not 1 <= v <= 100 for v in self.values):
                raise ValueError("mps.compute.values must each be between 1 and 100")
            if self.default not in self.values:
                raise ValueError("mps.compute.values must contain mps.compute.default")
            if self.values != sorted(set(self.values)):
                raise ValueError("mps.compute.values must be sorted, without duplicates")
        return self


class MpsSpec(KubeModel):
    memory: MpsMemory = Field(default_factory=MpsMemory)
    compute: MpsCompute = Field(default_factory=MpsCompute)
    max_clients: int = Field(default=48, ge=1, le=48, description="MPS allows at most 48 clients per device")


class DrainSpec(KubeModel):
    mode: DrainMode = DrainMode.WAIT
    timeout: Duration = "1h"

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)


_SHARED_BY = "(has(self.mig) && has(self.mig.sharing) && self.mig.sharing.strategy == '{s}')"

# The rules that tie spec.mig, spec.timeSlicing and spec.mps to a strategy; a policy and each
# layout of an adaptive menu keep them alike (CEL here, :func:`_check_fields_fit` in pydantic).
_FIELDS_FIT_STRATEGY_RULES: list[JsonValue] = [
    {
        "rule": "self.strategy != 'MIG' || has(self.mig)",
        "message": "strategy MIG needs spec.mig with profiles or a preset",
    },
    {
        "rule": "!has(self.mig) || self.strategy == 'MIG'",
        "message": "spec.mig is only allowed with strategy MIG",
    },
    {
        "rule": "!has(self.timeSlicing) || self.strategy == 'TimeSlicing' || " + _SHARED_BY.format(s="TimeSlicing"),
        "message": "spec.timeSlicing is only allowed with strategy TimeSlicing or mig.sharing.strategy TimeSlicing",
    },
    {
        "rule": "!has(self.mps) || self.strategy == 'MPS' || " + _SHARED_BY.format(s="MPS"),
        "message": "spec.mps is only allowed with strategy MPS or mig.sharing.strategy MPS",
    },
]


def _check_fields_fit(
    strategy: Strategy, mig: MigSpec | None, time_slicing: TimeSlicingSpec | None, mps: MpsSpec | None
) -> None:
    """pydantic's copy of :data:`_FIELDS_FIT_STRATEGY_RULES`, with the same words."""
    if strategy is Strategy.MIG and mig is None:
        raise ValueError("strategy MIG needs spec.mig with profiles or a preset")
    if mig is not None and strategy is not Strategy.MIG:
        raise ValueError("spec.mig is only allowed with strategy MIG")
    share = mig.sharing.strategy if mig and mig.sharing else None
    if time_slicing is not None and not (strategy is Strategy.TIME_SLICING or share is ShareStrategy.TIME_SLICING):
        raise ValueError(
            "spec.timeSlicing is only allowed with strategy TimeSlicing or mig.sharing.strategy TimeSlicing"
        )
    if mps is not None and not (strategy is Strategy.MPS or share is ShareStrategy.MPS):
        raise ValueError("spec.mps is only allowed with strategy MPS or mig.sharing.strategy MPS")


_MENU_STRATEGIES = ("Exclusive", "MIG", "TimeSlicing", "MPS")
_LAYOUT_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class AdaptiveLayout(KubeModel):
    """One layout of an adaptive menu: a name and the same fields a static policy has."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.strategy in [" + ", ".join(f"'{s}'" for s in _MENU_STRATEGIES) + "]",
                    "message": "a layout of spec.adaptive.layouts takes strategy Exclusive, MIG, TimeSlicing or MPS",
                },
                *_FIELDS_FIT_STRATEGY_RULES,
            ]
        }
    )

    name: str = Field(min_length=1, max_length=63, pattern=_LAYOUT_NAME, description="how status and events name it")
    strategy: Strategy = Strategy.EXCLUSIVE
    mig: MigSpec | None = None
    time_slicing: TimeSlicingSpec | None = None
    mps: MpsSpec | None = None

    @model_validator(mode="after")
    def _fits_menu(self) -> Self:
        if self.strategy.value not in _MENU_STRATEGIES:
            raise ValueError("a layout of spec.adaptive.layouts takes strategy Exclusive, MIG, TimeSlicing or MPS")
        _check_fields_fit(self.strategy, self.mig, self.time_slicing, self.mps)
        return self


class AdaptiveSpec(KubeModel):
    """What Tessera may do with each GPU of an ``Adaptive`` policy: cut it as any layout of the
    menu to fit claims that wait, and return it to ``idle`` once it is free again."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.layouts.exists(l, l.name == self.idle)",
                    "message": "spec.adaptive.idle must name one of spec.adaptive.layouts",
                }
            ]
        }
    )

    layouts: list[AdaptiveLayout] = Field(
        min_length=1,
        max_length=8,
        description="the menu: every layout Tessera may give a GPU",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    idle: str = Field(min_length=1, max_length=63, description="the layout of a GPU nothing waits for")
    cooldown: Duration = Field(default="5m", description="least time a GPU keeps a layout before another recut")
    max_recuts: int = Field(default=2, ge=1, le=1000, description="GPUs of this policy being recut at once, at most")
    pending_after: Duration = Field(
        default="5s", description="how long a claim's Pod must be Unschedulable before the claim counts as demand"
    )

    @model_validator(mode="after")
    def _idle_on_menu(self) -> Self:
        names = [layout.name for layout in self.layouts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"spec.adaptive.layouts names {', '.join(twice)} more than once; names must be unique")
        if self.idle not in names:
            raise ValueError("spec.adaptive.idle must name one of spec.adaptive.layouts")
        return self

    @property
    def cooldown_seconds(self) -> float:
        return parse_duration(self.cooldown)

    @property
    def pending_after_seconds(self) -> float:
        return parse_duration(self.pending_after)

    def layout(self, name: str) -> AdaptiveLayout:
        """The menu layout called ``name`` (a KeyError when the menu has none)."""
        for layout in self.layouts:
            if layout.name == name:
                return layout
        raise KeyError(name)


class SharingPolicySpec(KubeModel):
    """Which nodes and GPUs, cut how, shared how (see DESIGN.md for the contract)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                *_FIELDS_FIT_STRATEGY_RULES,
                {
                    "rule": "(self.strategy == 'Adaptive') == has(self.adaptive)",
                    "message": "strategy Adaptive needs spec.adaptive with a menu of layouts, "
                    "and spec.adaptive is only allowed with strategy Adaptive",
                },
            ]
        }
    )

    priority: int = Field(default=0, ge=0, le=1_000_000, description="higher wins; ties go to the name")
    node_selector: LabelSelector = Field(default_factory=LabelSelector)
    gpu_selector: GpuSelector | None = None
    strategy: Strategy = Strategy.EXCLUSIVE
    mig: MigSpec | None = None
    time_slicing: TimeSlicingSpec | None = None
    mps: MpsSpec | None = None
    adaptive: AdaptiveSpec | None = None
    drain: DrainSpec = Field(default_factory=DrainSpec)

    @model_validator(mode="after")
    def _fields_fit_strategy(self) -> Self:
        _check_fields_fit(self.strategy, self.mig, self.time_slicing, self.mps)
        if (self.strategy is Strategy.ADAPTIVE) != (self.adaptive is not None):
            raise ValueError(
                "strategy Adaptive needs spec.adaptive with a menu of layouts, "
                "and spec.adaptive is only allowed with strategy Adaptive"
            )
        return self

    def for_layout(self, name: str) -> SharingPolicySpec:
        """The static policy an adaptive menu's layout ``name`` stands for: that layout's
        strategy and fields, this policy's selectors, priority and drain."""
        if self.adaptive is None:
            raise KeyError(name)
        layout = self.adaptive.layout(name)
        return SharingPolicySpec(
            priority=self.priority,
            node_selector=self.node_selector,
            gpu_selector=self.gpu_selector,
            strategy=layout.strategy,
            mig=layout.mig,
            time_slicing=layout.time_slicing,
            mps=layout.mps,
            drain=self.drain,
        )

    @property
    def sharing(self) -> ShareStrategy | None:
        """How each published device is shared: the GPU itself, or each MIG instance."""
        if self.strategy is Strategy.TIME_SLICING:
            return ShareStrategy.TIME_SLICING
        if self.strategy is Strategy.MPS:
            return ShareStrategy.MPS
        if self.mig is not None and self.mig.sharing is not None:
            return self.mig.sharing.strategy
        return None

    def effective_time_slicing(self) -> TimeSlicingSpec | None:
        if self.sharing is ShareStrategy.TIME_SLICING:
            return self.time_slicing or TimeSlicingSpec()
        return None

    def effective_mps(self) -> MpsSpec | None:
        if self.sharing is ShareStrategy.MPS:
            return self.mps or MpsSpec()
        return None


class PolicyConflict(KubeModel):
    """A GPU that this policy selects but another policy wins."""

    node: str
    gpu: str
    winner: str


class AdaptiveGpuLayout(KubeModel):
    """An ``Adaptive`` policy's GPU: the menu layout it has now, and why."""

    node: str
    gpu: str = Field(description="the GPU's UUID")
    index: int = Field(default=0, ge=0)
    layout: str = Field(description="the menu layout chosen for it now")
    reason: str = Field(default="", max_length=256, description='e.g. "recut for claim team-a/llm-0", "idle default"')
    since: str | None = Field(
        default=None,
        max_length=64,
        description="RFC 3339: when the layout was chosen; the cooldown counts from it, across operator restarts",
    )


class SharingPolicyStatus(KubeModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    nodes: int = 0
    gpus: int = 0
    gpus_applied: int = 0
    devices_published: int = 0
    conflicts: int = 0
    conflicting: list[PolicyConflict] = Field(default_factory=list, max_length=20)
    draining: list[str] = Field(default_factory=list, max_length=50, description="what a drain waits for")
    gpus_recut: int = Field(default=0, ge=0, description="Adaptive: GPUs away from the idle layout, recut for demand")
    adaptive: list[AdaptiveGpuLayout] = Field(
        default_factory=list, max_length=100, description="Adaptive: per GPU, the layout chosen now and why"
    )


class ObjectMeta(KubeModel):
    """The parts of metadata Tessera reads; the rest is kept by the apiserver."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    )
    generation: int | None = None
    uid: str | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class SharingPolicy(KubeModel):
    """A whole SharingPolicy object, as read from a file or the API."""

    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["SharingPolicy"] = "SharingPolicy"
    metadata: ObjectMeta
    spec: SharingPolicySpec = Field(default_factory=SharingPolicySpec)
    status: SharingPolicyStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
