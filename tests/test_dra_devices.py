"""The DRA device model: what each strategy publishes for one GPU (tessera.dra.devices)."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import pytest

from tessera.dra.devices import (
    COMPUTE_SLICES_COUNTER,
    DRAIN_TAINT_KEY,
    MEDIA_ENGINES_COUNTER,
    UNHEALTHY_TAINT_KEY,
    build_gpu_devices,
    memory_slice_counter,
    mps_memory_capacity,
)
from tessera.models.catalog import MEMORY_SLICES, MODELS, model_by_key
from tessera.models.devices import DeviceKind, parse_device_name
from tessera.models.layout import GpuStatus, Health
from tessera.models.policy import MpsMemory, MpsSpec, ShareStrategy, Strategy
from tessera.models.quantity import MIB, quantity_value
from tests.dra_gpus import dynamic_gpu, every_strategy, gpu, instance, mig_gpu, mps_gpu, time_sliced_gpu
from tests.dra_limits import validate_device

GIB = 1024**3


def attr(device: dict[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def cap(device: dict[str, Any], name: str) -> Fraction:
    return quantity_value(device["capacity"][name]["value"])


def policy(device: dict[str, Any], name: str) -> dict[str, Any]:
    result: dict[str, Any] = device["capacity"][name]["requestPolicy"]
    return result


def test_exclusive_gpu_is_one_whole_device_with_its_real_memory_in_bytes() -> None:
    g = gpu(3)
    (device,) = build_gpu_devices(g).devices
    assert device["name"] == "gpu-3"
    assert attr(device, "type") == "gpu"
    assert attr(device, "uuid") == g.uuid
    assert attr(device, "productName") == "NVIDIA H100 80GB HBM3"
    assert attr(device, "architecture") == "Hopper"
    assert attr(device, "index") == 3
    assert attr(device, "strategy") == "Exclusive"
    assert attr(device, "cudaComputeCapability") == "9.0.0"
    assert attr(device, "driverVersion") == "580.65.6"
    assert attr(device, "resource.kubernetes.io/pcieRoot") == "pci0000:30"
    assert cap(device, "memory") == 81559 * MIB
    assert "requestPolicy" not in device["capacity"]["memory"]
    assert "allowMultipleAllocations" not in device
    assert "taints" not in device


def test_a_gpu_whose_root_complex_is_unknown_publishes_no_pcie_root() -> None:
    # The bus id alone does not say which root complex a GPU hangs off: guessing would put
    # every GPU of PCI domain 0 behind one root and make matchAttribute on it meaningless.
    (device,) = build_gpu_devices(gpu(0, pci_bus_id="00000000:3B:00.0", pcie_root=None)).devices
    assert "resource.kubernetes.io/pcieRoot" not in device["attributes"]
    assert attr(device, "numaNode") == 0


def test_static_mig_publishes_one_device_per_existing_instance() -> None:
    g = mig_gpu(1)
    devices = build_gpu_devices(g).devices
    assert [d["name"] for d in devices] == ["gpu-1-mig-1g-10gb-6", "gpu-1-mig-2g-20gb-4", "gpu-1-mig-3g-40gb-0"]
    by_profile = {attr(d, "migProfile"): d for d in devices}
    three = by_profile["3g.40gb"]
    assert attr(three, "type") == "mig"
    assert attr(three, "uuid") == g.mig_instances[0].uuid
    assert attr(three, "parentUUID") == g.uuid
    assert attr(three, "migStart") == 0
    assert attr(three, "migSize") == 4
    assert attr(three, "multiprocessors") == 60
    assert attr(three, "strategy") == "MIG"
    # The real memory (40448 MiB, below 40Gi), not the number in the profile's name.
    assert cap(three, "memory") == 40448 * MIB
    assert cap(three, "memory") < 40 * GIB
    assert all("allowMultipleAllocations" not in d for d in devices)


def test_mig_without_instances_publishes_no_devices() -> None:
    g = gpu(0, Strategy.MIG, mig_mode_current=True)
    assert build_gpu_devices(g).devices == ()


def test_every_device_name_parses_back_to_its_gpu_and_placement() -> None:
    for g in (gpu(2), mig_gpu(2), dynamic_gpu(2)):
        for device in build_gpu_devices(g).devices:
            ref = parse_device_name(device["name"])
            assert ref.gpu_index == 2
            if ref.kind is not DeviceKind.GPU:
                assert ref.profile == attr(device, "migProfile")
                assert ref.start == attr(device, "migStart")


def test_time_slicing_shares_the_gpu_by_replicas_and_books_memory_only_on_request() -> None:
    (device,) = build_gpu_devices(time_sliced_gpu(0, replicas=6)).devices
    assert device["allowMultipleAllocations"] is True
    assert attr(device, "type") == "share"
    assert attr(device, "sharing") == "TimeSlicing"
    assert cap(device, "shares") == 6
    assert policy(device, "shares") == {"default": "1", "validRange": {"min": "1", "max": "6", "step": "1"}}
    # Memory is consumable but not partitioned: a claim that does not ask takes none.
    assert cap(device, "memory") == 81559 * MIB
    assert policy(device, "memory") == {"default": "0", "validRange": {"min": "0"}}


def test_mps_memory_and_compute_are_consumable_with_the_policy_of_the_spec() -> None:
    (device,) = build_gpu_devices(mps_gpu(0)).devices
    assert device["allowMultipleAllocations"] is True
    assert attr(device, "sharing") == "MPS"
    memory = policy(device, "memory")
    assert memory["default"] == "10Gi"
    # max is the largest min + n*step that fits 81559 MiB: 79Gi.
    assert memory["validRange"] == {"min": "1Gi", "max": "79Gi", "step": "1Gi"}
    assert cap(device, "compute") == 100
    assert policy(device, "compute") == {"default": "25", "validRange": {"min": "1", "max": "100", "step": "1"}}


def test_mps_compute_values_become_valid_values() -> None:
    (device,) = build_gpu_devices(mps_gpu(0, values=[10, 25, 50, 100])).devices
    assert policy(device, "compute") == {"default": "25", "validValues": ["10", "25", "50", "100"]}


@pytest.mark.parametrize(
    ("total_mib", "memory", "expected"),
    [
        # A 1g.5gb instance (4864 MiB) with a default larger than it: default clamps to max.
        (4864, MpsMemory(default="8Gi", min="1Gi", step="1Gi"), {"default": "4Gi", "min": "1Gi", "max": "4Gi"}),
        # Not one step fits above min: the range runs from min to the whole capacity, no step.
        (1536, MpsMemory(default="1Gi", min="1Gi", step="1Gi"), {"default": "1Gi", "min": "1Gi", "max": "1536Mi"}),
        # min above the capacity: min and default become the capacity.
        (512, MpsMemory(default="1Gi", min="1Gi", step="1Gi"), {"default": "512Mi", "min": "512Mi", "max": "512Mi"}),
    ],
)
def test_mps_memory_policy_always_fits_the_device(total_mib: int, memory: MpsMemory, expected: dict[str, str]) -> None:
    capacity = mps_memory_capacity(total_mib * MIB, MpsSpec(memory=memory))
    got = capacity["requestPolicy"]
    assert {"default": got["default"], "min": got["validRange"]["min"], "max": got["validRange"]["max"]} == expected
    device = {"name": "d", "allowMultipleAllocations": True, "capacity": {"memory": capacity}}
    assert validate_device(device) == []


@pytest.mark.parametrize("sharing", [ShareStrategy.MPS, ShareStrategy.TIME_SLICING])
def test_shared_mig_instances_are_multi_allocatable_with_their_own_memory(sharing: ShareStrategy) -> None:
    devices = build_gpu_devices(mig_gpu(0, sharing=sharing)).devices
    assert len(devices) == 3
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        assert attr(device, "type") == "share"
        assert attr(device, "sharing") == sharing.value
        assert attr(device, "migProfile")
        assert validate_device(device) == []
    one_g = next(d for d in devices if attr(d, "migProfile") == "1g.10gb")
    assert cap(one_g, "memory") == 9984 * MIB
    if sharing is ShareStrategy.MPS:
        assert quantity_value(policy(one_g, "memory")["validRange"]["max"]) <= 9984 * MIB
        assert "compute" in one_g["capacity"]
    else:
        assert cap(one_g, "shares") == 4


def test_dynamic_mig_publishes_a_counter_set_and_every_placement() -> None:
    published = build_gpu_devices(dynamic_gpu(0))
    (counter_set,) = published.counter_sets
    assert counter_set["name"] == "gpu-0"
    counters = {k: int(v["value"]) for k, v in counter_set["counters"].items()}
    assert counters == {
        **{memory_slice_counter(i): 1 for i in range(MEMORY_SLICES)},
        COMPUTE_SLICES_COUNTER: 7,
        MEDIA_ENGINES_COUNTER: 1,
    }
    # 1g:7, 1g+me:7, 1g double:4, 2g:3, 3g:2, 4g:1, 7g:1
    assert len(published.devices) == 25
    profiles = sorted({attr(d, "migProfile") for d in published.devices})
    assert profiles == ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    seven = next(d for d in published.devices if attr(d, "migProfile") == "7g.80gb")
    assert seven["name"] == "gpu-0-dyn-7g-80gb-0"
    assert attr(seven, "dynamic") is True
    assert attr(seven, "parentUUID") == dynamic_gpu(0).uuid
    assert "uuid" not in seven["attributes"]
    assert cap(seven, "memory") == 81152 * MIB
    (consumes,) = seven["consumesCounters"]
    assert consumes["counterSet"] == "gpu-0"
    assert set(consumes["counters"]) == {*(memory_slice_counter(i) for i in range(8)), COMPUTE_SLICES_COUNTER}


def _consumption(device: dict[str, Any]) -> dict[str, int]:
    (consumes,) = device["consumesCounters"]
    return {k: int(v["value"]) for k, v in consumes["counters"].items()}


def _fits(devices: tuple[dict[str, Any], ...], available: dict[str, int]) -> bool:
    used: dict[str, int] = {}
    for d in devices:
        for k, v in _consumption(d).items():
            used[k] = used.get(k, 0) + v
    return all(used[k] <= available[k] for k in used)


@pytest.mark.parametrize("model", [m.key for m in MODELS])
def test_counters_admit_exactly_the_non_overlapping_placements(model: str) -> None:
    """Every pair and triple of placements the counters allow is a valid MIG layout, and
    every valid pair is allowed: the scheduler can neither overlap nor over-allocate."""
    published = build_gpu_devices(dynamic_gpu(0, model))
    available = {k: int(v["value"]) for k, v in published.counter_sets[0]["counters"].items()}
    for size in (2, 3):
        for combo in itertools.combinations(published.devices, size):
            spans = [set(range(attr(d, "migStart"), attr(d, "migStart") + attr(d, "migSize"))) for d in combo]
            overlap = any(a & b for a, b in itertools.combinations(spans, 2))
            media = sum(attr(d, "migProfile").endswith("+me") for d in combo)
            compute = sum(model_by_key(model).profile(attr(d, "migProfile")).compute_slices for d in combo)
            valid = not overlap and media <= 1 and compute <= 7
            assert _fits(combo, available) == valid, [d["name"] for d in combo]


def test_dynamic_mig_leaves_out_placements_over_a_fixed_instance() -> None:
    fixed = instance("H100-80GB", "3g.40gb", 4, gi=9)
    made_for_claim = instance("H100-80GB", "1g.10gb", 0, gi=10, dynamic=True)
    published = build_gpu_devices(dynamic_gpu(0, mig_instances=[fixed, made_for_claim]))
    for device in published.devices:
        assert attr(device, "migStart") + attr(device, "migSize") <= 4, device["name"]
    # The instance made for a claim does not hide its own placement.
    assert "gpu-0-dyn-1g-10gb-0" in {d["name"] for d in published.devices}


def test_dynamic_mig_on_a_gpu_without_mig_profiles_publishes_nothing_and_says_why() -> None:
    g = dynamic_gpu(0).model_copy(update={"model": None, "product_name": "NVIDIA L4"})
    published = build_gpu_devices(g)
    assert published.devices == ()
    assert published.counter_sets == ()
    assert "no known MIG profiles" in published.problems[0]


@pytest.mark.parametrize("health", [Health.UNHEALTHY, Health.LOST])
def test_unhealthy_gpu_taints_every_device_no_schedule(health: Health) -> None:
    for g in (gpu(0, health=health), mig_gpu(0, health=health), dynamic_gpu(0, health=health)):
        devices = build_gpu_devices(g).devices
        assert devices
        for device in devices:
            assert device["taints"] == [{"key": UNHEALTHY_TAINT_KEY, "value": health.value, "effect": "NoSchedule"}]


def test_taint_goes_when_the_gpu_recovers() -> None:
    sick = build_gpu_devices(mig_gpu(0, health=Health.UNHEALTHY)).devices
    well = build_gpu_devices(mig_gpu(0)).devices
    assert all("taints" in d for d in sick)
    assert all("taints" not in d for d in well)


def test_draining_a_gpu_taints_all_its_devices_and_no_other_gpu() -> None:
    target, other = mig_gpu(0), mig_gpu(1)
    drained = build_gpu_devices(target, draining={target.uuid}).devices
    assert all(d["taints"] == [{"key": DRAIN_TAINT_KEY, "effect": "NoSchedule"}] for d in drained)
    assert all("taints" not in d for d in build_gpu_devices(other, draining={target.uuid}).devices)


def test_draining_one_device_by_name_or_mig_uuid_taints_only_it() -> None:
    g = mig_gpu(0)
    by_name = build_gpu_devices(g, draining={"gpu-0-mig-2g-20gb-4"}).devices
    assert [d["name"] for d in by_name if "taints" in d] == ["gpu-0-mig-2g-20gb-4"]
    by_uuid = build_gpu_devices(g, draining={g.mig_instances[0].uuid}).devices
    assert [d["name"] for d in by_uuid if "taints" in d] == ["gpu-0-mig-3g-40gb-0"]


def test_draining_and_unhealthy_together_carry_both_taints_sorted() -> None:
    g = gpu(0, health=Health.UNHEALTHY)
    (device,) = build_gpu_devices(g, draining={g.uuid}).devices
    assert [t["key"] for t in device["taints"]] == sorted([DRAIN_TAINT_KEY, UNHEALTHY_TAINT_KEY])


@pytest.mark.parametrize("model", [m.key for m in MODELS])
def test_every_device_of_every_strategy_passes_the_device_rules(model: str) -> None:
    gpus = [
        gpu(0, model=model),
        mig_gpu(1, model),
        mig_gpu(2, model, sharing=ShareStrategy.MPS),
        mig_gpu(3, model, sharing=ShareStrategy.TIME_SLICING),
        time_sliced_gpu(4, model=model),
        mps_gpu(5, model=model, values=[5, 25, 100]),
        dynamic_gpu(6, model, health=Health.UNHEALTHY),
    ]
    for g in gpus:
        for device in build_gpu_devices(g, draining={g.uuid}).devices:
            assert validate_device(device) == []
            assert len(device["attributes"]) + len(device["capacity"]) <= 32


@pytest.mark.parametrize("status", every_strategy(), ids=lambda g: g.strategy.value)
def test_every_device_says_whether_a_policy_manages_its_gpu(status: GpuStatus) -> None:
    unmanaged = build_gpu_devices(status.model_copy(update={"policy": None})).devices
    managed = build_gpu_devices(status.model_copy(update={"policy": "p"})).devices

    assert unmanaged, "an unmanaged GPU is still published as it is"
    assert {d["attributes"]["managed"]["bool"] for d in unmanaged} == {False}
    assert {d["attributes"]["managed"]["bool"] for d in managed} == {True}
