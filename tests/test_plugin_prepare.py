"""Preparing and unpreparing claims on simulated GPUs: the CDI specs written, the devices held,
dynamic MIG instances made and destroyed, idempotence, concurrency, restarts and failures."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tessera import DRIVER_NAME
from tessera.agent.backends.simulated import SIM_DRIVER_VERSION, SimulatedBackend
from tessera.agent.plugin.cdi import spec_file_name
from tessera.agent.plugin.checkpoint import (
    CheckpointData,
    ClaimState,
    DynamicInstance,
    PreparedClaim,
    PreparedDevice,
    load_checkpoint,
    save_checkpoint,
)
from tessera.agent.plugin.claims import ClaimError, ClaimRef
from tessera.agent.plugin.prepare import ClaimPreparer, PreparerSettings
from tests.plugin_helpers import (
    GPU_SPEC,
    MPS,
    NODE,
    STATIC,
    WHOLE,
    FakeClaimReader,
    PluginDirs,
    claim,
    dynamic,
    gpu,
    make_backend,
    preparer,
    result,
)


@pytest.fixture
def dirs(tmp_path: Path) -> PluginDirs:
    return PluginDirs(tmp_path)


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    b = make_backend()
    yield b
    b.close()


@pytest.fixture
def reader() -> FakeClaimReader:
    return FakeClaimReader()


@pytest.fixture
async def plugin(backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs) -> ClaimPreparer:
    p = preparer(backend, reader, dirs)
    await p.restore()
    return p


def ref(body: dict[str, Any]) -> ClaimRef:
    meta = body["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def spec_of(dirs: PluginDirs, body: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((dirs.cdi / spec_file_name(body["metadata"]["uid"])).read_text())
    return loaded


def env_of(spec: dict[str, Any], device_index: int = 0) -> dict[str, str]:
    env = spec["devices"][device_index]["containerEdits"].get("env", [])
    return dict(e.split("=", 1) for e in env)


def holders(backend: SimulatedBackend, device_uuid: str) -> list[str]:
    return backend.hardware.holders(device_uuid)


# --- what a prepared device gives a container ----------------------------------------------------


async def test_whole_gpu_claim_gets_its_uuid_device_node_and_the_control_nodes(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("whole", result(WHOLE))
    reader.add(body)
    prepared = await plugin.prepare(ref(body))

    uid = body["metadata"]["uid"]
    gpu3 = gpu(backend, 3)
    assert prepared.cdi_device_ids() == [f"k8s.gpu.tessera.dev/claim={uid}-gpu-3"]
    spec = spec_of(dirs, body)
    assert spec["kind"] == "k8s.gpu.tessera.dev/claim"
    assert spec["cdiVersion"] in {"0.3.0", "0.5.0"}
    assert spec["devices"][0]["name"] == f"{uid}-gpu-3"
    assert env_of(spec) == {"NVIDIA_VISIBLE_DEVICES": gpu3.uuid, "CUDA_VISIBLE_DEVICES": gpu3.uuid}
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia3"}]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}
    ]
    assert holders(backend, gpu3.uuid) == [uid]
    assert plugin.in_use_device_uuids() == {gpu3.uuid}


async def test_static_mig_claim_sees_the_mig_uuid_and_the_capability_nodes_the_driver_lists(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    instance = next(i for i in gpu(backend, 0).instances if i.profile == "3g.40gb")
    gi_dir = dirs.proc / "driver/nvidia/capabilities/gpu0/mig" / f"gi{instance.gpu_instance_id}"
    (gi_dir / "ci0").mkdir(parents=True)
    (gi_dir / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (gi_dir / "ci0" / "access").write_text("DeviceFileMinor: 22\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    body = claim("static", result(STATIC))
    reader.add(body)

    await plugin.prepare(ref(body))

    spec = spec_of(dirs, body)
    assert env_of(spec)["CUDA_VISIBLE_DEVICES"] == instance.uuid
    assert env_of(spec)["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
    assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"
    ]
    assert instance.uuid is not None
    assert holders(backend, instance.uuid) == [body["metadata"]["uid"]]
    assert plugin.in_use_gpu_uuids() == {gpu(backend, 0).uuid}


async def test_mps_share_gets_the_pipe_folder_and_the_limits_it_was_allocated(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    gpu1 = gpu(backend, 1)
    body = claim("mps", result(MPS, share_id="share-1", consumed={"memory": "10Gi", "compute": "25"}))
    reader.add(body)

    prepared = await plugin.prepare(ref(body))

    spec = spec_of(dirs, body)
    assert env_of(spec) == {
        "NVIDIA_VISIBLE_DEVICES": gpu1.uuid,
        "CUDA_VISIBLE_DEVICES": gpu1.uuid,
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{gpu1.uuid}=10240M",
    }
    assert spec["devices"][0]["containerEdits"]["mounts"] == [{
        "hostPath": gpu1.mps_pipe_directory, "containerPath": "/tmp/nvidia-mps",
        "options": ["rw", "nosuid", "nodev", "bind"],
    }]
    assert prepared.devices[0].share_id == "share-1"


async def test_an_mps_share_of_a_daemon_run_by_mps_daemons_also_mounts_its_log_folder(
    reader: FakeClaimReader, dirs: PluginDirs, tmp_path: Path
) -> None:
    root = tmp_path / "mps"
    backend = SimulatedBackend.from_spec(NODE, GPU_SPEC, mps_root=str(root), mps_processes=True)
    try:
        gpu1 = gpu(backend, 1)
        backend.start_mps(gpu1.uuid)
        plugin = preparer(backend, reader, dirs)
        await plugin.restore()
        body = claim("mps", result(MPS, share_id="share-1", consumed={"memory": "10Gi", "compute": "25"}))
        reader.add(body)
        await plugin.prepare(ref(body))
        spec = spec_of(dirs, body)
        assert env_of(spec)["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert env_of(spec)["CUDA_MPS_LOG_DIRECTORY"] == "/var/log/nvidia-mps"
        assert [(m["hostPath"], m["containerPath"]) for m in spec["devices"][0]["containerEdits"]["mounts"]] == [
            (str(root / gpu1.uuid / "pipe"), "/tmp/nvidia-mps"), (str(root / gpu1.uuid / "log"), "/var/log/nvidia-mps"),
        ]
        assert (root / gpu1.uuid / "log").is_dir(), "a mount's source must exist, or the runtime refuses the container"
    finally:
        assert backend.daemons is not None
        backend.daemons.kill_all()
        backend.close()


def admin(body: dict[str, Any]) -> dict[str, Any]:
    for r in body["status"]["allocation"]["devices"]["results"]:
        r["adminAccess"] = True
    return body


async def test_an_admin_access_claim_sees_its_devices_without_holding_them_or_mps_limits(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    gpu1, gpu0 = gpu(backend, 1), gpu(backend, 0)
    static = next(i for i in gpu0.instances if (i.profile, i.start) == ("3g.40gb", 0))
    body = admin(claim("monitor", result(MPS, "mps"), result(STATIC, "mig")))
    reader.add(body)

    prepared = await plugin.prepare(ref(body))

    spec = spec_of(dirs, body)
    at = {d["name"].rsplit("-gpu-", 1)[1]: i for i, d in enumerate(spec["devices"])}
    mps_at, mig_at = at["1"], at["0-mig-3g-40gb-0"]
    assert env_of(spec, mps_at) == {"NVIDIA_VISIBLE_DEVICES": gpu1.uuid, "CUDA_VISIBLE_DEVICES": gpu1.uuid}, (
        "the MPS GPU is visible, with no MPS pipe and no limits"
    )
    assert "mounts" not in spec["devices"][mps_at]["containerEdits"]
    assert env_of(spec, mig_at)["NVIDIA_VISIBLE_DEVICES"] == static.uuid
    assert holders(backend, gpu1.uuid) == []
    assert holders(backend, static.uuid or "") == [], "a repartition never waits for a monitoring claim"
    assert plugin.in_use_device_uuids() == frozenset()
    assert [d.admin_access for d in prepared.devices] == [True, True]

    # Across a restart too: the checkpoint remembers the devices are not held.
    again = preparer(backend, reader, dirs)
    await again.restore()
    assert holders(backend, static.uuid or "") == []
    await again.unprepare(ref(body))
    assert not (dirs.cdi / spec_file_name(body["metadata"]["uid"])).exists()


async def test_admin_access_to_a_dynamic_mig_placement_is_refused_and_makes_nothing(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend
) -> None:
    body = admin(claim("monitor-dyn", result(dynamic("1g.10gb", 0))))
    reader.add(body)

    with pytest.raises(ClaimError, match="admin access to a DynamicMIG placement"):
        await plugin.prepare(ref(body))
    assert gpu(backend, 2).instances == ()


async def test_an_mps_share_of_a_mig_instance_uses_that_instances_mps_server(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    instance = next(i for i in gpu(backend, 0).instances if i.profile == "2g.20gb")
    assert instance.uuid is not None
    pipe = backend.start_mps(instance.uuid)
    body = claim("mig-mps", result("gpu-0-mig-2g-20gb-4", share_id="x", consumed={"memory": "5Gi", "compute": "50"}))
    reader.add(body)

    await plugin.prepare(ref(body))

    spec = spec_of(dirs, body)
    assert env_of(spec)["CUDA_VISIBLE_DEVICES"] == instance.uuid
    assert env_of(spec)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{instance.uuid}=5120M"
    assert spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == pipe


async def test_an_mps_share_whose_server_is_down_gets_it_started(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    gpu1 = gpu(backend, 1)
    backend.stop_mps(gpu1.uuid)  # the daemon died after the slice was published
    body = claim("revive", result(MPS, share_id="r", consumed={"memory": "1Gi", "compute": "5"}))
    reader.add(body)

    await plugin.prepare(ref(body))

    assert gpu(backend, 1).mps_pipe_directory is not None
    mounts = spec_of(dirs, body)["devices"][0]["containerEdits"]["mounts"]
    assert mounts[0]["hostPath"] == gpu(backend, 1).mps_pipe_directory


async def test_two_shares_of_one_device_are_both_held_and_released_separately(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend
) -> None:
    gpu1 = gpu(backend, 1)
    a = claim("mps-a", result(MPS, share_id="a", consumed={"memory": "4Gi", "compute": "10"}))
    b = claim("mps-b", result(MPS, share_id="b", consumed={"memory": "8Gi", "compute": "50"}))
    reader.add(a, b)
    await plugin.prepare(ref(a))
    await plugin.prepare(ref(b))
    assert holders(backend, gpu1.uuid) == sorted([a["metadata"]["uid"], b["metadata"]["uid"]])

    await plugin.unprepare(ref(a))

    assert holders(backend, gpu1.uuid) == [b["metadata"]["uid"]]
    assert plugin.in_use_device_uuids() == {gpu1.uuid}


async def test_a_time_sliced_share_gets_visibility_only(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("ts", result(WHOLE, share_id="s", consumed={"shares": "1"}))
    reader.add(body)
    await plugin.prepare(ref(body))
    assert set(env_of(spec_of(dirs, body))) == {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}
    assert "mounts" not in spec_of(dirs, body)["devices"][0]["containerEdits"]


# --- dynamic MIG -------------------------------------------------------------------------------


async def test_dynamic_mig_instance_is_made_at_the_allocated_placement_and_destroyed_on_unprepare(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("dyn", result(dynamic("3g.40gb", 4)))
    reader.add(body)

    prepared = await plugin.prepare(ref(body))

    made = list(gpu(backend, 2).instances)
    assert [(i.profile, i.start) for i in made] == [("3g.40gb", 4)]
    assert made[0].in_use, "held for the claim from the moment it exists"
    assert env_of(spec_of(dirs, body))["CUDA_VISIBLE_DEVICES"] == made[0].uuid
    assert prepared.devices[0].dynamic is not None
    assert prepared.devices[0].dynamic.gpu_instance_id == made[0].gpu_instance_id

    await plugin.unprepare(ref(body))

    assert gpu(backend, 2).instances == ()
    assert not (dirs.cdi / spec_file_name(body["metadata"]["uid"])).exists()
    assert plugin.claims == {}
    assert plugin.in_use_device_uuids() == frozenset()
    data = load_checkpoint(dirs.checkpoint)
    assert data is not None
    assert data.claims == {}


async def test_a_failed_create_leaves_nothing_behind(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    # Slices 2-3 are taken by an instance nobody allocated: the second placement cannot be made,
    # so the first instance, already made for this claim, must go again.
    backend.create_instance(gpu(backend, 2).uuid, "1g.20gb", 2)
    body = claim("dyn2", result(dynamic("1g.10gb", 0), "a"), result(dynamic("1g.10gb", 3), "b"))
    reader.add(body)

    with pytest.raises(ClaimError, match="InsufficientResources"):
        await plugin.prepare(ref(body))

    assert [(i.profile, i.start) for i in gpu(backend, 2).instances] == [("1g.20gb", 2)]
    assert not any(g.in_use for g in backend.inventory().gpus), "no hold is left"
    assert not (dirs.cdi / spec_file_name(body["metadata"]["uid"])).exists()
    assert plugin.claims == {}
    data = load_checkpoint(dirs.checkpoint)
    assert data is not None
    assert data.claims == {}


async def test_unprepare_waits_for_processes_on_a_dynamic_instance(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend
) -> None:
    body = claim("busy", result(dynamic("2g.20gb", 2)))
    reader.add(body)
    await plugin.prepare(ref(body))
    mig_uuid = gpu(backend, 2).instances[0].uuid
    assert mig_uuid is not None
    backend.hold(mig_uuid, "pid-4242")  # a process still runs on it

    with pytest.raises(ClaimError, match="processes still run"):
        await plugin.unprepare(ref(body))
    assert plugin.claims[body["metadata"]["uid"]].state is ClaimState.UNPREPARING
    assert mig_uuid in plugin.in_use_device_uuids()

    backend.release(mig_uuid, "pid-4242")
    await plugin.unprepare(ref(body))
    assert gpu(backend, 2).instances == ()
    assert plugin.claims == {}


# --- idempotence and concurrency ----------------------------------------------------------------


async def test_preparing_twice_returns_the_same_answer_without_redoing_work(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend
) -> None:
    body = claim("again", result(dynamic("1g.10gb", 3)))
    reader.add(body)
    first = await plugin.prepare(ref(body))
    second = await plugin.prepare(ref(body))
    assert second == first
    assert reader.reads == 1
    assert len(gpu(backend, 2).instances) == 1


async def test_a_failed_redo_of_a_prepared_claim_keeps_what_the_claim_holds(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("redo", result(dynamic("1g.10gb", 4)), result(MPS, "share", share_id="q", consumed={"compute": "5"}))
    reader.add(body)
    first = await plugin.prepare(ref(body))
    (dirs.cdi / spec_file_name(body["metadata"]["uid"])).unlink()
    backend.stop_mps(gpu(backend, 1).uuid)
    backend.hardware.fail_next("start_mps", "Timeout")

    with pytest.raises(ClaimError, match="Timeout"):
        await plugin.prepare(ref(body))

    assert plugin.claims[body["metadata"]["uid"]] == first
    assert len(gpu(backend, 2).instances) == 1, "the claim's instance survives the failed redo"
    for uuid in first.device_uuids:
        assert holders(backend, uuid) == [body["metadata"]["uid"]]


async def test_a_prepared_claim_whose_spec_vanished_is_written_again(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("vanished", result(dynamic("1g.10gb", 5)))
    reader.add(body)
    first = await plugin.prepare(ref(body))
    (dirs.cdi / spec_file_name(body["metadata"]["uid"])).unlink()
    again = await plugin.prepare(ref(body))
    assert again.cdi_device_ids() == first.cdi_device_ids()
    assert (dirs.cdi / spec_file_name(body["metadata"]["uid"])).exists()
    assert len(gpu(backend, 2).instances) == 1, "the instance made the first time is reused"


async def test_unprepare_is_idempotent_and_accepts_unknown_claims(
    plugin: ClaimPreparer, reader: FakeClaimReader
) -> None:
    body = claim("once", result(WHOLE))
    reader.add(body)
    await plugin.prepare(ref(body))
    await plugin.unprepare(ref(body))
    await plugin.unprepare(ref(body))
    await plugin.unprepare(ClaimRef("nowhere", "never-prepared", "00000000-0000-0000-0000-000000000000"))
    assert plugin.claims == {}


async def test_concurrent_prepares_of_many_claims_each_get_their_own_devices(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    reader.delay_s = 0.01  # every API read overlaps the others
    dyn = [claim(f"dyn-{s}", result(dynamic("1g.10gb", s))) for s in range(7)]
    shares = [
        claim(f"mps-{n}", result(MPS, share_id=f"s{n}", consumed={"memory": "2Gi", "compute": "10"}))
        for n in range(8)
    ]
    reader.add(*dyn, *shares)

    prepared = await asyncio.gather(*(plugin.prepare(ref(b)) for b in dyn + shares))

    instances = gpu(backend, 2).instances
    assert sorted(i.start for i in instances) == list(range(7))
    visible = {p.devices[0].device_uuid for p in prepared[:7]}
    assert visible == {i.uuid for i in instances}, "every dynamic claim sees its own instance"
    data = load_checkpoint(dirs.checkpoint)
    assert data is not None
    assert set(data.claims) == {b["metadata"]["uid"] for b in dyn + shares}
    assert all(c.state is ClaimState.PREPARED for c in data.claims.values())
    assert len(list(dirs.cdi.glob("*.json"))) == 15


async def test_concurrent_prepares_of_one_claim_do_the_work_once(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend
) -> None:
    reader.delay_s = 0.01
    body = claim("racy", result(dynamic("4g.40gb", 0)))
    reader.add(body)
    answers = await asyncio.gather(*(plugin.prepare(ref(body)) for _ in range(5)))
    assert all(a == answers[0] for a in answers)
    assert len(gpu(backend, 2).instances) == 1
    assert reader.reads == 1


# --- claims that are not for us -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (claim("unallocated", allocated=False), "is not allocated"),
        (claim("elsewhere", result(WHOLE, pool="gpu-node-2")), "devices of node gpu-node-2, but this is node"),
        (claim("foreign", result("nic-0", driver="net.example.com")), "no device of driver gpu.tessera.dev"),
        (claim("odd-name", result("gpu-x")), "is not a Tessera device name"),
        (claim("no-gpu", result("gpu-9")), "no GPU with index 9"),
        (claim("no-instance", result("gpu-0-mig-1g-10gb-0")), "has no 1g.10gb instance at slice 0"),
    ],
    ids=["not-allocated", "other-node", "other-driver", "bad-device-name", "unknown-gpu", "unknown-instance"],
)
async def test_claims_that_cannot_be_prepared_say_why(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, body: dict[str, Any], message: str
) -> None:
    reader.add(body)
    with pytest.raises(ClaimError, match=message):
        await plugin.prepare(ref(body))
    assert plugin.claims == {}
    assert plugin.in_use_device_uuids() == frozenset()
    assert not any(g.in_use for g in backend.inventory().gpus), "nothing was held"


async def test_a_replaced_or_deleted_claim_is_refused(plugin: ClaimPreparer, reader: FakeClaimReader) -> None:
    body = claim("replaced", result(WHOLE))
    reader.add(body)
    stale = ClaimRef(body["metadata"]["namespace"], "replaced", "11111111-2222-3333-4444-555555555555")
    with pytest.raises(ClaimError, match="deleted and created again"):
        await plugin.prepare(stale)
    with pytest.raises(ClaimError, match="does not exist"):
        await plugin.prepare(ClaimRef(body["metadata"]["namespace"], "gone", "u"))


# --- restarts ------------------------------------------------------------------------------------


async def test_a_restarted_plugin_knows_its_claims_and_holds_their_devices_again(
    reader: FakeClaimReader, dirs: PluginDirs, tmp_path: Path
) -> None:
    state = tmp_path / "gpus.json"
    backend = make_backend(state)
    first = preparer(backend, reader, dirs)
    await first.restore()
    whole, dyn = claim("whole", result(WHOLE)), claim("dyn", result(dynamic("7g.80gb", 0)))
    reader.add(whole, dyn)
    await first.prepare(ref(whole))
    prepared_dyn = await first.prepare(ref(dyn))
    # The agent process dies: its holds die with it.
    for uuid in first.in_use_device_uuids():
        for holder in backend.hardware.holders(uuid):
            backend.release(uuid, holder)

    restarted_backend = SimulatedBackend(type(backend.hardware).open(state))
    second = preparer(restarted_backend, reader, dirs)
    await second.restore()

    assert second.claims == first.claims
    assert second.in_use_device_uuids() == first.in_use_device_uuids()
    for uuid in second.in_use_device_uuids():
        assert restarted_backend.hardware.holders(uuid), f"{uuid} is held again"
    assert await second.prepare(ref(dyn)) == prepared_dyn
    assert reader.reads == 2, "the restarted plugin answered from its checkpoint"
    await second.unprepare(ref(dyn))
    assert gpu(restarted_backend, 2).instances == ()


async def test_after_a_reboot_the_checkpoints_claims_are_forgotten_and_a_pod_that_comes_back_is_prepared_anew(
    reader: FakeClaimReader, dirs: PluginDirs, tmp_path: Path
) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    backend = make_backend()

    def plugin() -> ClaimPreparer:
        settings = PreparerSettings(driver=DRIVER_NAME, node=NODE, cdi_dir=dirs.cdi, checkpoint_path=dirs.checkpoint,
                                    proc_root=dirs.proc, boot_id_file=boot)
        return ClaimPreparer(backend, reader, settings)

    first = plugin()
    await first.restore()
    whole, mps = claim("whole", result(WHOLE)), claim("mps", result(MPS, share_id="s", consumed={"compute": "25"}))
    reader.add(whole, mps)
    await first.prepare(ref(whole))
    await first.prepare(ref(mps))
    written = load_checkpoint(dirs.checkpoint)
    assert written is not None
    assert written.boot_id == "boot-1"
    # A reboot: no process holds anything, /var/run/cdi is empty again but for a spec left over.
    for uuid in first.in_use_device_uuids():
        for holder in backend.hardware.holders(uuid):
            backend.release(uuid, holder)
    (dirs.cdi / spec_file_name(whole["metadata"]["uid"])).unlink()
    boot.write_text("boot-2\n")

    second = plugin()
    await second.restore()
    assert second.claims == {}, "nothing prepared in an earlier boot is in use now"
    assert second.in_use_device_uuids() == frozenset()
    assert not list(dirs.cdi.glob("*.json")), "stale CDI specs are removed"
    saved = load_checkpoint(dirs.checkpoint)
    assert saved is not None
    assert (saved.boot_id, saved.claims) == ("boot-2", {})
    again = await second.prepare(ref(whole))  # the kubelet prepares the claim of a Pod that comes back
    assert (dirs.cdi / spec_file_name(whole["metadata"]["uid"])).is_file()
    assert holders(backend, again.devices[0].device_uuid or "") == [whole["metadata"]["uid"]]

    same_boot = plugin()  # an agent restart within boot-2 keeps what boot-2 prepared
    await same_boot.restore()
    assert same_boot.claims == second.claims


async def test_a_crash_between_create_and_checkpoint_is_cleaned_up_by_unprepare(
    backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs
) -> None:
    # What a crash leaves: the claim recorded Preparing with its placement, the instance made.
    body = claim("crashed", result(dynamic("2g.20gb", 0)))
    uid = body["metadata"]["uid"]
    gpu2 = gpu(backend, 2)
    backend.create_instance(gpu2.uuid, "2g.20gb", 0, hold=uid)
    device = PreparedDevice(
        request="gpu", pool=NODE, device=dynamic("2g.20gb", 0), cdi_device_id="", gpu_uuid=gpu2.uuid,
        dynamic=DynamicInstance(gpu_uuid=gpu2.uuid, profile="2g.20gb", start=0),
    )
    preparing = PreparedClaim(uid=uid, namespace="team-a", name="crashed", state=ClaimState.PREPARING,
                              devices=(device,))
    save_checkpoint(dirs.checkpoint, CheckpointData(node=NODE, claims={uid: preparing}))
    backend.release(gpu(backend, 2).instances[0].uuid or "", uid)

    restarted = preparer(backend, reader, dirs)
    await restarted.restore()
    await restarted.unprepare(ref(body))

    assert gpu(backend, 2).instances == ()
    assert restarted.claims == {}


async def test_a_crash_between_create_and_checkpoint_is_finished_by_the_next_prepare(
    backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs
) -> None:
    body = claim("resumed", result(dynamic("2g.20gb", 2)))
    reader.add(body)
    backend.create_instance(gpu(backend, 2).uuid, "2g.20gb", 2)  # made, then the agent died

    restarted = preparer(backend, reader, dirs)
    await restarted.restore()
    prepared = await restarted.prepare(ref(body))

    instances = gpu(backend, 2).instances
    assert len(instances) == 1
    assert prepared.devices[0].device_uuid == instances[0].uuid


async def test_a_corrupt_checkpoint_is_set_aside_and_rebuilt_from_the_cdi_specs(
    plugin: ClaimPreparer, reader: FakeClaimReader, backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    whole, dyn = claim("whole", result(WHOLE)), claim("dyn", result(dynamic("3g.40gb", 0)))
    reader.add(whole, dyn)
    await plugin.prepare(ref(whole))
    await plugin.prepare(ref(dyn))
    raw = bytearray(dirs.checkpoint.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit
    dirs.checkpoint.write_bytes(bytes(raw))

    rebuilt = preparer(backend, reader, dirs)
    await rebuilt.restore()

    assert len(list(dirs.checkpoint.parent.glob("checkpoint.json.corrupt-*"))) == 1
    assert set(rebuilt.claims) == {whole["metadata"]["uid"], dyn["metadata"]["uid"]}
    assert all(c.recovered for c in rebuilt.claims.values())
    assert rebuilt.in_use_device_uuids() == plugin.in_use_device_uuids()
    assert load_checkpoint(dirs.checkpoint) is not None, "a good checkpoint is written again"
    await rebuilt.unprepare(ref(dyn))
    assert gpu(backend, 2).instances == (), "the dynamic instance is still found and destroyed"


# --- claim device status (DRAResourceClaimDeviceStatus) ------------------------------------------


@dataclass
class RecordingStatusWriter:
    """Records what the preparer would write to each claim's status.devices; can fail."""

    writes: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    fail: bool = False

    async def write_device_status(self, claim_ref: ClaimRef, devices: Sequence[dict[str, Any]]) -> None:
        if self.fail:
            raise RuntimeError("HTTP 500 from the API server")
        self.writes.append((claim_ref.uid, list(devices)))


