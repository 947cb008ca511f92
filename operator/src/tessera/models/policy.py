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

from pydantic import ConfigDict, Field, model_validator

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


class SharingPolicySpec(KubeModel):
    """Which nodes and GPUs, cut how, shared how (see DESIGN.md for the contract)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.strategy != 'MIG' || has(self.mig)",
                    "message": "strategy MIG needs spec.mig with profiles or a preset",
                },
                {
                    "rule": "!has(self.mig) || self.strategy == 'MIG'",
                    "message": "spec.mig is only allowed with strategy MIG",
                },
                {
                    "rule": "!has(self.timeSlicing) || self.strategy == 'TimeSlicing' || "
                    + _SHARED_BY.format(s="TimeSlicing"),
                    "message": "spec.timeSlicing is only allowed with strategy TimeSlicing "
                    "or mig.sharing.strategy TimeSlicing",
                },
                {
                    "rule": "!has(self.mps) || self.strategy == 'MPS' || " + _SHARED_BY.format(s="MPS"),
                    "message": "spec.mps is only allowed with strategy MPS or mig.sharing.strategy MPS",
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
    drain: DrainSpec = Field(default_factory=DrainSpec)

    @model_validator(mode="after")
    def _fields_fit_strategy(self) -> Self:
        if self.strategy is Strategy.MIG and self.mig is None:
            raise ValueError("strategy MIG needs spec.mig with profiles or a preset")
        if self.mig is not None and self.strategy is not Strategy.MIG:
            raise ValueError("spec.mig is only allowed with strategy MIG")
        share = self.mig.sharing.strategy if self.mig and self.mig.sharing else None
        if self.time_slicing is not None and not (
            self.strategy is Strategy.TIME_SLICING or share is ShareStrategy.TIME_SLICING
        ):
            raise ValueError(
                "spec.timeSlicing is only allowed with strategy TimeSlicing or mig.sharing.strategy TimeSlicing"
            )
        if self.mps is not None and not (self.strategy is Strategy.MPS or share is ShareStrategy.MPS):
            raise ValueError("spec.mps is only allowed with strategy MPS or mig.sharing.strategy MPS")
        return self

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
