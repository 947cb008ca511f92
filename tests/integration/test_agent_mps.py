"""MPS daemons under a real agent process against the real control plane: the daemon outlives
an agent that is killed and is adopted by the next one (same pid, nothing restarted); a daemon
that is killed is started again by the agent, counted in its metrics, with its defaults set
again; the status keeps saying MPS throughout."""

from __future__ import annotations

import json
import os
import signal
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.agent.backends.mps import PID_FILE, run_command
from tessera.agent.backends.simulated import STANDIN_MPS_CONTROL, simulated_gpu_uuid
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tests.integration.kube_helpers import get_or_none

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "crds" / "tessera.dev_nodelayouts.yaml"
LAYOUTS = "nodelayouts.tessera.dev"


@pytest.fixture
def processes(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TesseraProcesses]:
    cluster.apply(CRD)
    procs = TesseraProcesses(cluster, tmp_path_factory.mktemp("mps"))
    try:
        yield procs
    finally:
        for process in procs.processes:
            print(f"--- {process.name}\n{process.tail(40)}")
        procs.stop_all()


def start_agent(processes: TesseraProcesses, node: str) -> TesseraProcess:
    return processes.agent(node, "1xA100-80GB", ["--resync-seconds", "1", "--no-kubelet-plugin"])


def ready_generation(cluster: LocalCluster, node: str) -> int | None:
    layout = get_or_none(cluster, LAYOUTS, node) or {}
    status = layout.get("status", {})
    ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    return status.get("observedGeneration") if ready.get("status") == "True" else None


def gpu_status(cluster: LocalCluster, node: str) -> dict[str, Any]:
    layout = get_or_none(cluster, LAYOUTS, node) or {}
    gpus: list[dict[str, Any]] = layout.get("status", {}).get("gpus", [])
    return gpus[0] if gpus else {}


def daemon_pid(pipe: Path) -> int | None:
    try:
        return int((pipe / PID_FILE).read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def defaults(pipe: Path) -> list[str]:
    done = run_command(list(STANDIN_MPS_CONTROL), {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                       "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n")
    return done.stdout.splitlines()


async def test_the_daemon_outlives_the_agent_and_a_killed_daemon_is_restarted(
    cluster: LocalCluster, processes: TesseraProcesses
) -> None:
    node = f"mps-{uuidlib.uuid4().hex[:6]}"
    cluster.add_node(node)
    agent = start_agent(processes, node)
    await wait_for(lambda: gpu_status(cluster, node), timeout=90, message="the agent's first status")
    gpu = simulated_gpu_uuid(node, 0)
    mps = {"memory": {"default": "8Gi", "min": "1Gi", "step": "1Gi"}, "compute": {"default": 25}}
    out = cluster.kubectl("patch", LAYOUTS, node, "--type", "merge", "-o", "json", "-p",
                          json.dumps({"spec": {"gpus": [{"uuid": gpu, "strategy": "MPS", "mps": mps}]}}))
    generation = json.loads(out.stdout)["metadata"]["generation"]
    await wait_for(lambda: ready_generation(cluster, node) == generation, timeout=60, message="MPS applied")
    pipe = processes.node_folder(node) / "mps" / gpu / "pipe"
    first = daemon_pid(pipe)
    assert first is not None
    assert alive(first)
    assert gpu_status(cluster, node)["strategy"] == "MPS"
    assert defaults(pipe) == ["25.0", "8192M"], "a client that sets nothing gets 25% and 8 GiB"

    # The agent dies; its daemon does not, and the next agent adopts it.
    agent.kill()
    assert alive(first), "the daemon outlived the agent"
    agent = start_agent(processes, node)
    await wait_for(lambda: agent.metrics().get("tessera_agent_reconcile_passes_total{result=\"ok\"}", 0) >= 3,
                   timeout=90, message="three passes of the new agent")
    assert daemon_pid(pipe) == first, "adopted, not restarted"
    assert agent.metrics().get("tessera_agent_mps_daemon_restarts_total", 0) == 0

    # The daemon dies: the agent starts it again, says so, and sets its defaults again.
    os.kill(first, signal.SIGKILL)

    def restarted() -> int | None:
        pid = daemon_pid(pipe)
        return pid if pid is not None and pid != first and alive(pid) else None

    second = await wait_for(restarted, timeout=30, message="a new daemon")
    await wait_for(lambda: agent.metrics().get("tessera_agent_mps_daemon_restarts_total", 0) == 1, timeout=15,
                   message="the restart counted")
    assert defaults(pipe) == ["25.0", "8192M"]
    assert "an MPS daemon had died; restarted it" in agent.log.read_text()
    assert gpu_status(cluster, node)["strategy"] == "MPS"
    assert alive(second)
