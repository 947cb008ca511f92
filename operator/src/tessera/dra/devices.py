"""The DRA device model: one GPU, as its agent reports it, → the devices Tessera publishes.

Values are plain dicts in the ``resource.k8s.io/v1`` wire shape (``Device``, ``CounterSet``)
so that slices can be written, compared and validated without a client library.

| strategy        | devices                                                              |
| --------------- | -------------------------------------------------------------------- |
| Exclusive       | ``gpu-<i>``: the whole GPU, ``type=gpu``                             |
| MIG             | ``gpu-<i>-mig-<profile>-<start>`` per existing instance, ``type=mig`` |
| MIG + sharing   | the same, each multi-allocatable with consumable capacity, ``share`` |
| TimeSlicing     | ``gpu-<i>``, multi-allocatable, consumable ``shares`` (+ ``memory``)  |
| MPS             | ``gpu-<i>``, multi-allocatable, consumable ``memory`` and ``compute`` |
| DynamicMIG      | a counter set ``gpu-<i>`` + ``gpu-<i>-dyn-<profile>-<start>`` for     |
|                 | every possible placement, each consuming the slices it covers       |

Consumable capacity (``allowMultipleAllocations: true``): every capacity of such a device is
consumed by every allocation, and a capacity without ``requestPolicy`` is consumed *whole* by
a claim that does not ask for it. So every capacity of a shared device carries a policy:

- ``shares`` (TimeSlicing): value = replicas, default 1, range 1..replicas step 1 — at most
  ``replicas`` claims share the device.
- ``memory`` under TimeSlicing: value = the real memory, default 0, range from 0 without a
  step — a claim that does not ask for memory takes none (time-slicing does not partition
  memory), one that asks ``capacity.requests.memory: 10Gi`` books 10Gi, and the bookings of
  one device never exceed its memory. Advisory: nothing enforces it on the GPU.
- ``memory`` under MPS: default / min / step from ``mps.memory``, max = the largest
  ``min + n*step`` that fits the real memory (enforced per client through
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``).
- ``compute`` under MPS: value 100 (percent of the device's SMs), ``validValues`` from
  ``mps.compute.values`` or range 1..100 step 1, default ``mps.compute.default``.

DynamicMIG: the counter set has ``memory-slice-0`` … ``memory-slice-7`` (value 1 each),
``compute-slices`` (7) and ``media-engines`` (1). A placement consumes one unit of every
memory slice it covers, its compute slices, and the media engine for ``+me`` profiles; so
the scheduler can neither overlap two placements nor exceed the GPU's compute slices nor
place two ``+me`` instances. 25 devices per 8-slice GPU. Placements that overlap a MIG
instance that was not made for a claim (left from a static layout) are not published.

Order: a GPU's devices are listed in packing order (``tessera.dra.packing``), not by name —
smaller devices first and, for DynamicMIG, the placement that fragments least first — because
the scheduler's allocator takes the first listed device that fits. The order depends only on
static facts (profile, placement, size), so it never changes with allocations.

Every device carries ``managed`` (bool): whether the layout in force is a SharingPolicy's.

Taints: a GPU whose health is not Healthy taints every device of it with
``gpu.tessera.dev/unhealthy`` (value: the health) NoSchedule; a GPU or device being drained
gets ``tessera.dev/repartition`` NoSchedule, laid on already-built devices by
``with_drain_taints`` (so the operator builds a node's devices once per decision). They exist
only while their cause does. No ``timeAdded`` here: the apiserver stamps it, and
``tessera.dra.diff`` carries the stamp over on later writes so it stays stable.
Not for: slices, names of slices, or writing anything (``tessera.dra.slices``, the controller).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from tessera import DRIVER_NAME
from tessera.dra.packing import dynamic_placement_order, static_instance_order
from tessera.models.attributes import (
    COMPUTE_CAPACITY,
    MEMORY_CAPACITY,
    SHARES_CAPACITY,
    Attribute,
    gpu_attributes,
    memory_bytes,
    whole_gpu_attributes,
)
from tessera.models.catalog import COMPUTE_SLICES, MEMORY_SLICES, MigProfile, ProfileKind, catalog_model
from tessera.models.devices import dynamic_mig_device_name, gpu_device_name, mig_device_name
from tessera.models.layout import GpuStatus, Health, MigInstanceStatus
from tessera.models.policy import MpsSpec, ShareStrategy, Strategy, TimeSlicingSpec
from tessera.models.quantity import format_bytes, parse_quantity

DRIVER = DRIVER_NAME
UNHEALTHY_TAINT_KEY = "gpu.tessera.dev/unhealthy"
DRAIN_TAINT_KEY = "tessera.dev/repartition"
RESERVED_TAINT_KEY = "tessera.dev/reserved"  # a free device kept off new claims while its node drains for a gang claim
NO_SCHEDULE = "NoSchedule"

TYPE_GPU = "gpu"
TYPE_MIG = "mig"
TYPE_SHARE = "share"

COMPUTE_PERCENT = 100
COMPUTE_SLICES_COUNTER = "compute-slices"
MEDIA_ENGINES_COUNTER = "media-engines"

Device = dict[str, Any]
CounterSet = dict[str, Any]


def memory_slice_counter(index: int) -> str:
    """The counter that stands for memory slice ``index`` of a DynamicMIG GPU."""
    return f"memory-slice-{index}"


@dataclass(frozen=True, slots=True)
class GpuDevices:
    """What one GPU publishes: its devices, its counter sets (DynamicMIG only), and the
    reasons it publishes less than its strategy would (for logs and status)."""

    gpu_index: int
    gpu_uuid: str
    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...] = ()
    problems: tuple[str, ...] = field(default=())


@lru_cache(maxsize=1024)  # a fleet has few memory sizes, and every decision formats every device's memory
def _quantity(value: int) -> str:
    """The canonical Kubernetes form of a whole number of bytes or units (``85521956864`` →
    ``81559Mi``), which is what the apiserver returns, so stored and built slices compare equal."""
    return format_bytes(value)


def _capacity(value: int, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"value": _quantity(value)}
    if policy is not None:
        out["requestPolicy"] = policy
    return out


def _range_policy(default: int, low: int, high: int | None = None, step: int | None = None) -> dict[str, Any]:
    valid_range: dict[str, str] = {"min": _quantity(low)}
    if high is not None:
        valid_range["max"] = _quantity(high)
    if step is not None:
        valid_range["step"] = _quantity(step)
    return {"default": _quantity(default), "validRange": valid_range}


def shares_capacity(replicas: int) -> dict[str, Any]:
    """``replicas`` claims at most, one share each by default."""
    return _capacity(replicas, _range_policy(1, 1, replicas, 1))


def advisory_memory_capacity(total: int) -> dict[str, Any]:
    """Memory that claims may book (default none) without exceeding the device's total."""
    return _capacity(total, _range_policy(0, 0))


