"""NodeLayout (``tessera.dev/v1alpha1``, cluster-scoped, one per node) and the GPU values
the operator and the agent share.

``spec`` is what the operator wants each GPU to be (written by the operator only);
``status`` is what the node agent found and made (written by that node's agent only): the
inventory, the layout that really exists, health and conditions. The operator publishes
ResourceSlices from ``status``, never from ``spec``.
Not for: deciding layouts (``tessera.planner``) or applying them (``tessera.agent``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from tessera.models.base import KubeModel
from tessera.models.catalog import MEMORY_SLICES
from tessera.models.conditions import Condition
from tessera.models.nics import NicStatus
from tessera.models.policy import MpsSpec, ObjectMeta, ShareStrategy, Strategy, TimeSlicingSpec

# NodeLayout's lists are atomic to the apiserver, not maps keyed by uuid, interface or type: each
# side is written by one writer (spec by the operator, status by the agent), whole, by merge patch,
# which replaces a list whatever its type. A map list makes the apiserver track an owner for every
# field of every item in managedFields on each write: measured on 100 NodeLayouts of 8 MIG GPUs,
# 19-28 ms of apiserver CPU per status write against 12-18 ms atomic (33-47 % less within each
# run), and managedFields of 5.1 KB against 0.5 KB in every stored object and watch event. The
# keys stay unique: the models below refuse a duplicate, so neither side writes one nor acts on one.
_ATOMIC: JsonDict = {"x-kubernetes-list-type": "atomic"}


def _unique_keys(items: list[Any], key: str, where: str) -> None:
    seen: set[object] = set()
    for item in items:
        value = getattr(item, key)
        if value in seen:
            raise ValueError(f"{where}: {key} {value!r} is listed twice")
        seen.add(value)


class PlacedInstance(KubeModel):
    """A MIG GPU instance the operator wants: a profile at a start memory slice."""

    profile: str = Field(min_length=1, max_length=32)
    start: int = Field(ge=0, lt=MEMORY_SLICES)


_PLACED: dict[PlacedInstance, PlacedInstance] = {}
_PLACED_MAX = 4096  # more (profile, start) pairs than any catalog has; past it, instances go unshared


def _shared_placements(placed: list[PlacedInstance]) -> list[PlacedInstance]:
    """One instance per (profile, start), shared by every GPU layout that lists it: a value of a
    few kinds repeated on every GPU of a fleet (frozen, so nothing can tell), so an operator
    holding thousands of NodeLayouts keeps a handful instead of one per instance per GPU."""
    if len(_PLACED) >= _PLACED_MAX:
        return placed
    return [_PLACED.setdefault(p, p) for p in placed]


class GpuLayout(KubeModel):
    """The desired layout of one GPU, as the planner made it."""

    _interned_fields = ("policy", "menu_layout")

    uuid: str = Field(min_length=1, max_length=128)
    policy: str | None = Field(default=None, description="the SharingPolicy this layout comes from")
    menu_layout: str | None = Field(
        default=None, description="Adaptive policies: the menu layout this is (kept here so a restart keeps it)"
    )
    strategy: Strategy = Strategy.EXCLUSIVE
    mig_instances: list[PlacedInstance] = Field(default_factory=list, max_length=7)
    mig_sharing: ShareStrategy | None = None
    time_slicing: TimeSlicingSpec | None = None
    mps: MpsSpec | None = None


    @model_validator(mode="after")
    def _share_placements(self) -> GpuLayout:
        self.__dict__["mig_instances"] = _shared_placements(self.mig_instances)
        return self


class ClaimCheck(StrEnum):
    """Who answers the agent's check of its node's claims before it destroys a device."""

    OPERATOR = "Operator"  # the operator that wrote the spec (tessera.controller.claimchecks)


class NodeLayoutSpec(KubeModel):
    gpus: list[GpuLayout] = Field(default_factory=list, max_length=64, json_schema_extra=_ATOMIC)
    claim_check: ClaimCheck | None = Field(
        default=None,
        description="Operator: before destroying or reshaping a device, the agent asks the operator (which reads "
        "every claim) for the claims holding this node's devices. Unset: the agent watches every claim itself.",
    )

    @model_validator(mode="after")
    def _one_layout_per_gpu(self) -> NodeLayoutSpec:
        _unique_keys(self.gpus, "uuid", "spec.gpus")
        return self

    def for_gpu(self, uuid: str) -> GpuLayout | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class Health(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"  # a fatal XID or similar: taint, do not schedule
    LOST = "Lost"  # GPU_IS_LOST: every device of the GPU is tainted


class MigInstanceStatus(KubeModel):
    """A MIG instance that exists on the GPU."""

    _interned_fields = ("profile",)

    profile: str
    start: int = Field(ge=0, lt=MEMORY_SLICES)
    size: int = Field(ge=1, le=MEMORY_SLICES)
    uuid: str = Field(description="MIG-<uuid>, what CUDA_VISIBLE_DEVICES takes")
    gpu_instance_id: int = Field(ge=0)
    compute_instance_id: int = Field(default=0, ge=0)
    memory_mib: int = Field(ge=0)
    multiprocessors: int = Field(default=0, ge=0)
    in_use: bool = False
    dynamic: bool = Field(default=False, description="made at prepare time for a DynamicMIG claim")


class GpuStatus(KubeModel):
    """One GPU as the agent sees it: inventory, the layout that exists, health."""

    _interned_fields = ("product_name", "model", "cuda_compute_capability", "architecture", "driver_version",
                        "cuda_version", "pci_bus_id", "pcie_root", "policy", "health_message", "message")

    uuid: str
    index: int = Field(ge=0)
    product_name: str
    model: str | None = Field(default=None, description="catalog key, e.g. H100-80GB; none if unknown")
    memory_mib: int = Field(ge=0)
    multiprocessors: int = Field(default=0, ge=0)
    cuda_compute_capability: str = ""
    architecture: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    pci_bus_id: str | None = None
    pcie_root: str | None = Field(default=None, description="the PCIe root complex from sysfs, e.g. pci0000:3a")
    numa_node: int | None = None
    mig_capable: bool = False
    mig_mode_current: bool = False
    mig_mode_pending: bool = False
    strategy: Strategy = Strategy.EXCLUSIVE
    policy: str | None = None
    mig_instances: list[MigInstanceStatus] = Field(default_factory=list, max_length=7)
    mig_sharing: ShareStrategy | None = None
    time_slicing: TimeSlicingSpec | None = None
    mps: MpsSpec | None = None
    in_use: bool = False
    health: Health = Health.HEALTHY
    health_message: str = ""
    applied: bool = Field(default=True, description="the layout matches NodeLayout.spec")
    message: str = Field(default="", description="why the layout is not applied yet")
    reason: str = Field(
        default="",
        description="why the layout is not applied: Applying (under way), or what stops the agent "
        "(ResetRequired, InstanceInUse, GpuInUse, ClaimCheckFailed, OperationFailed, ...)",
    )


class NodeLayoutStatus(KubeModel):
    observed_generation: int | None = None
    backend: str = ""
    agent_version: str = ""
    gpus: list[GpuStatus] = Field(default_factory=list, max_length=64, json_schema_extra=_ATOMIC)
    # The node's NICs (tessera.agent.nics), for the NIC family's publisher (tessera.controller.nics).
    nics: list[NicStatus] = Field(default_factory=list, max_length=32, json_schema_extra=_ATOMIC)
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_ATOMIC)

    @model_validator(mode="after")
    def _one_entry_per_key(self) -> NodeLayoutStatus:
        _unique_keys(self.gpus, "uuid", "status.gpus")
        _unique_keys(self.nics, "interface", "status.nics")
        _unique_keys(self.conditions, "type", "status.conditions")
        return self

    def gpu(self, uuid: str) -> GpuStatus | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class NodeLayout(KubeModel):
    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["NodeLayout"] = "NodeLayout"
    metadata: ObjectMeta
    spec: NodeLayoutSpec = Field(default_factory=NodeLayoutSpec)
    status: NodeLayoutStatus | None = None
