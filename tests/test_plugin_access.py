"""The prepare step's pure builders (tessera.agent.plugin.access): a claim's status.devices
entries, and the checkpoint records of a claim planned, prepared or rebuilt from its CDI spec,
built from values alone with no GPU, file or API."""

from __future__ import annotations

import pytest

from tessera.agent.backends.base import GpuInfo, Inventory, MigInstanceInfo
from tessera.agent.plugin.access import (
    DeviceAccess,
    build_cdi_devices,
    device_status_entries,
    find_gpu,
    planned_claim,
    prepared_claim,
    recovered_device,
)
from tessera.agent.plugin.cdi import qualified_device_id
from tessera.agent.plugin.checkpoint import ClaimState, DynamicInstance
from tessera.agent.plugin.claims import AllocatedDevice, ClaimError, ClaimRef
from tessera.models.devices import parse_device_name

REF = ClaimRef(namespace="ns", name="c", uid="uid-1")
NOW = "2026-12-04T15:00:00Z"
INSTANCE = MigInstanceInfo(gpu_instance_id=3, profile="3g.40gb", profile_id=9, start=4, size=4, memory_mib=40448,
                           multiprocessors=60, compute_instance_id=0, uuid="MIG-3g", in_use=True)
GPU = GpuInfo(uuid="GPU-0", index=0, product_name="NVIDIA H100 80GB HBM3", memory_mib=81559, minor=0,
              instances=(INSTANCE,))
INVENTORY = Inventory(gpus=(GPU,), driver_version="580.95.05")


def allocated(device: str, share_id: str | None = None, consumed_capacity: dict[str, str] | None = None,
              admin_access: bool = False) -> AllocatedDevice:
    return AllocatedDevice(request="gpu", pool="node-1", device=device, ref=parse_device_name(device),
                           share_id=share_id, consumed_capacity=consumed_capacity or {}, admin_access=admin_access)


def test_status_entries_say_what_each_container_got_with_limits_and_share_ids() -> None:
    mps = DeviceAccess(allocated("gpu-0-mig-3g-40gb-4", share_id="s-1", consumed_capacity={"compute": "25",
                                                                                          "memory": "10Gi"}),
                       gpu_uuid="GPU-0", device_uuid="MIG-3g", device_nodes=(), mps_pipe_directory="/run/mps")
    watch = DeviceAccess(allocated("gpu-0", admin_access=True), gpu_uuid="GPU-0", device_uuid="GPU-0",
                         device_nodes=())
    first, second = device_status_entries("gpu.tessera.dev", [mps, watch], "580.95.05", NOW)

    assert first["shareID"] == "s-1"
    assert first["data"] == {"uuid": "MIG-3g", "gpuUUID": "GPU-0", "migProfile": "3g.40gb",
                             "mps": {"activeThreadPercentage": 25, "pinnedDeviceMemoryMiB": 10240},
                             "driverVersion": "580.95.05"}
    assert first["conditions"][0]["lastTransitionTime"] == NOW
    assert (first["conditions"][0]["type"], first["conditions"][0]["status"]) == ("Ready", "True")
    assert second["data"]["adminAccess"] is True
    assert "mps" not in second["data"], "a monitoring claim gets no MPS limits"
    assert "shareID" not in second


def test_a_planned_claim_records_every_dynamic_placement_before_anything_is_made() -> None:
    devices = [allocated("gpu-0-dyn-1g-10gb-2"), allocated("gpu-0")]
    planned = planned_claim(REF, devices, INVENTORY)

    assert planned.state is ClaimState.PREPARING
    assert [d.dynamic for d in planned.devices] == [
        DynamicInstance(gpu_uuid="GPU-0", profile="1g.10gb", start=2), None
    ]
    assert {d.gpu_uuid for d in planned.devices} == {"GPU-0"}


def test_a_planned_claim_on_a_gpu_the_node_lacks_is_refused_with_the_device_named() -> None:
    with pytest.raises(ClaimError, match="gpu-7"):
        planned_claim(REF, [allocated("gpu-7")], INVENTORY)
    with pytest.raises(ClaimError, match="no GPU with index 7"):
        find_gpu(INVENTORY, parse_device_name("gpu-7"), "gpu-7")


def test_a_prepared_claim_ties_each_device_to_its_cdi_id_and_the_instance_made_for_it() -> None:
    made = DynamicInstance(gpu_uuid="GPU-0", profile="3g.40gb", start=4, gpu_instance_id=3, uuid="MIG-3g")
    accesses = [
        DeviceAccess(allocated("gpu-0-dyn-3g-40gb-4"), gpu_uuid="GPU-0", device_uuid="MIG-3g", device_nodes=()),
        DeviceAccess(allocated("gpu-0", admin_access=True), gpu_uuid="GPU-0", device_uuid="GPU-0", device_nodes=()),
    ]
    cdi_devices, _ = build_cdi_devices(REF.uid, accesses)
    prepared = prepared_claim(REF, accesses, cdi_devices, [made])

    assert prepared.state is ClaimState.PREPARED
    assert [d.cdi_device_id for d in prepared.devices] == [qualified_device_id(c.name) for c in cdi_devices]
    assert [d.dynamic for d in prepared.devices] == [made, None]
    assert [d.admin_access for d in prepared.devices] == [False, True]
    assert prepared.device_uuids >= {"MIG-3g"}


def test_a_device_rebuilt_from_a_cdi_spec_finds_its_instance_on_the_gpu() -> None:
    static = recovered_device("uid-1", "gpu-0-mig-3g-40gb-4", parse_device_name("gpu-0-mig-3g-40gb-4"), GPU, "n")
    assert (static.device_uuid, static.dynamic) == ("MIG-3g", None)

    gone = recovered_device("uid-1", "gpu-0-dyn-1g-10gb-0", parse_device_name("gpu-0-dyn-1g-10gb-0"), GPU, "n")
    assert gone.device_uuid == "", "no instance there any more: nothing to hold"
    assert gone.dynamic == DynamicInstance(gpu_uuid="GPU-0", profile="1g.10gb", start=0)