def mps_memory_capacity(total: int, spec: MpsSpec) -> dict[str, Any]:
    """Pinned memory per MPS client: ``spec.memory`` as a valid range fitted into ``total``."""
    default = parse_quantity(spec.memory.default)
    low = min(parse_quantity(spec.memory.min), total)
    step = parse_quantity(spec.memory.step)
    if low + step > total:  # not even one step fits: any amount from min up to the total
        return _capacity(total, _range_policy(min(max(default, low), total), low, total))
    high = low + (total - low) // step * step
    default = min(max(default, low), high)
    return _capacity(total, _range_policy(default, low, high, step))


def mps_compute_capacity(spec: MpsSpec) -> dict[str, Any]:
    """Percent of the device's SMs per MPS client; the shares of one device sum to <= 100."""
    compute = spec.compute
    if compute.values:
        policy: dict[str, Any] = {
            "default": _quantity(compute.default),
            "validValues": [_quantity(v) for v in compute.values],
        }
        return _capacity(COMPUTE_PERCENT, policy)
    return _capacity(COMPUTE_PERCENT, _range_policy(compute.default, 1, COMPUTE_PERCENT, 1))


def shared_capacity(total_memory: int, sharing: ShareStrategy, gpu: GpuStatus) -> dict[str, dict[str, Any]]:
    """The consumable capacity of a device shared by ``sharing`` (a whole GPU or a MIG instance)."""
    if sharing is ShareStrategy.TIME_SLICING:
        replicas = (gpu.time_slicing or TimeSlicingSpec()).replicas
        return {MEMORY_CAPACITY: advisory_memory_capacity(total_memory), SHARES_CAPACITY: shares_capacity(replicas)}
    spec = gpu.mps or MpsSpec()
    return {MEMORY_CAPACITY: mps_memory_capacity(total_memory, spec), COMPUTE_CAPACITY: mps_compute_capacity(spec)}


def _health_taints(gpu: GpuStatus) -> list[dict[str, str]]:
    if gpu.health is not Health.HEALTHY:
        return [{"key": UNHEALTHY_TAINT_KEY, "value": gpu.health.value, "effect": NO_SCHEDULE}]
    return []


def _drained(gpu_uuid: str, device: Device, draining: Collection[str]) -> bool:
    """Whether ``draining`` names the device: by its GPU's UUID, its name, or its own UUID
    (a static MIG instance's; a whole GPU's is its GPU's)."""
    own = device["attributes"].get("uuid", {}).get("string")
    return gpu_uuid in draining or device["name"] in draining or (own is not None and own in draining)


