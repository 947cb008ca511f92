"""The simulated GPUs' rules and the NVML backend's edges: spec parsing, deterministic UUIDs,
placement rules, Ampere's pending MIG mode, persistence across processes, fault injection,
health events, and NVML errors turned into domain errors (no driver is reported, not raised)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tessera.agent.backends.base import (
    BackendError,
    DeviceBackend,
    HealthEventKind,
    InsufficientResourcesError,
    InUseError,
    MpsDefaults,
    NotSupportedError,
)
from tessera.agent.backends.nvml import NvmlBackend
from tessera.agent.backends.pci import root_complex_of, sysfs_bus_id
from tessera.agent.backends.simulated import (
    STANDIN_MPS_CONTROL,
    SimulatedBackend,
    SimulatedHardware,
    board_slot,
    parse_simulate_spec,
    simulated_gpu_uuid,
)
from tessera.models.layout import Health
from tessera.models.policy import TimeSliceInterval
from tests.fake_pynvml import BACKEND_KINDS, FakeNvml, RecordingRunner, backend_over


def make(kind: str, tmp_path: Path, spec: str = "1xH100-80GB,1xA100-80GB") -> tuple[SimulatedHardware, DeviceBackend]:
    hw = SimulatedHardware("node-b", parse_simulate_spec(spec), tmp_path / "gpus.json")
    return hw, backend_over(kind, hw, str(tmp_path / "mps"))


def test_a_simulate_spec_lists_catalog_models_in_order() -> None:
    models = parse_simulate_spec("2xH100-80GB, A100-80GB,1xH200-141GB")
    assert [m.key for m in models] == ["H100-80GB", "H100-80GB", "A100-80GB", "H200-141GB"]


@pytest.mark.parametrize(
    ("spec", "error"),
    [("3xT4", "unknown GPU model 'T4'"), ("0xH100-80GB", "between 1 and 64"), ("", "empty"), ("x x", "COUNTxMODEL")],
)
def test_a_bad_simulate_spec_says_what_is_wrong(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_simulate_spec(spec)


def test_uuids_are_seeded_by_node_name() -> None:
    assert simulated_gpu_uuid("n1", 0) == simulated_gpu_uuid("n1", 0)
    assert simulated_gpu_uuid("n1", 0) != simulated_gpu_uuid("n2", 0)
    a = SimulatedBackend.from_spec("n1", "2xH100-80GB").inventory()
    b = SimulatedBackend.from_spec("n1", "2xH100-80GB").inventory()
    assert a == b
    assert a.gpus[0].uuid.startswith("GPU-")


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_both_backends_report_the_same_inventory(kind: str, tmp_path: Path) -> None:
    hw, backend = make(kind, tmp_path)
    reference = SimulatedBackend(hw).inventory()
    inv = backend.inventory()
    assert inv.problem == ""
    assert inv.driver_version == reference.driver_version
    for mine, ref in zip(inv.gpus, reference.gpus, strict=True):
        assert (mine.uuid, mine.index, mine.product_name, mine.memory_mib) == (
            ref.uuid, ref.index, ref.product_name, ref.memory_mib)
        assert mine.architecture == ref.architecture
        assert mine.profiles == ref.profiles
        assert mine.mig_capable


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_placement_rules_hold(kind: str, tmp_path: Path) -> None:
    hw, backend = make(kind, tmp_path)
    gpu = backend.inventory().gpus[0].uuid
    with pytest.raises(NotSupportedError, match=r"not in MIG mode|NOT_SUPPORTED"):
        backend.create_instance(gpu, "1g.10gb", 0)
    backend.set_mig_mode(gpu, True)
    backend.create_instance(gpu, "3g.40gb", 4)
    with pytest.raises(InsufficientResourcesError):
        backend.create_instance(gpu, "2g.20gb", 4)  # overlaps
    with pytest.raises(InsufficientResourcesError):
        backend.create_instance(gpu, "2g.20gb", 1)  # not a valid start
    with pytest.raises(NotSupportedError):
        backend.create_instance(gpu, "3g.71gb", 0)  # an H200 profile
    made = backend.create_instance(gpu, "1g.10gb", 0)
    assert made.uuid.startswith("MIG-")
    hw.hold(made.uuid, "pid:1")
    with pytest.raises(InUseError):
        backend.destroy_instance(gpu, made.gpu_instance_id)
    assert [(i.profile, i.start, i.in_use) for i in backend.inventory().gpus[0].instances] == [
        ("1g.10gb", 0, True), ("3g.40gb", 4, False)]


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_ampere_mig_mode_is_pending_until_a_reset_and_hopper_is_immediate(kind: str, tmp_path: Path) -> None:
    hw, backend = make(kind, tmp_path)
    h100, a100 = (g.uuid for g in backend.inventory().gpus)
    assert not backend.set_mig_mode(h100, True).reset_required
    pending = backend.set_mig_mode(a100, True)
    assert (pending.current, pending.pending, pending.reset_required) == (False, True, True)
    hw.reset_gpu(1)
    assert backend.inventory().gpus[1].mig_mode_current


def test_simulated_hardware_outlives_the_process_that_changed_it(tmp_path: Path) -> None:
    first = SimulatedBackend.from_spec("node-c", "1xH100-80GB", tmp_path / "s.json")
    gpu = first.inventory().gpus[0].uuid
    first.set_mig_mode(gpu, True)
    first.create_instance(gpu, "7g.80gb", 0)
    again = SimulatedBackend.from_spec("node-c", "1xH100-80GB", tmp_path / "s.json")
    assert [(i.profile, i.start) for i in again.inventory().gpus[0].instances] == [("7g.80gb", 0)]
    with pytest.raises(ValueError, match="belongs to node 'node-c'"):
        SimulatedHardware("other", parse_simulate_spec("1xH100-80GB"), tmp_path / "s.json")
    with pytest.raises(ValueError, match="delete the file"):
        SimulatedHardware("node-c", parse_simulate_spec("2xH100-80GB"), tmp_path / "s.json")


def test_injected_faults_fire_once_after_the_given_number_of_calls(tmp_path: Path) -> None:
    hw, backend = make("simulated", tmp_path)
    gpu = backend.inventory().gpus[0].uuid
    backend.set_mig_mode(gpu, True)
    hw.fail_next("create_gpu_instance", "InsufficientResources", after=1)
    backend.create_instance(gpu, "1g.10gb", 0)
    with pytest.raises(InsufficientResourcesError, match="injected fault"):
        backend.create_instance(gpu, "1g.10gb", 1)
    backend.create_instance(gpu, "1g.10gb", 1)
    with pytest.raises(ValueError, match="unknown fault"):
        hw.fail_next("create_gpu_instance", "Melted")


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_xid_ecc_and_lost_gpu_are_events_and_the_inventory_reports_the_probe(kind: str, tmp_path: Path) -> None:
    hw, backend = make(kind, tmp_path)
    backend.inventory()
    hw.inject_xid(0, 13)  # an application error: not fatal
    events = backend.wait_health_events(0.5)
    assert [(e.kind, e.xid, e.fatal) for e in events] == [(HealthEventKind.XID, 13, False)]
    hw.inject_xid(0, 79)
    events = backend.wait_health_events(0.5)
    assert [(e.xid, e.fatal) for e in events] == [(79, True)]
    # The GPU still answers: the probe says healthy; marking it is the agent's (tessera.agent.health).
    assert backend.inventory().gpus[0].health is Health.HEALTHY
    assert backend.wait_health_events(0.05) == []
    hw.inject_ecc_error(0)
    events = backend.wait_health_events(0.5)
    assert [(e.kind, e.fatal) for e in events] == [(HealthEventKind.DOUBLE_BIT_ECC, True)]
    hw.lose_gpu(1)
    events = backend.wait_health_events(0.5)
    assert [e.kind for e in events] == [HealthEventKind.GPU_LOST]
    lost = backend.inventory().gpus[1]
    assert lost.health is Health.LOST
    assert "reboot" in lost.health_message
    hw.reset_gpu(1)
    assert backend.inventory().gpus[1].health is Health.HEALTHY, "it answers again after a reset"
    reset = backend.wait_health_events(0.2)
    # The simulated driver reports the reset; NVML has no such event (the agent's quiet period covers it).
    assert [e.kind for e in reset] == ([HealthEventKind.GPU_RESET] if kind == "simulated" else [])


def test_no_nvidia_library_is_reported_not_raised(tmp_path: Path) -> None:
    hw = SimulatedHardware("node-d", parse_simulate_spec("1xH100-80GB"))
    inv = NvmlBackend(FakeNvml(hw, library_missing=True)).inventory()
    assert inv.gpus == ()
    assert "libnvidia-ml.so.1 is missing" in inv.problem
    assert "--backend simulated" in inv.problem


def test_no_driver_is_reported_by_both_backends(tmp_path: Path) -> None:
    for kind in BACKEND_KINDS:
        (tmp_path / kind).mkdir()
        hw, backend = make(kind, tmp_path / kind, "1xH100-80GB")
        hw.set_driver_available(False)
        inv = backend.inventory()
        assert inv.gpus == ()
        assert "driver" in inv.problem.lower()


def test_nvml_errors_become_domain_errors_with_the_gpu_and_a_hint(tmp_path: Path) -> None:
    _, backend = make("nvml", tmp_path)
    gpu = backend.inventory().gpus[0].uuid
    backend.set_mig_mode(gpu, True)
    backend.create_instance(gpu, "7g.80gb", 0)
    with pytest.raises(InsufficientResourcesError) as err:
        backend.create_instance(gpu, "1g.10gb", 3)
    text = str(err.value)
    assert text.startswith(f"GPU 0 ({gpu}): create 1g.10gb at slice 3: NVML error INSUFFICIENT_RESOURCES")
    assert "overlaps another instance" in text


def test_nvml_runs_mps_daemons_and_time_slices_through_commands(tmp_path: Path) -> None:
    hw = SimulatedHardware("node-e", parse_simulate_spec("1xH100-80GB"))
    runner = RecordingRunner()
    backend = NvmlBackend(FakeNvml(hw), runner=runner, mps_root=str(tmp_path / "mps"), mps_control=STANDIN_MPS_CONTROL)
    gpu = backend.inventory().gpus[0].uuid
    backend.set_time_slice(gpu, TimeSliceInterval.MEDIUM)
    pipe = backend.start_mps(gpu, MpsDefaults(active_thread_percentage=25, pinned_memory_mib=4096))
    assert backend.start_mps(gpu) == pipe  # idempotent: no second daemon
    assert hw.snapshot().gpus[0].compute_mode == 3  # EXCLUSIVE_PROCESS while MPS runs
    running = backend.inventory().gpus[0]
    assert (running.mps_running, running.mps_pipe_directory) == (True, pipe)
    assert running.mps_defaults == MpsDefaults(25, 4096)
    backend.stop_mps(gpu)
    assert hw.snapshot().gpus[0].compute_mode == 0
    control = list(STANDIN_MPS_CONTROL)
    assert [c[0] for c in runner.commands] == [
        ["nvidia-smi", "compute-policy", "-i", gpu, "--set-timeslice", "2"],
        [*control, "-d"],
        control,  # the defaults
        control,  # quit
    ]
    env = runner.commands[1][1]
    assert env["CUDA_VISIBLE_DEVICES"] == gpu
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert runner.commands[2][2] == (
        "set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 0 4096M\n"
    )
    assert runner.commands[3][2] == "quit\n"
    inv = backend.inventory().gpus[0]
    assert inv.time_slice is TimeSliceInterval.MEDIUM
    assert not inv.mps_running

    runner.fail = lambda argv: "nvidia-smi: permission denied" if argv[0] == "nvidia-smi" else None
    with pytest.raises(BackendError, match="permission denied"):
        backend.set_time_slice(gpu, TimeSliceInterval.LONG)


def test_nvml_backend_uses_only_calls_the_stand_in_implements(tmp_path: Path) -> None:
    hw = SimulatedHardware("node-f", parse_simulate_spec("1xA100-40GB"))
    fake = FakeNvml(hw)
    backend = NvmlBackend(fake, runner=RecordingRunner(), mps_root=str(tmp_path))
    with pytest.raises(AttributeError, match="does not implement nvmlDeviceGetPowerUsage"):
        fake.nvmlDeviceGetPowerUsage  # noqa: B018 - the attribute access is the test
    inv = backend.inventory()
    assert [p.name for p in inv.gpus[0].profiles] == [
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def test_the_real_nvml_backend_reports_this_machine_without_raising() -> None:
    backend = NvmlBackend()  # the real pynvml: no driver here is a report, a GPU here is listed
    try:
        inv = backend.inventory()
        if inv.gpus:
            assert all(g.uuid.startswith("GPU-") and g.memory_mib > 0 for g in inv.gpus)
            assert inv.driver_version
        else:
            assert "NVIDIA driver" in inv.problem or "no GPU" in inv.problem
        assert backend.wait_health_events(0.01) == [] or inv.gpus
    finally:
        backend.close()


def test_the_nvml_backend_reads_the_driver_minor_number_the_simulated_one_does_not(tmp_path: Path) -> None:
    hw, backend = make("nvml", tmp_path)
    assert [g.minor for g in backend.inventory().gpus] == [64 + g.index for g in backend.inventory().gpus]
    assert all(g.minor is None for g in SimulatedBackend(hw).inventory().gpus)


def test_the_simulated_board_is_an_hgx_with_two_gpus_behind_each_of_four_roots() -> None:
    gpus = SimulatedBackend.from_spec("hgx", "8xH100-80GB").inventory().gpus
    roots = [g.pcie_root for g in gpus]
    assert roots == ["pci0000:10"] * 2 + ["pci0000:30"] * 2 + ["pci0000:50"] * 2 + ["pci0000:70"] * 2
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pci_bus_id for g in gpus}) == 8
    assert board_slot(8, 16).pcie_root == "pci0000:90", "a bigger board keeps two GPUs per root"
    assert [g.numa_node for g in SimulatedBackend.from_spec("one", "1xH100-80GB").inventory().gpus] == [0]


def _fake_sysfs(root: Path, gpus: list[tuple[str, str, int]]) -> Path:
    """A /sys with the PCI links and NUMA files of ``(nvml bus id, root complex, numa)``."""
    for bus_id, complex_, numa in gpus:
        bdf = sysfs_bus_id(bus_id)
        assert bdf is not None
        bridge = f"{complex_[3:]}:00.0"  # e.g. 0000:10:00.0, the root port
        device = root / "devices" / complex_ / bridge / bdf
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
        link = root / "bus" / "pci" / "devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../..") / "devices" / complex_ / bridge / bdf)
    return root


def test_the_nvml_backend_reads_root_complex_and_numa_node_from_sysfs(tmp_path: Path) -> None:
    hw = SimulatedHardware("hgx", parse_simulate_spec("8xH100-80GB"), tmp_path / "gpus.json")
    simulated = SimulatedBackend(hw).inventory().gpus
    sysfs = _fake_sysfs(tmp_path / "sys", [(g.pci_bus_id or "", g.pcie_root or "", g.numa_node or 0)
                                           for g in simulated])
    read = NvmlBackend(FakeNvml(hw), runner=RecordingRunner(), sysfs=str(sysfs)).inventory().gpus
    assert [(g.pci_bus_id, g.pcie_root, g.numa_node) for g in read] == [
        (g.pci_bus_id, g.pcie_root, g.numa_node) for g in simulated]

    # No sysfs entry: nothing is guessed (the stand-in's NVML has no NUMA answer either).
    blind = NvmlBackend(FakeNvml(hw), runner=RecordingRunner(), sysfs=str(tmp_path / "empty")).inventory().gpus
    assert {(g.pcie_root, g.numa_node) for g in blind} == {(None, None)}


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [("00000000:3B:00.0", "0000:3b:00.0"), ("00000001:AB:01.1", "0001:ab:01.1"), ("0000:3b:00.0", "0000:3b:00.0"),
     ("GPU-1234", None), ("", None)],
)
def test_nvml_bus_ids_map_to_sysfs_names(nvml: str, sysfs: str | None) -> None:
    assert sysfs_bus_id(nvml) == sysfs


def test_the_root_complex_is_the_first_folder_under_devices() -> None:
    target = "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0"
    assert root_complex_of(target) == "pci0000:3a"
    assert root_complex_of("/sys/devices/pci0001:80/0001:80:01.0/0001:81:00.0") == "pci0001:80"
    assert root_complex_of("../../../devices/platform/foo") is None


def test_runnable_simulated_gpus_have_character_devices_and_mps_pipe_folders(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making character devices needs root (CAP_MKNOD)")
    dev = tmp_path / "dev"
    mps = str(tmp_path / "mps")
    backend = SimulatedBackend.from_spec("n", "2xH100-80GB", tmp_path / "state.json", mps, device_dir=dev)
    made = {p.name: os.stat(p).st_rdev for p in dev.iterdir()}
    assert sorted(made) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
    assert all(stat.S_ISCHR(os.stat(dev / name).st_mode) for name in made)
    assert (os.major(made["nvidia1"]), os.minor(made["nvidia1"])) == (195, 1)
    assert (os.major(made["nvidiactl"]), os.minor(made["nvidiactl"])) == (195, 255)
    SimulatedBackend.from_spec("n", "2xH100-80GB", tmp_path / "state.json", mps, device_dir=dev)  # again: kept
    pipe = backend.start_mps(backend.inventory().gpus[0].uuid)
    assert Path(pipe).is_dir(), "the folder the CDI spec mounts exists, as a real MPS daemon's would"


def test_without_a_device_folder_the_simulated_backend_makes_no_host_files(tmp_path: Path) -> None:
    backend = SimulatedBackend.from_spec("n", "1xH100-80GB", None, str(tmp_path / "mps"))
    pipe = backend.start_mps(backend.inventory().gpus[0].uuid)
    assert not Path(pipe).exists()


def test_a_snapshot_is_a_deep_copy_equal_to_the_json_round_trip() -> None:
    """``SimState.copy`` (what ``snapshot`` returns) is the state as JSON would carry it, and
    nothing in it is shared with the live state."""
    from dataclasses import asdict

    from tessera.agent.backends.simstate import SimEvent, SimFault, SimState

    hw = SimulatedHardware("copy-node", parse_simulate_spec("2xH100-80GB"))
    hw.set_mig_mode(0, True)
    gi = hw.create_gpu_instance(0, 9, 0)  # 3g.40gb
    _, mig_uuid = hw.create_compute_instance(0, gi)
    hw.hold(mig_uuid, "claim-a")
    with hw.transaction() as live:
        live.mps["GPU-x"] = "/pipes/x"
        live.mps_defaults["GPU-x"] = {"active_thread_percentage": 50, "pinned_memory_limit_mib": None}
        live.faults.append(SimFault("destroy_gpu_instance", "in use", gpu_index=0))
        live.events.append(SimEvent(gpu_index=1, kind="xid", xid=79))
        expected = SimState.from_json(asdict(live))

    snap = hw.snapshot()
    assert snap == expected
    snap.gpus[0].instances[0].start = 4
    snap.gpus[0].instances.clear()
    snap.holds[mig_uuid].append("claim-b")
    snap.mps_defaults["GPU-x"]["active_thread_percentage"] = 10
    snap.faults[0].remaining = 0
    assert hw.snapshot() == expected, "changing the copy leaves the hardware alone"
