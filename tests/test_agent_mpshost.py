"""The MPS host starts the daemons the agent asks for (real stand-in processes): the agent's
backend, in host mode, never runs the control program's ``-d`` itself, finds and uses the
daemon the host started, and a new agent adopts it; the host runs only the programs it knows,
and the agent says clearly when no host answers or the host refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.agent.backends.base import BackendError, BackendTimeoutError, MpsDefaults
from tessera.agent.backends.mps import LAUNCH_ERROR, LAUNCH_REQUEST, CommandResult, DaemonState, MpsDaemons, run_command
from tessera.agent.backends.mpshost import MpsHost
from tessera.agent.backends.simulated import STANDIN_MPS_CONTROL, SimulatedBackend, SimulatedHardware
from tessera.agent.backends.simulated import parse_simulate_spec as parse
from tests.test_agent_mps import control, pid_of, wait_gone


class NoDetachRunner:
    """The agent's runner in host mode: it may talk to a daemon, never start one (``-d``)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], env: dict[str, str], stdin: str | None) -> CommandResult:
        assert "-d" not in argv, "in host mode the agent must not start a daemon in its own container"
        self.calls.append(argv)
        return run_command(argv, env, stdin)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[MpsHost]:
    serving = MpsHost(tmp_path / "mps")
    stop = threading.Event()
    thread = threading.Thread(target=serving.serve, args=(stop, 0.02), daemon=True)
    thread.start()
    yield serving
    stop.set()
    thread.join(5)
    MpsDaemons(tmp_path / "mps", STANDIN_MPS_CONTROL).kill_all()


def agent_daemons(root: Path, runner: NoDetachRunner, timeout: float = 10.0) -> MpsDaemons:
    return MpsDaemons(root, STANDIN_MPS_CONTROL, runner, ready_timeout_s=timeout, host_program="standin")


def test_the_host_starts_the_daemon_the_agent_asks_for_and_a_new_agent_adopts_it(host: MpsHost) -> None:
    runner = NoDetachRunner()
    agent = agent_daemons(host.root, runner)
    pipe, restarted = agent.start("GPU-a", MpsDefaults(active_thread_percentage=25, pinned_memory_mib=4096))
    assert not restarted
    assert agent.state("GPU-a") is DaemonState.RUNNING
    assert control(pipe, "get_default_active_thread_percentage") == ["25.0"], "defaults set through the daemon"
    assert not (host.root / "GPU-a" / LAUNCH_REQUEST).exists(), "the host answered and removed the request"
    pid = pid_of(pipe)

    again = agent_daemons(host.root, NoDetachRunner())  # the agent's container restarted
    assert again.state("GPU-a") is DaemonState.RUNNING
    assert again.start("GPU-a") == (pipe, False)
    assert pid_of(pipe) == pid, "adopted, not restarted"
    assert control(pipe, "get_default_device_pinned_mem_limit 0") == ["4096M"]

    again.stop("GPU-a")
    wait_gone(pid)
    assert again.state("GPU-a") is DaemonState.ABSENT


def test_the_simulated_backend_in_host_mode_asks_the_host(host: MpsHost, tmp_path: Path) -> None:
    hw = SimulatedHardware("n", parse("1xH100-80GB"), tmp_path / "hw.json")
    backend = SimulatedBackend(hw, agent_daemons(host.root, NoDetachRunner()))
    gpu = backend.inventory().gpus[0].uuid
    pipe = backend.start_mps(gpu, MpsDefaults(active_thread_percentage=50))
    assert backend.inventory().gpus[0].mps_running
    assert control(pipe, "get_default_active_thread_percentage") == ["50.0"]


def test_a_daemon_killed_while_the_host_runs_is_started_again_by_the_host(host: MpsHost) -> None:
    agent = agent_daemons(host.root, NoDetachRunner())
    pipe, _ = agent.start("GPU-b")
    first = pid_of(pipe)
    agent.kill_all()
    wait_gone(first)
    assert agent.state("GPU-b") is DaemonState.CRASHED
    pipe, restarted = agent.start("GPU-b")
    assert restarted
    assert pid_of(pipe) != first


def test_the_host_runs_only_the_programs_it_knows(host: MpsHost) -> None:
    agent = MpsDaemons(host.root, ["/bin/sh"], NoDetachRunner(), ready_timeout_s=10, host_program="/bin/sh")
    with pytest.raises(BackendError, match=r"unknown MPS program '/bin/sh' \(this host runs: nvidia, standin\)"):
        agent.start("GPU-c")
    assert (host.root / "GPU-c" / LAUNCH_ERROR).exists()
    assert agent.state("GPU-c") is DaemonState.ABSENT


def test_an_error_caught_half_written_is_read_again_not_reported_empty(tmp_path: Path) -> None:
    """The host's reason appears whole (written aside, then renamed); an agent that still meets
    an empty file, as CI once did ("the MPS host could not: "), waits for the words."""
    agent = MpsDaemons(tmp_path / "mps", ["/bin/sh"], NoDetachRunner(), ready_timeout_s=10, host_program="nvidia")
    folder = agent.folder("GPU-e")
    folder.mkdir(parents=True)

    def host_writes_slowly() -> None:
        while not (folder / LAUNCH_REQUEST).exists():
            time.sleep(0.005)
        (folder / LAUNCH_ERROR).write_text("")  # opened, not yet written
        time.sleep(0.2)
        (folder / LAUNCH_ERROR).write_text("nvidia-cuda-mps-control: GPU-e is not in MPS-capable mode")

    writer = threading.Thread(target=host_writes_slowly)
    writer.start()
    with pytest.raises(BackendError, match=r"the MPS host could not: nvidia-cuda-mps-control: GPU-e is not"):
        agent.start("GPU-e")
    writer.join()


def test_the_host_writes_its_reason_whole(host: MpsHost) -> None:
    folder = host.root / "GPU-f"
    folder.mkdir(parents=True)
    (folder / LAUNCH_REQUEST).write_text('{"program": "/bin/sh"}')
    assert host.serve_once() == []
    assert "unknown MPS program '/bin/sh'" in (folder / LAUNCH_ERROR).read_text()
    assert sorted(p.name for p in folder.iterdir()) == [LAUNCH_ERROR], "no request and no half-written file left"


def test_without_a_host_the_agent_says_which_pod_to_look_for(tmp_path: Path) -> None:
    agent = agent_daemons(tmp_path / "mps", NoDetachRunner(), timeout=0.3)
    with pytest.raises(BackendTimeoutError, match="tessera-mps-host DaemonSet's Pod running on this node"):
        agent.start("GPU-d")
    assert not (tmp_path / "mps" / "GPU-d" / LAUNCH_REQUEST).exists(), "no request is left for a host that starts later"


def test_tessera_mps_host_serves_requests_until_sigterm(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    root = tmp_path / "mps"
    host = subprocess.Popen([sys.executable, "-m", "tessera", "mps-host", "--mps-root", str(root), "--log-json"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TESSERA_LOG_LEVEL": "info"})
    try:
        agent = agent_daemons(root, NoDetachRunner(), timeout=20)
        pipe, _ = agent.start("GPU-e", MpsDefaults(active_thread_percentage=10))
        assert control(pipe, "get_default_active_thread_percentage") == ["10.0"]
        host.send_signal(signal.SIGTERM)
        out, _ = host.communicate(timeout=20)
        assert host.returncode == 0, out
        assert b'"event": "started an MPS daemon"' in out
    finally:
        if host.poll() is None:
            host.kill()
        MpsDaemons(root, STANDIN_MPS_CONTROL).kill_all()