def with_drain_taints(gpu: GpuDevices, draining: Collection[str], reserved: Collection[str] = ()) -> GpuDevices:
    """``gpu``'s devices with the repartition taint on those ``draining`` names (GPU UUIDs, MIG
    instance UUIDs or device names), and the reservation taint on every device when the GPU's
    UUID is among ``reserved``, beside any taint they already carry, sorted by key.

    The one way a device gets either taint: devices are built once, untainted, and this is
    laid on top for each publish. ``gpu`` is not changed; untouched devices are shared."""
    reserve = gpu.gpu_uuid in reserved
    if not draining and not reserve:
        return gpu
    devices = []
    for device in gpu.devices:
        added = []
        if draining and _drained(gpu.gpu_uuid, device, draining):
            added.append({"key": DRAIN_TAINT_KEY, "effect": NO_SCHEDULE})
        if reserve:
            added.append({"key": RESERVED_TAINT_KEY, "effect": NO_SCHEDULE})
        if added:
            device = {**device, "taints": sorted([*device.get("taints", ()), *added], key=lambda t: t["key"])}
        devices.append(device)
    return replace(gpu, devices=tuple(devices))


def _device(
    name: str,
    attributes: dict[str, Attribute],
    capacity: dict[str, dict[str, Any]],
    *,
    shared: bool = False,
    taints: list[dict[str, str]] | None = None,
    consumes: list[dict[str, Any]] | None = None,
) -> Device:
    device: Device = {
        "name": name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": dict(sorted(capacity.items())),
    }
    if shared:
        device["allowMultipleAllocations"] = True
    if consumes:
        device["consumesCounters"] = consumes
    if taints:
        device["taints"] = taints
    return device


def _managed(gpu: GpuStatus) -> dict[str, Attribute]:
    """``managed``: whether the layout in force is a SharingPolicy's. An unmanaged GPU (no
    policy selects it, or its policy went) is published as it is and never changed."""
    return {"managed": {"bool": gpu.policy is not None}}


def _share_attributes(attrs: dict[str, Attribute], sharing: ShareStrategy | None) -> dict[str, Attribute]:
    if sharing is None:
        return attrs
    return {**attrs, "type": {"string": TYPE_SHARE}, "sharing": {"string": sharing.value}}


def _gpu_sharing(gpu: GpuStatus) -> ShareStrategy | None:
    if gpu.strategy is Strategy.TIME_SLICING:
        return ShareStrategy.TIME_SLICING
    if gpu.strategy is Strategy.MPS:
        return ShareStrategy.MPS
    return None


def whole_gpu_device(gpu: GpuStatus) -> Device:
    """The whole GPU as one device: Exclusive, or shared by TimeSlicing / MPS."""
    name = gpu_device_name(gpu.index)
    sharing = _gpu_sharing(gpu)
    attrs = _share_attributes({**whole_gpu_attributes(gpu), **_managed(gpu)}, sharing)
    if gpu.multiprocessors:
        attrs["multiprocessors"] = {"int": gpu.multiprocessors}
    total = memory_bytes(gpu.memory_mib)
    capacity = shared_capacity(total, sharing, gpu) if sharing else {MEMORY_CAPACITY: _capacity(total)}
    return _device(name, attrs, capacity, shared=sharing is not None, taints=_health_taints(gpu))


def _mig_attributes(gpu: GpuStatus, profile: str, start: int, size: int, multiprocessors: int,
                    base: dict[str, Attribute] | None = None) -> dict[str, Attribute]:
    """``base``: ``gpu_attributes(gpu)``, when the caller builds several devices of one GPU."""
    attrs: dict[str, Attribute] = {
        **(gpu_attributes(gpu) if base is None else base),
        "type": {"string": TYPE_MIG},
        "parentUUID": {"string": gpu.uuid},
        "migProfile": {"string": profile},
        "migStart": {"int": start},
        "migSize": {"int": size},
        "strategy": {"string": gpu.strategy.value},
        **_managed(gpu),
    }
    if multiprocessors:
        attrs["multiprocessors"] = {"int": multiprocessors}
    return attrs


def mig_instance_device(gpu: GpuStatus, instance: MigInstanceStatus,
                        base: dict[str, Attribute] | None = None) -> Device:
    """A static MIG instance; multi-allocatable with consumable capacity under ``mig_sharing``.
    ``base``: ``gpu_attributes(gpu)``, when the caller builds several devices of one GPU."""
    name = mig_device_name(gpu.index, instance.profile, instance.start)
    sharing = gpu.mig_sharing
    attrs = _mig_attributes(gpu, instance.profile, instance.start, instance.size, instance.multiprocessors, base)
    attrs["uuid"] = {"string": instance.uuid}
    attrs = _share_attributes(attrs, sharing)
    total = memory_bytes(instance.memory_mib)
    capacity = shared_capacity(total, sharing, gpu) if sharing else {MEMORY_CAPACITY: _capacity(total)}
    return _device(name, attrs, capacity, shared=sharing is not None, taints=_health_taints(gpu))


