"""ResourceSlices of one node's pool (tessera.dra.slices), held to the apiserver's rules."""

from __future__ import annotations

import json
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


def test_each_gpu_gets_its_own_slice_and_dynamic_mig_a_counter_slice() -> None:
    slices = build_node_slices(NODE, [gpu(0), mig_gpu(1), dynamic_gpu(2)])
    assert names(slices) == [
        "gpu-node-1-tessera-gpu-0",
        "gpu-node-1-tessera-gpu-1",
        "gpu-node-1-tessera-gpu-2",
        "gpu-node-1-tessera-gpu-2-counters",
    ]
    counters = slices[-1]["spec"]
    assert "devices" not in counters
    assert [c["name"] for c in counters["sharedCounters"]] == ["gpu-2"]
    assert all("sharedCounters" not in s["spec"] for s in slices[:-1])


def test_slices_name_the_driver_the_node_pool_and_the_owner() -> None:
    slices = build_node_slices(NODE, [gpu(0), dynamic_gpu(1)])
    for s in slices:
        assert s["apiVersion"] == "resource.k8s.io/v1"
        assert s["kind"] == "ResourceSlice"
        spec = s["spec"]
        assert spec["driver"] == DRIVER_NAME == "gpu.tessera.dev"
        assert spec["nodeName"] == "gpu-node-1"
        assert spec["pool"] == {"name": "gpu-node-1", "generation": 0, "resourceSliceCount": 3}
        assert s["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tessera"}
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": NODE_UID, "controller": True}
        ]


def test_a_gpu_with_no_devices_keeps_an_empty_slice() -> None:
    empty_mig = gpu(0, strategy=mig_gpu(0).strategy, mig_mode_current=True)
    (s,) = build_node_slices(NODE, [empty_mig])
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
    devices = slices[0]["spec"]["devices"]
    assert len(devices) == 25
    assert all(len(d["taints"]) == 2 for d in devices)
    assert validate_pool(slices) == []


def _plain_device(i: int, taint: bool = False) -> dict[str, Any]:
    device: dict[str, Any] = {"name": f"d-{i:03d}", "attributes": {"type": {"string": "gpu"}}}
    if taint:
        device["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    return device


def test_more_devices_than_a_slice_holds_continue_in_numbered_parts() -> None:
    many = GpuDevices(0, "GPU-x", tuple(_plain_device(i) for i in range(300)))
    slices = build_slices_from_devices(NODE, [many])
    assert names(slices) == [
        "gpu-node-1-tessera-gpu-0",
        "gpu-node-1-tessera-gpu-0-part-1",
        "gpu-node-1-tessera-gpu-0-part-2",
    ]
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert validate_pool(slices) == []


def test_a_tainted_device_lowers_its_slice_to_64_devices() -> None:
    many = GpuDevices(0, "GPU-x", tuple(_plain_device(i, taint=i == 10) for i in range(100)))
    slices = build_slices_from_devices(NODE, [many])
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 36]
    assert validate_pool(slices) == []


def test_slice_names_stay_within_253_characters_and_stay_distinct() -> None:
    long_a = ("a" * 60 + ".") * 4 + "x"
    long_b = ("a" * 60 + ".") * 4 + "y"
    a, b = slice_name(long_a, "tessera-gpu-7-counters"), slice_name(long_b, "tessera-gpu-7-counters")
    assert len(a) <= 253
    assert len(b) <= 253
    assert a != b
    assert a.endswith("-tessera-gpu-7-counters")
    assert slice_name("short", "tessera-gpu-0") == "short-tessera-gpu-0"


def test_long_node_names_still_build_valid_slices() -> None:
    node = NodeRef(("n" * 62 + ".") * 3 + "n" * 62, NODE_UID)
    assert len(node.name) == 251
    assert validate_pool(build_node_slices(node, [dynamic_gpu(0)])) == []
