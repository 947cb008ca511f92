"""MPS control daemons as real processes (the stand-in with nvidia-cuda-mps-control's surface):
defaults set through the daemon's own commands, a daemon that outlives the agent and is found
again, a stale pipe folder that is not trusted, a killed daemon restarted (and said so), on
both backends (simulated, and NVML over the NVML stand-in)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tessera.agent.backends.base import DeviceBackend, MpsDefaults
from tessera.agent.backends.mps import PID_FILE, DaemonState, MpsDaemons, run_command
from tessera.agent.backends.simulated import STANDIN_MPS_CONTROL, SimulatedBackend, SimulatedHardware
from tessera.agent.backends.simulated import parse_simulate_spec as parse
from tessera.agent.reconciler import OpKind, apply_layout, mps_defaults
from tessera.agent.status import build_status
from tessera.models.layout import GpuLayout, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import MpsCompute, MpsMemory, MpsSpec, ShareStrategy, Strategy
from tests.fake_pynvml import BACKEND_KINDS, FakeNvml, RecordingRunner


def control(pipe: str, *commands: str) -> list[str]:
    """Ask the daemon of ``pipe`` through the control program, as a person would."""
    stdin = "".join(f"{c}\n" for c in commands)
    done = run_command(list(STANDIN_MPS_CONTROL), {"CUDA_MPS_PIPE_DIRECTORY": pipe}, stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def pid_of(pipe: str) -> int:
    return int((Path(pipe) / PID_FILE).read_text())


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def make(kind: str, hw: SimulatedHardware, root: Path) -> DeviceBackend:
    """A backend with real daemons; a new one is a restarted agent."""
    if kind == "simulated":
        return SimulatedBackend(hw, MpsDaemons(root, STANDIN_MPS_CONTROL))
    from tessera.agent.backends.nvml import NvmlBackend

    return NvmlBackend(FakeNvml(hw), runner=RecordingRunner(), mps_root=str(root), mps_control=STANDIN_MPS_CONTROL)


MPS = MpsSpec(memory=MpsMemory(default="8Gi", min="1Gi", step="1Gi"), compute=MpsCompute(default=25))


@pytest.fixture(params=BACKEND_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_stand_in_keeps_the_real_programs_surface(tmp_path: Path) -> None:
    pipe = str(tmp_path / "pipe")
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe}
    no_daemon = run_command(list(STANDIN_MPS_CONTROL), env, "get_server_list\n")
    assert (no_daemon.returncode, no_daemon.stderr.strip()) == (1, "Cannot find MPS control daemon process")
    assert run_command([*STANDIN_MPS_CONTROL, "-d"], env, None).returncode == 0
    pid = pid_of(pipe)
    assert (Path(pipe) / "control").is_socket()
    assert control(pipe, "get_default_active_thread_percentage") == ["100.0"]
    assert control(pipe, "set_default_active_thread_percentage 25", "get_default_active_thread_percentage") == [
        "25.0", "25.0"]
    control(pipe, "set_default_device_pinned_mem_limit 0 8192M")
    assert control(pipe, "get_default_device_pinned_mem_limit 0") == ["8192M"]
    second = run_command([*STANDIN_MPS_CONTROL, "-d"], env, None)
    assert second.returncode == 1, "one daemon per pipe folder"
    control(pipe, "quit")
    wait_gone(pid)
    assert not (Path(pipe) / PID_FILE).exists(), "quit removes the pid file"


def test_defaults_are_set_through_the_daemons_commands_and_follow_the_policy(kind: str, tmp_path: Path) -> None:
    hw = SimulatedHardware("node-m", parse("1xH100-80GB"), tmp_path / "gpus.json")
    backend = make(kind, hw, tmp_path / "mps")
    gpu = backend.inventory().gpus[0]
    spec = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu.uuid, strategy=Strategy.MPS, mps=MPS)])

    first = apply_layout(backend, spec)

    (start,) = [op for op in first.executed if op.kind is OpKind.START_MPS]
    assert start.mps_defaults == MpsDefaults(active_thread_percentage=25, pinned_memory_mib=8192)
    pipe = backend.inventory().gpus[0].mps_pipe_directory
    assert pipe is not None
    assert control(pipe, "get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0") == [
        "25.0", "8192M"], "a client that sets nothing gets a bounded share"
    assert apply_layout(backend, spec).executed == [], "converged"

    bigger = MpsSpec(memory=MpsMemory(default="16Gi", min="1Gi", step="1Gi"), compute=MpsCompute(default=50))
    edited = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu.uuid, strategy=Strategy.MPS, mps=bigger)])
    pid = pid_of(pipe)
    again = apply_layout(backend, edited)
    assert [op.kind for op in again.executed] == [OpKind.SET_MPS_DEFAULTS]
    assert pid_of(pipe) == pid, "the same daemon: its clients keep running"
    assert control(pipe, "get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0") == [
        "50.0", "16384M"]
    apply_layout(backend, NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu.uuid)]))
    wait_gone(pid)
    assert not Path(f"/proc/{pid}").exists(), "Exclusive again: the daemon quit"


def test_a_daemon_outlives_the_agent_and_a_killed_one_is_restarted(kind: str, tmp_path: Path) -> None:
    hw = SimulatedHardware("node-m", parse("1xH100-80GB"), tmp_path / "gpus.json")
    gpu0 = SimulatedBackend(hw).inventory().gpus[0].uuid
    instances = [PlacedInstance(profile="3g.40gb", start=0), PlacedInstance(profile="3g.40gb", start=4)]
    spec = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu0, strategy=Strategy.MIG, mig_instances=instances,
                                          mig_sharing=ShareStrategy.MPS, mps=MPS)])
    agent = make(kind, hw, tmp_path / "mps")
    apply_layout(agent, spec)
    pipes = [i.mps_pipe_directory for i in agent.inventory().gpus[0].instances]
    assert all(pipes)
    assert len(set(pipes)) == 2, "one daemon per MIG device, each its own pipe folder"
    pids = [pid_of(p) for p in pipes if p]

    restarted_agent = make(kind, hw, tmp_path / "mps")  # the agent process was restarted
    assert apply_layout(restarted_agent, spec).executed == [], "the running daemons are adopted, not restarted"
    assert [pid_of(p) for p in pipes if p] == pids

    os.kill(pids[1], signal.SIGKILL)
    wait_gone(pids[1])
    crashed = restarted_agent.inventory().gpus[0].instances[1]
    assert (crashed.mps_running, crashed.mps_crashed) == (False, True), "a pid file of a dead daemon is stale"
    status = build_status(restarted_agent.inventory(), spec, [], backend="t", agent_version="t", observed_generation=1)
    assert status.gpus[0].mig_sharing is ShareStrategy.MPS, "published as before while it is restarted"

    result = apply_layout(restarted_agent, spec)

    (restart,) = result.executed
    assert (restart.kind, restart.restart, restart.device_uuid) == (OpKind.START_MPS, True, crashed.uuid)
    assert "restart the crashed MPS daemon" in restart.describe()
    new_pid = pid_of(pipes[1] or "")
    assert new_pid != pids[1]
    assert control(pipes[1] or "", "get_default_active_thread_percentage") == ["25.0"], "defaults set again"
    assert pid_of(pipes[0] or "") == pids[0], "the other daemon was left alone"


def test_a_pid_file_naming_some_other_process_is_not_trusted(tmp_path: Path) -> None:
    daemons = MpsDaemons(tmp_path / "mps", STANDIN_MPS_CONTROL)
    pipe = daemons.pipe("GPU-x")
    pipe.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"])  # alive, but not a daemon of this folder
    try:
        (pipe / PID_FILE).write_text(f"{sleeper.pid}\n")
        (pipe / "control").write_text("")
        assert daemons.state("GPU-x") is DaemonState.ABSENT
        started, restarted = daemons.start("GPU-x", MpsDefaults(active_thread_percentage=10))
        assert restarted is False
        assert pid_of(started) != sleeper.pid
        assert daemons.state("GPU-x") is DaemonState.RUNNING
        assert control(started, "get_default_active_thread_percentage") == ["10.0"]
    finally:
        sleeper.kill()
        sleeper.wait()
        daemons.stop("GPU-x")
    assert daemons.state("GPU-x") is DaemonState.ABSENT


def test_memory_default_is_capped_at_the_devices_memory() -> None:
    layout = GpuLayout(uuid="GPU-a", strategy=Strategy.MPS, mps=MpsSpec(memory=MpsMemory(default="64Gi")))
    assert mps_defaults(layout, memory_mib=9984) == MpsDefaults(active_thread_percentage=10, pinned_memory_mib=9984)