def counter_set_name(gpu_index: int) -> str:
    """The counter set of a DynamicMIG GPU: unique in the node's pool, a DNS label."""
    return gpu_device_name(gpu_index)


def dynamic_mig_counter_set(gpu: GpuStatus) -> CounterSet:
    """What a DynamicMIG GPU has to hand out: its memory slices, compute slices, media engine."""
    counters = {memory_slice_counter(i): {"value": "1"} for i in range(MEMORY_SLICES)}
    counters[COMPUTE_SLICES_COUNTER] = {"value": str(COMPUTE_SLICES)}
    counters[MEDIA_ENGINES_COUNTER] = {"value": "1"}
    return {"name": counter_set_name(gpu.index), "counters": dict(sorted(counters.items()))}


def placement_counters(profile: MigProfile, start: int) -> dict[str, dict[str, str]]:
    """The counters one placement of ``profile`` at ``start`` consumes."""
    counters = {memory_slice_counter(s): {"value": "1"} for s in range(start, start + profile.memory_slices)}
    counters[COMPUTE_SLICES_COUNTER] = {"value": str(profile.compute_slices)}
    if profile.kind is ProfileKind.ONE_MEDIA:
        counters[MEDIA_ENGINES_COUNTER] = {"value": "1"}
    return dict(sorted(counters.items()))


def dynamic_mig_device(gpu: GpuStatus, profile: MigProfile, start: int,
                       base: dict[str, Attribute] | None = None) -> Device:
    """One possible placement of ``profile`` on a DynamicMIG GPU, made when a claim gets it.
    ``base``: ``gpu_attributes(gpu)``, when the caller builds several devices of one GPU."""
    name = dynamic_mig_device_name(gpu.index, profile.name, start)
    attrs = _mig_attributes(gpu, profile.name, start, profile.memory_slices, profile.multiprocessors, base)
    attrs["dynamic"] = {"bool": True}
    consumes = [{"counterSet": counter_set_name(gpu.index), "counters": placement_counters(profile, start)}]
    capacity = {MEMORY_CAPACITY: _capacity(memory_bytes(profile.memory_mib))}
    return _device(name, attrs, capacity, taints=_health_taints(gpu), consumes=consumes)


def _overlaps(start: int, size: int, taken: Collection[MigInstanceStatus]) -> bool:
    return any(start < i.start + i.size and i.start < start + size for i in taken)


def build_gpu_devices(gpu: GpuStatus, draining: Collection[str] = ()) -> GpuDevices:
    """Every device (and counter set) ``gpu`` publishes under the strategy it really has.

    ``draining`` holds GPU UUIDs, MIG instance UUIDs or device names being drained; their
    devices carry the repartition taint (:func:`with_drain_taints`)."""
    return with_drain_taints(_build_gpu_devices(gpu), draining)


def _build_gpu_devices(gpu: GpuStatus) -> GpuDevices:
    if gpu.strategy in (Strategy.EXCLUSIVE, Strategy.TIME_SLICING, Strategy.MPS):
        return GpuDevices(gpu.index, gpu.uuid, (whole_gpu_device(gpu),))
    if gpu.strategy is Strategy.MIG:
        named = [(i, mig_device_name(gpu.index, i.profile, i.start)) for i in gpu.mig_instances]
        ordered = sorted(named, key=lambda pair: static_instance_order(*pair))
        base = gpu_attributes(gpu)
        return GpuDevices(gpu.index, gpu.uuid, tuple(mig_instance_device(gpu, i, base) for i, _ in ordered))
    model = catalog_model(gpu.model, gpu.product_name)
    if model is None or not model.mig_capable:
        problem = f"GPU {gpu.index} ({gpu.product_name}) has no known MIG profiles; DynamicMIG publishes nothing"
        return GpuDevices(gpu.index, gpu.uuid, (), problems=(problem,))
    fixed = [i for i in gpu.mig_instances if not i.dynamic]
    placements = sorted(
        (
            (profile, start)
            for profile in model.profiles
            for start in profile.starts
            if start + profile.memory_slices <= MEMORY_SLICES and not _overlaps(start, profile.memory_slices, fixed)
        ),
        key=lambda p: dynamic_placement_order(p[0].kind, p[1], dynamic_mig_device_name(gpu.index, p[0].name, p[1])),
    )
    base = gpu_attributes(gpu)
    return GpuDevices(
        gpu.index,
        gpu.uuid,
        tuple(dynamic_mig_device(gpu, profile, start, base) for profile, start in placements),
        counter_sets=(dynamic_mig_counter_set(gpu),),
    )