async def test_prepare_writes_ready_device_status_with_uuid_profile_limits_and_driver_version(
    backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs
) -> None:
    writer = RecordingStatusWriter()
    plugin = preparer(backend, reader, dirs, writer)
    await plugin.restore()
    mps = claim("mps", result(MPS, share_id="share-1", consumed={"memory": "10Gi", "compute": "25"}))
    mig = claim("mig", result(STATIC))
    reader.add(mps, mig)

    await plugin.prepare(ref(mps))
    await plugin.prepare(ref(mig))
    await plugin.prepare(ref(mig))  # already prepared: nothing new to say
    await plugin.flush_status()  # written after the answers

    (mps_uid, (mps_entry,)), (mig_uid, (mig_entry,)) = writer.writes
    assert (mps_uid, mig_uid) == (mps["metadata"]["uid"], mig["metadata"]["uid"])
    gpu1 = gpu(backend, 1)
    assert {k: mps_entry[k] for k in ("driver", "pool", "device", "shareID")} == {
        "driver": "gpu.tessera.dev", "pool": NODE, "device": MPS, "shareID": "share-1"}
    (ready,) = mps_entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert datetime.strptime(ready["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
    assert mps_entry["data"] == {
        "uuid": gpu1.uuid, "gpuUUID": gpu1.uuid, "driverVersion": SIM_DRIVER_VERSION,
        "mps": {"activeThreadPercentage": 25, "pinnedDeviceMemoryMiB": 10240},
    }
    instance = next(i for i in gpu(backend, 0).instances if (i.profile, i.start) == ("3g.40gb", 0))
    assert mig_entry["data"] == {"uuid": instance.uuid, "gpuUUID": gpu(backend, 0).uuid, "migProfile": "3g.40gb",
                                 "driverVersion": SIM_DRIVER_VERSION}
    assert "shareID" not in mig_entry

    await plugin.unprepare(ref(mig))
    await plugin.flush_status()
    assert writer.writes[-1] == (mig["metadata"]["uid"], []), "unprepare clears the entries"


async def test_a_failed_status_write_does_not_fail_the_prepare(
    backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs
) -> None:
    plugin = preparer(backend, reader, dirs, RecordingStatusWriter(fail=True))
    await plugin.restore()
    body = claim("whole", result(WHOLE))
    reader.add(body)

    prepared = await plugin.prepare(ref(body))

    assert prepared.state is ClaimState.PREPARED
    assert spec_of(dirs, body)["devices"]
    await plugin.unprepare(ref(body))
    assert not (dirs.cdi / spec_file_name(body["metadata"]["uid"])).exists()
    await plugin.close(grace=0.0)  # the write still being retried stops with the plugin
