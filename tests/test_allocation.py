"""What a ResourceClaim holds of one driver's devices: the rules every caller shares (driver and
pool filter, admin access holds nothing, a shareID marks one of several allocations), tested once
here for ``tessera.models.allocation``; its callers' tests check only what they add."""

from __future__ import annotations

from typing import Any

from tessera.models.allocation import AllocatedResult, allocation_results, claim_key, held_devices

GPU = "gpu.tessera.dev"
NIC = "nic.tessera.dev"


def claim(*results: dict[str, Any], name: str = "c") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": "u"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, *, driver: str = GPU, pool: str = "node-a", **extra: Any) -> dict[str, Any]:
    return {"request": "r", "driver": driver, "pool": pool, "device": device, **extra}


def test_only_the_asked_drivers_results_with_a_device_count_in_allocation_order() -> None:
    body = claim(
        result("gpu-1"),
        result("eth-0", driver=NIC),
        {"request": "r", "driver": GPU, "pool": "node-a"},  # no device name: nothing to hold
        result("gpu-0", pool="node-b"),
    )

    assert [r.key for r in allocation_results(body, GPU)] == [("node-a", "gpu-1"), ("node-b", "gpu-0")]
    assert [r.key for r in allocation_results(body, NIC)] == [("node-a", "eth-0")], "the driver is a parameter"
    assert [r.device for r in allocation_results(body, GPU, pool="node-b")] == ["gpu-0"]


def test_an_admin_access_result_holds_nothing_but_is_there_when_asked_for() -> None:
    body = claim(result("gpu-0", adminAccess=True), result("gpu-1"), result("gpu-2", adminAccess=False))

    assert held_devices(body, GPU) == {("node-a", "gpu-1"), ("node-a", "gpu-2")}
    every = allocation_results(body, GPU, include_admin_access=True)
    assert [(r.device, r.admin_access) for r in every] == [("gpu-0", True), ("gpu-1", False), ("gpu-2", False)]


def test_a_share_id_marks_one_of_several_allocations_and_carries_its_consumed_capacity() -> None:
    body = claim(
        result("gpu-0", shareID="7f1c", consumedCapacity={"gpu.tessera.dev/memory": "4Gi"}),
        result("gpu-1", shareID=""),
    )

    shared, whole = allocation_results(body, GPU)

    assert shared == AllocatedResult(
        driver=GPU, pool="node-a", device="gpu-0", request="r", share_id="7f1c",
        consumed_capacity={"gpu.tessera.dev/memory": "4Gi"},
    )
    assert shared.shared
    assert not whole.shared, "an empty shareID is no share"


def test_an_unallocated_or_empty_claim_holds_nothing() -> None:
    for body in ({}, {"status": None}, {"status": {"allocation": None}}, claim()):
        assert allocation_results(body, GPU) == []
        assert held_devices(body, GPU) == frozenset()
    assert claim_key(claim(name="train")) == "ns/train"
