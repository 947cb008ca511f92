"""CDI content for prepared claims: names, the lowest cdiVersion a spec needs, what each
request's devices share, and spec files that appear and vanish whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.agent.plugin.access import DeviceAccess, build_cdi_devices, mps_limits
from tessera.agent.plugin.cdi import (
    CDI_KIND,
    CdiDevice,
    ContainerEdits,
    Mount,
    claim_spec,
    claim_uid_of_spec_file,
    minimum_cdi_version,
    qualified_device_id,
    read_claim_specs,
    remove_claim_spec,
    spec_device_names,
    spec_file_name,
    write_claim_spec,
)
from tessera.agent.plugin.claims import AllocatedDevice, ClaimError
from tessera.models.devices import parse_device_name

UID = "5f0c3a4e-1d2b-4c5d-8e9f-0a1b2c3d4e5f"


def access(device: str, uuid: str, request: str = "gpu", pipe: str | None = None, **consumed: str) -> DeviceAccess:
    allocated = AllocatedDevice(request=request, pool="n", device=device, ref=parse_device_name(device),
                                consumed_capacity=consumed)
    return DeviceAccess(allocated, gpu_uuid="GPU-parent", device_uuid=uuid,
                        device_nodes=(f"/dev/nvidia{device[4]}",), mps_pipe_directory=pipe)


def env(device: CdiDevice) -> dict[str, str]:
    return dict(e.split("=", 1) for e in device.edits.env)


def test_names_follow_nvidias_layout() -> None:
    assert spec_file_name(UID) == f"k8s.gpu.tessera.dev-claim_{UID}.json"
    assert claim_uid_of_spec_file(spec_file_name(UID)) == UID
    assert claim_uid_of_spec_file("nvidia.yaml") is None
    assert claim_uid_of_spec_file(f".k8s.gpu.tessera.dev-claim_{UID}.json.1a2b.tmp") is None
    assert qualified_device_id(f"{UID}-gpu-0") == f"k8s.gpu.tessera.dev/claim={UID}-gpu-0"


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        ({"kind": CDI_KIND, "devices": [{"name": "gpu-0", "containerEdits": {}}]}, "0.3.0"),
        ({"kind": CDI_KIND, "devices": [{"name": "5f0c-gpu-0", "containerEdits": {}}]}, "0.5.0"),
        ({"kind": CDI_KIND, "devices": [{"name": "a", "containerEdits": {"mounts": [{"type": "bind"}]}}]}, "0.4.0"),
        ({"kind": CDI_KIND, "devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"hostPath": "/x"}]}}]},
         "0.5.0"),
        ({"kind": "vendor.com/class.sub", "devices": [{"name": "a", "containerEdits": {}}]}, "0.6.0"),
        ({"kind": CDI_KIND, "annotations": {"a": "b"}, "devices": [{"name": "a", "containerEdits": {}}]}, "0.6.0"),
    ],
    ids=["plain", "name-starts-with-digit", "mount-type", "device-host-path", "dotted-class", "annotations"],
)
def test_cdi_version_is_the_lowest_that_allows_what_the_spec_uses(spec: dict[str, object], version: str) -> None:
    assert minimum_cdi_version(spec) == version


def test_claim_spec_sorts_devices_and_puts_shared_edits_once() -> None:
    spec = claim_spec(
        [CdiDevice("b-dev", ContainerEdits(env=("A=1",))), CdiDevice("a-dev")],
        ContainerEdits(device_nodes=("/dev/nvidiactl",)),
    )
    assert [d["name"] for d in spec["devices"]] == ["a-dev", "b-dev"]
    assert spec["devices"][0]["containerEdits"] == {}
    assert spec["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidiactl"}]}
    assert spec["cdiVersion"] == "0.3.0"


def test_devices_of_one_request_make_each_other_visible_and_requests_stay_apart() -> None:
    devices, common = build_cdi_devices(UID, [
        access("gpu-0", "GPU-a", "train"), access("gpu-1", "GPU-b", "train"), access("gpu-2", "GPU-c", "infer"),
    ])
    assert [d.name for d in devices] == [f"{UID}-gpu-0", f"{UID}-gpu-1", f"{UID}-gpu-2"]
    assert env(devices[0])["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env(devices[1]) == env(devices[0])
    assert env(devices[2])["NVIDIA_VISIBLE_DEVICES"] == "GPU-c"
    assert devices[1].edits.device_nodes == ("/dev/nvidia1",)
    assert common.device_nodes == ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def test_a_device_shared_twice_by_one_claim_gets_two_cdi_names() -> None:
    devices, _ = build_cdi_devices(UID, [
        access("gpu-1", "GPU-a", "small", "/run/mps/a", compute="10"),
        access("gpu-1", "GPU-a", "big", "/run/mps/a", compute="50"),
    ])
    assert [d.name for d in devices] == [f"{UID}-gpu-1", f"{UID}-gpu-1-2"]
    assert env(devices[0])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
    assert env(devices[1])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_mps_limits_for_a_request_list_every_device_and_the_smallest_thread_share() -> None:
    devices, _ = build_cdi_devices(UID, [
        access("gpu-0-mig-3g-40gb-0", "MIG-a", "gpu", "/run/mps/x", compute="30", memory="4Gi"),
        access("gpu-0-mig-3g-40gb-4", "MIG-b", "gpu", "/run/mps/x", compute="20", memory="1536Mi"),
    ])
    assert env(devices[0])["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "MIG-a=4096M,MIG-b=1536M"
    assert env(devices[0])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert devices[0].edits.mounts == (Mount("/run/mps/x", "/tmp/nvidia-mps"),)


def test_one_request_cannot_span_two_mps_servers() -> None:
    with pytest.raises(ClaimError, match="one MPS server only"):
        build_cdi_devices(UID, [
            access("gpu-0", "GPU-a", "gpu", "/run/mps/a", compute="10"),
            access("gpu-1", "GPU-b", "gpu", "/run/mps/b", compute="10"),
        ])


@pytest.mark.parametrize(
    ("consumed", "message"),
    [({"compute": "0"}, "1..100 percent"), ({"compute": "150"}, "1..100 percent"),
     ({"memory": "512Ki"}, "at least 1Mi"), ({"memory": "lots"}, "not a quantity")],
)
def test_consumed_capacity_that_cannot_be_a_limit_is_refused(consumed: dict[str, str], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        mps_limits(consumed)


def test_memory_limits_round_down_to_whole_mib() -> None:
    assert mps_limits({"memory": "10Gi", "compute": "25"}).pinned_memory_mib == 10240
    assert mps_limits({"memory": "1000000000"}).pinned_memory_mib == 953


def test_spec_files_are_written_whole_and_removed(tmp_path: Path) -> None:
    devices, common = build_cdi_devices(UID, [access("gpu-0", "GPU-a")])
    spec = claim_spec(devices, common)
    path = write_claim_spec(tmp_path, UID, spec)
    write_claim_spec(tmp_path, UID, spec)  # replacing is fine
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary files are left"
    assert json.loads(path.read_text()) == spec
    (tmp_path / "nvidia.json").write_text("{}")
    (tmp_path / spec_file_name("broken")).write_text("{not json")
    assert read_claim_specs(tmp_path) == {UID: spec}
    assert spec_device_names(spec, UID) == ["gpu-0"]
    assert remove_claim_spec(tmp_path, UID) is True
    assert remove_claim_spec(tmp_path, UID) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["nvidia.json", spec_file_name("broken")])


def test_simulated_device_nodes_come_from_their_host_folder_at_the_usual_container_paths() -> None:
    devices, common = build_cdi_devices(UID, [access("gpu-1", "GPU-a")], dev_root="/n/a/var-lib-tessera/dev")
    spec = claim_spec(devices, common)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": "/n/a/var-lib-tessera/dev/nvidia1"}
    ]
    assert spec["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidiactl", "hostPath": "/n/a/var-lib-tessera/dev/nvidiactl"
    }
    assert spec["cdiVersion"] == "0.5.0"  # hostPath needs 0.5.0


def test_without_a_dev_root_device_nodes_are_the_hosts_own() -> None:
    devices, common = build_cdi_devices(UID, [access("gpu-1", "GPU-a")])
    assert claim_spec(devices, common)["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1"}]


def test_a_spec_is_written_into_a_cdi_folder_that_a_reboot_left_missing(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "run" / "cdi"  # /var/run is tmpfs: empty after a reboot
    path = write_claim_spec(cdi_dir, "uid-1", claim_spec([]))
    assert path.parent == cdi_dir
    assert path.is_file()
