"""The offline ResourceSlice validators (tests/dra_limits.py) refuse what the apiserver refuses."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tessera.dra.slices import NodeRef, build_node_slices
from tests.dra_gpus import NODE_UID, dynamic_gpu, gpu, mps_gpu, time_sliced_gpu
from tests.dra_limits import validate_device, validate_pool, validate_slice

NODE = NodeRef("n1", NODE_UID)


def _mps_device() -> dict[str, Any]:
    device: dict[str, Any] = build_node_slices(NODE, [mps_gpu(0)])[0]["spec"]["devices"][0]
    return device


def _ts_device() -> dict[str, Any]:
    device: dict[str, Any] = build_node_slices(NODE, [time_sliced_gpu(0)])[0]["spec"]["devices"][0]
    return device


def _set(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(device: dict[str, Any]) -> None:
        target = device
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop_shared(device: dict[str, Any]) -> None:
    del device["allowMultipleAllocations"]


def _many_attributes(device: dict[str, Any]) -> None:
    device["attributes"].update({f"extra{i}": {"int": i} for i in range(30)})


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (_drop_shared, "requestPolicy needs allowMultipleAllocations"),
        (_many_attributes, "attributes and capacities, at most 32"),
        (_set(["name"], "GPU_0"), "DNS label"),
        (_set(["attributes", "bad name!"], {"int": 1}), "not a qualified name"),
        (_set(["attributes", "productName"], {"string": "x" * 65}), "longer than 64"),
        (_set(["attributes", "driverVersion"], {"version": "580.65"}), "not a semantic version"),
        (_set(["attributes", "index"], {"int": 1, "string": "1"}), "exactly one value"),
        (_set(["capacity", "memory", "requestPolicy", "default"], "100Gi"), "default"),
        (_set(["capacity", "memory", "requestPolicy", "validRange", "max"], "200Gi"), "exceeds the capacity"),
        (_set(["capacity", "memory", "requestPolicy", "validRange", "max"], "1536Mi"), "not min plus a whole number"),
        (_set(["capacity", "compute", "requestPolicy"], {"default": "30", "validValues": ["10", "25"]}), "not among"),
        (_set(["capacity", "compute", "requestPolicy"], {"default": "10", "validValues": ["25", "10"]}), "sorted"),
        (
            _set(
                ["capacity", "compute", "requestPolicy"],
                {"default": "1", "validValues": [str(i) for i in range(1, 12)]},
            ),
            "more than 10",
        ),
        (
            _set(["capacity", "compute", "requestPolicy"], {"default": "5", "validRange": {"min": "1", "step": "100"}}),
            "min + step",
        ),
        (_set(["taints"], [{"key": "k", "effect": "PreferNoSchedule"}]), "taint effect"),
    ],
)
def test_device_rules_refuse_what_the_apiserver_refuses(change: Callable[[dict[str, Any]], None], problem: str) -> None:
    device = _mps_device()
    assert validate_device(device) == []
    change(device)
    problems = validate_device(device)
    assert any(problem in p for p in problems), problems


def test_time_sliced_device_is_valid_and_a_policy_without_default_is_not() -> None:
    device = _ts_device()
    assert validate_device(device) == []
    del device["capacity"]["shares"]["requestPolicy"]["default"]
    assert any("default is required" in p for p in validate_device(device))


def test_slice_rules_refuse_devices_with_counters_too_many_devices_and_no_node() -> None:
    (good,) = build_node_slices(NODE, [gpu(0)])
    good["spec"]["pool"]["generation"] = 1
    assert validate_slice(good) == []

    both = copy.deepcopy(good)
    both["spec"]["sharedCounters"] = [{"name": "c", "counters": {"x": {"value": "1"}}}]
    assert any("only one of devices or sharedCounters" in p for p in validate_slice(both))

    crowded = copy.deepcopy(good)
    base = crowded["spec"]["devices"][0]
    crowded["spec"]["devices"] = [{**base, "name": f"gpu-{i}"} for i in range(129)]
    assert any("129 devices, at most 128" in p for p in validate_slice(crowded))
    crowded["spec"]["devices"] = crowded["spec"]["devices"][:65]
    crowded["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert any("65 devices, at most 64" in p for p in validate_slice(crowded))

    nowhere = copy.deepcopy(good)
    del nowhere["spec"]["nodeName"]
    assert any("exactly one of nodeName" in p for p in validate_slice(nowhere))

    uncounted = copy.deepcopy(good)
    uncounted["spec"]["pool"]["resourceSliceCount"] = 0
    assert any("greater than zero" in p for p in validate_slice(uncounted))


def test_counter_rules_refuse_too_many_sets_and_counters() -> None:
    slices = build_node_slices(NODE, [dynamic_gpu(0)])
    counters = slices[0]
    assert "sharedCounters" in counters["spec"]
    counters["spec"]["sharedCounters"] = [
        {"name": f"gpu-{i}", "counters": {f"c-{j}": {"value": "1"} for j in range(33)}} for i in range(9)
    ]
    problems = validate_slice(counters)
    assert any("9 counter sets, at most 8" in p for p in problems)
    assert any("33 counters, at most 32" in p for p in problems)


def test_pool_rules_catch_duplicates_missing_counters_and_mixed_generations() -> None:
    slices = build_node_slices(NODE, [dynamic_gpu(0), dynamic_gpu(1), dynamic_gpu(2)])  # counters, 2 device slices
    assert len(slices) == 3
    assert validate_pool(slices) == []

    no_counters = [s for s in slices if "sharedCounters" not in s["spec"]]
    for s in no_counters:
        s["spec"]["pool"]["resourceSliceCount"] = len(no_counters)
    assert any("undefined counter set" in p for p in validate_pool(no_counters))

    mixed = copy.deepcopy(slices)
    mixed[0]["spec"]["pool"]["generation"] = 7
    assert any("different generations" in p for p in validate_pool(mixed))

    twice = copy.deepcopy(slices)
    twice[2]["spec"]["devices"] = copy.deepcopy(twice[1]["spec"]["devices"][:1])
    assert any("published twice" in p for p in validate_pool(twice))

    miscounted = copy.deepcopy(slices)
    miscounted[0]["spec"]["pool"]["resourceSliceCount"] = 9
    assert any("resourceSliceCount" in p for p in validate_pool(miscounted))
