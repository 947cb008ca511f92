"""ResourceSlices of one node's pool (tessera.dra.slices), held to the apiserver's rules."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from tessera import DRIVER_NAME
from tessera.dra.devices import GpuDevices, build_gpu_devices
from tessera.dra.slices import (
    NodeRef,
    build_node_slices,
    build_slices_from_devices,
    published_device_count,
    slice_name,
)
from tessera.models.catalog import MODELS
from tessera.models.layout import Health, NodeLayoutStatus
from tests.dra_gpus import NODE_UID, dynamic_gpu, every_strategy, gpu, mig_gpu
from tests.dra_limits import validate_pool

NODE = NodeRef("gpu-node-1", NODE_UID)


def names(slices: list[dict[str, Any]]) -> list[str]:
    return [s["metadata"]["name"] for s in slices]


def test_a_nodes_gpus_share_one_slice_and_dynamic_mig_counters_get_their_own() -> None:
    gpus = [gpu(0), mig_gpu(1), dynamic_gpu(2)]
    slices = build_node_slices(NODE, gpus)
    assert names(slices) == ["gpu-node-1-tessera-counters", "gpu-node-1-tessera-gpus"]
    counters, devices = (s["spec"] for s in slices)
    assert "devices" not in counters
    assert [c["name"] for c in counters["sharedCounters"]] == ["gpu-2"]
    assert "sharedCounters" not in devices
    assert [d["name"] for d in devices["devices"]] == [d["name"] for g in gpus for d in build_gpu_devices(g).devices]


def test_slices_name_the_driver_the_node_pool_and_the_owner() -> None:
    slices = build_node_slices(NODE, [gpu(0), dynamic_gpu(1)])
    for s in slices:
        assert s["apiVersion"] == "resource.k8s.io/v1"
        assert s["kind"] == "ResourceSlice"
        spec = s["spec"]
        assert spec["driver"] == DRIVER_NAME == "gpu.tessera.dev"
        assert spec["nodeName"] == "gpu-node-1"
        assert spec["pool"] == {"name": "gpu-node-1", "generation": 0, "resourceSliceCount": 2}
        assert s["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tessera"}
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": NODE_UID, "controller": True}
        ]


def test_gpus_with_no_devices_keep_one_empty_slice() -> None:
    empty_mig = [gpu(i, strategy=mig_gpu(0).strategy, mig_mode_current=True) for i in range(2)]
    (s,) = build_node_slices(NODE, empty_mig)
    assert s["metadata"]["name"] == "gpu-node-1-tessera-gpus"
    assert "devices" not in s["spec"]
    assert validate_pool([s]) == []


def test_no_status_or_no_gpus_means_no_slices() -> None:
    assert build_node_slices(NODE, None) == []
    assert build_node_slices(NODE, NodeLayoutStatus()) == []


def test_node_layout_status_and_a_gpu_list_build_the_same_slices() -> None:
    gpus = every_strategy()
    assert build_node_slices(NODE, NodeLayoutStatus(gpus=gpus)) == build_node_slices(NODE, gpus)


def test_two_builds_are_byte_identical_whatever_the_input_order() -> None:
    gpus = every_strategy()
    first = json.dumps(build_node_slices(NODE, gpus, draining=[gpus[1].uuid, "gpu-2-mig-1g-10gb-6"]))
    second = json.dumps(build_node_slices(NODE, list(reversed(gpus)), draining=["gpu-2-mig-1g-10gb-6", gpus[1].uuid]))
    assert first == second


def test_output_is_sorted_and_devices_keep_their_gpus_packing_order() -> None:
    gpus = every_strategy()
    slices = build_node_slices(NODE, gpus)
    assert names(slices) == sorted(names(slices))
    packing_order = [d["name"] for g in gpus for d in build_gpu_devices(g).devices]
    for s in slices:
        devices = [d["name"] for d in s["spec"].get("devices", [])]
        assert devices == [n for n in packing_order if n in devices]
        for d in s["spec"].get("devices", []):
            assert list(d["attributes"]) == sorted(d["attributes"])
            assert list(d["capacity"]) == sorted(d["capacity"])


@pytest.mark.parametrize("model", [m.key for m in MODELS])
def test_built_slices_pass_every_limit_the_apiserver_enforces(model: str) -> None:
    gpus = every_strategy(model)
    slices = build_node_slices(NODE, gpus, draining={g.uuid for g in gpus[:4]})
    assert validate_pool(slices) == []
    assert published_device_count(slices) > 0


def test_draining_and_health_taints_keep_dynamic_mig_within_64_devices() -> None:
    slices = build_node_slices(NODE, [dynamic_gpu(0, health=Health.LOST)], draining={dynamic_gpu(0).uuid})
    devices = slices[1]["spec"]["devices"]
    assert len(devices) == 25
    assert all(len(d["taints"]) == 2 for d in devices)
    assert validate_pool(slices) == []


def _plain_device(gpu_index: int, i: int, taint: bool = False) -> dict[str, Any]:
    device: dict[str, Any] = {"name": f"gpu-{gpu_index}-d-{i:03d}", "attributes": {"type": {"string": "gpu"}}}
    if taint:
        device["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    return device


def _plain_gpu(index: int, count: int, taint: bool = False) -> GpuDevices:
    return GpuDevices(index, f"GPU-{index}", tuple(_plain_device(index, i, taint) for i in range(count)))


def test_eight_dynamic_mig_gpus_fill_four_device_slices_two_gpus_each_and_one_counter_slice() -> None:
    gpus = [dynamic_gpu(i) for i in range(8)]
    slices = build_node_slices(NODE, gpus)
    assert names(slices) == [
        "gpu-node-1-tessera-counters",
        "gpu-node-1-tessera-gpus",
        "gpu-node-1-tessera-gpus-01",
        "gpu-node-1-tessera-gpus-02",
        "gpu-node-1-tessera-gpus-03",
    ]
    assert [c["name"] for c in slices[0]["spec"]["sharedCounters"]] == [f"gpu-{i}" for i in range(8)]
    per_slice = [{d["name"].split("-dyn-")[0] for d in s["spec"]["devices"]} for s in slices[1:]]
    assert per_slice == [{"gpu-0", "gpu-1"}, {"gpu-2", "gpu-3"}, {"gpu-4", "gpu-5"}, {"gpu-6", "gpu-7"}]
    assert validate_pool(slices) == []


def test_a_ninth_counter_set_starts_a_second_counter_slice() -> None:
    slices = build_node_slices(NODE, [dynamic_gpu(i) for i in range(9)])
    counters = [s for s in slices if "sharedCounters" in s["spec"]]
    assert names(counters) == ["gpu-node-1-tessera-counters", "gpu-node-1-tessera-counters-01"]
    assert [len(s["spec"]["sharedCounters"]) for s in counters] == [8, 1]
    assert validate_pool(slices) == []


def test_a_drain_taint_changes_one_slice_and_no_slice_name() -> None:
    gpus = [dynamic_gpu(i) for i in range(8)]
    plain = build_node_slices(NODE, gpus)
    drained = build_node_slices(NODE, gpus, draining={gpus[3].uuid})
    assert names(drained) == names(plain)
    assert [n for n, a, b in zip(names(plain), plain, drained, strict=True) if a != b] == ["gpu-node-1-tessera-gpus-01"]
    assert validate_pool(drained) == []


def test_devices_follow_the_gpu_index_in_number_order_across_slices() -> None:
    gpus = [_plain_gpu(i, 20) for i in reversed(range(12))]
    slices = build_slices_from_devices(NODE, gpus)
    listed = [d["name"] for s in slices for d in s["spec"]["devices"]]  # slices by name, devices as listed
    assert listed == [f"gpu-{g}-d-{i:03d}" for g in range(12) for i in range(20)]
    assert [len(s["spec"]["devices"]) for s in slices] == [60, 60, 60, 60], "three whole GPUs a slice"


def test_a_gpu_that_does_not_fit_the_current_slice_starts_the_next_one_whole() -> None:
    slices = build_slices_from_devices(NODE, [_plain_gpu(0, 40), _plain_gpu(1, 30), _plain_gpu(2, 20)])
    assert [len(s["spec"]["devices"]) for s in slices] == [40, 50]


def test_a_gpu_with_more_devices_than_a_slice_holds_continues_in_numbered_slices() -> None:
    slices = build_slices_from_devices(NODE, [_plain_gpu(0, 10), _plain_gpu(1, 300)])
    assert names(slices) == ["gpu-node-1-tessera-gpus"] + [f"gpu-node-1-tessera-gpus-{i:02d}" for i in range(1, 6)]
    assert [len(s["spec"]["devices"]) for s in slices] == [10, 64, 64, 64, 64, 44]
    assert validate_pool(slices) == []


def test_untainted_devices_stay_at_64_a_slice_so_a_taint_never_reshapes_the_pool() -> None:
    untainted = build_slices_from_devices(NODE, [_plain_gpu(0, 100)])
    tainted = build_slices_from_devices(NODE, [_plain_gpu(0, 100, taint=True)])
    assert [len(s["spec"]["devices"]) for s in untainted] == [len(s["spec"]["devices"]) for s in tainted] == [64, 36]
    assert validate_pool(tainted) == []


def test_random_nodes_list_every_device_in_order_and_start_a_slice_only_for_a_gpu_that_does_not_fit() -> None:
    rng = random.Random(22)
    for _ in range(300):
        counts = [rng.choice([0, 1, 3, 7, 8, 25, 40, 63, 64, 65, 130]) for _ in range(rng.randint(1, 16))]
        gpus = [_plain_gpu(i, n) for i, n in enumerate(counts)]
        rng.shuffle(gpus)
        slices = build_slices_from_devices(NODE, gpus)
        assert validate_pool(slices) == []
        chunks = [[d["name"] for d in s["spec"].get("devices", [])] for s in slices]
        assert [n for c in chunks for n in c] == [f"gpu-{g}-d-{i:03d}" for g, n in enumerate(counts) for i in range(n)]
        assert all(len(c) <= 64 for c in chunks)
        gpu_of = {n: int(n.split("-")[1]) for c in chunks for n in c}
        for before, chunk in itertools.pairwise(chunks):
            first = gpu_of[chunk[0]]
            if before and gpu_of[before[-1]] != first:  # a GPU starts this slice: it did not fit the last one
                assert len(before) + counts[first] > 64
        for g, n in enumerate(counts):
            holding = [i for i, c in enumerate(chunks) if any(gpu_of[x] == g for x in c)]
            if 0 < n <= 64:
                assert len(holding) == 1, f"GPU {g} of {n} devices split over slices {holding}"


def test_more_slices_than_two_digits_can_number_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="more than 100 slices"):
        build_slices_from_devices(NODE, [_plain_gpu(0, 64 * 100 + 1)])


def test_slice_names_stay_within_253_characters_and_stay_distinct() -> None:
    long_a = ("a" * 60 + ".") * 4 + "x"
    long_b = ("a" * 60 + ".") * 4 + "y"
    a, b = slice_name(long_a, "tessera-counters-01"), slice_name(long_b, "tessera-counters-01")
    assert len(a) <= 253
    assert len(b) <= 253
    assert a != b
    assert a.endswith("-tessera-counters-01")
    assert slice_name("short", "tessera-gpus") == "short-tessera-gpus"


def test_long_node_names_still_build_valid_slices() -> None:
    node = NodeRef(("n" * 62 + ".") * 3 + "n" * 62, NODE_UID)
    assert len(node.name) == 251
    assert validate_pool(build_node_slices(node, [dynamic_gpu(0)])) == []
