"""What a GPU would publish under each layout of an adaptive menu.

:func:`menu_devices` plans the layout with the planner the operator runs
(``tessera.planner.gpu.plan_gpu_layout``), turns the planned layout into the status its
agent would report once applied (:func:`status_after`), and builds that status's devices with
the publisher's own builder (``tessera.dra.devices.build_gpu_devices``). So the devices a
claim is tried against here are, attribute for attribute, the ones that would be published,
except the UUIDs of MIG instances not made yet (stand-ins, ``MIG-planned-…``: nothing real
selects on a UUID that does not exist yet).
Not for: choosing a layout (``tessera.adaptive.choose``) or applying one (the agent).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tessera.adaptive.claims import Slot, slot_of
from tessera.dra.devices import TYPE_MIG, GpuDevices, build_gpu_devices
from tessera.models.catalog import MEMORY_SLICES, catalog_model
from tessera.models.layout import GpuLayout, GpuStatus, MigInstanceStatus
from tessera.models.policy import SharingPolicy, Strategy
from tessera.planner.gpu import PlanError, plan_gpu_layout


def status_after(gpu: GpuStatus, layout: GpuLayout) -> GpuStatus:
    """``gpu`` as its agent would report it with ``layout`` applied and nothing in use."""
    model = catalog_model(gpu.model, gpu.product_name)
    instances: list[MigInstanceStatus] = []
    if layout.strategy is Strategy.MIG and model is not None:
        for placed in layout.mig_instances:
            profile = model.profile(placed.profile)
            instances.append(
                MigInstanceStatus(
                    profile=profile.name,
                    start=placed.start,
                    size=profile.memory_slices,
                    uuid=f"MIG-planned-{gpu.uuid.removeprefix('GPU-')}-{placed.start}",
                    gpu_instance_id=placed.start,
                    memory_mib=profile.memory_mib,
                    multiprocessors=profile.multiprocessors,
                )
            )
    return gpu.model_copy(
        update={
            "strategy": layout.strategy,
            "policy": layout.policy,
            "mig_mode_current": layout.strategy in (Strategy.MIG, Strategy.DYNAMIC_MIG),
            "mig_instances": instances,
            "mig_sharing": layout.mig_sharing,
            "time_slicing": layout.time_slicing,
            "mps": layout.mps,
            "in_use": False,
            "applied": True,
            "message": "",
        }
    )


def device_fraction(device: dict[str, object]) -> Fraction:
    """The share of its GPU a device stands for: a MIG instance its memory slices out of 8."""
    attributes = device.get("attributes")
    assert isinstance(attributes, dict)
    size = attributes.get("migSize")
    if isinstance(size, dict) and "int" in size:
        return Fraction(int(size["int"]), MEMORY_SLICES)
    kind = attributes.get("type", {}).get("string") if isinstance(attributes.get("type"), dict) else None
    return Fraction(1, MEMORY_SLICES) if kind == TYPE_MIG else Fraction(1)


def slots_of(built: GpuDevices) -> list[Slot]:
    """Every device ``built`` publishes, as fresh slots, in publication order."""
    return [slot_of(built.gpu_uuid, d, device_fraction(d)) for d in built.devices]


@dataclass(frozen=True)
class MenuOption:
    """One layout of the menu on one GPU: the layout to write and what it would publish."""

    layout_name: str
    layout: GpuLayout
    devices: GpuDevices


def idle_gpu(gpu: GpuStatus) -> GpuStatus:
    """``gpu`` with nothing in use (what a recut may assume of a GPU that no claim holds)."""
    return gpu.model_copy(
        update={"in_use": False, "mig_instances": [i.model_copy(update={"in_use": False}) for i in gpu.mig_instances]}
    )


def menu_devices(policy: SharingPolicy, gpu: GpuStatus) -> list[MenuOption]:
    """Every layout of ``policy``'s menu that plans on ``gpu`` (idle), in menu order, with the
    devices it would publish. Layouts the GPU cannot take (MIG on a GPU without it) are left out."""
    adaptive = policy.spec.adaptive
    if adaptive is None:
        return []
    idle = idle_gpu(gpu)
    out = []
    for entry in adaptive.layouts:
        try:
            layout = plan_gpu_layout(policy.spec.for_layout(entry.name), idle, policy=policy.name)
        except PlanError:
            continue
        layout = layout.model_copy(update={"menu_layout": entry.name})
        out.append(MenuOption(entry.name, layout, build_gpu_devices(status_after(idle, layout))))
    return out
