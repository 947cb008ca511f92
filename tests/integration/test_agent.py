"""The node agent as a real process against the real control plane, with simulated GPUs: it
creates and fills its NodeLayout's status, applies a changed spec to the (simulated) hardware,
keeps an instance in use that the spec would remove and says why, serves /healthz and /metrics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera.agent.backends.simulated import SimulatedHardware, simulated_gpu_uuid
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import free_port, wait_for

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "crds" / "tessera.dev_nodelayouts.yaml"
RESOURCE = "nodelayouts.tessera.dev"


def _layout(cluster: LocalCluster, node: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", RESOURCE, node, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(out.stdout)
    return obj


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    conditions = obj.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def _set_spec(cluster: LocalCluster, node: str, gpus: list[dict[str, Any]]) -> int:
    out = cluster.kubectl(
        "patch", RESOURCE, node, "--type", "merge", "-o", "json", "-p", json.dumps({"spec": {"gpus": gpus}})
    )
    generation: int = json.loads(out.stdout)["metadata"]["generation"]
    return generation


@pytest.fixture
def agent_node(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """A Ready Node and its agent process (2 simulated H100s); yields (node, state file, port)."""
    cluster.apply(CRD)
    node = f"gpu-{uuidlib.uuid4().hex[:8]}"
    cluster.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    state = tmp_path / "gpus.json"
    port = free_port()
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "tessera.cli.agent",
                "--node-name", node,
                "--simulate", "2xH100-80GB",
                "--state-file", str(state),
                "--kubeconfig", str(cluster.kubeconfig),
                "--metrics-host", "127.0.0.1",
                "--metrics-port", str(port),
                "--resync-seconds", "1",
                "--mps-root", str(tmp_path / "mps"),
                "--log-json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield node, state, port
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        print(log_path.read_text()[-4000:])  # shown by pytest when the test failed
        assert code in (0, -15), f"the agent exited with {code}"


async def test_the_agent_reports_applies_and_keeps_what_is_in_use(
    cluster: LocalCluster, agent_node: tuple[str, Path, int]
) -> None:
    node, state, port = agent_node
    gpu0, gpu1 = simulated_gpu_uuid(node, 0), simulated_gpu_uuid(node, 1)

    # 1. The agent creates its NodeLayout, owned by the Node, and reports the inventory.
    def reported() -> dict[str, Any] | None:
        obj = _layout(cluster, node)
        return obj if obj and len(obj.get("status", {}).get("gpus", [])) == 2 else None

    obj = await wait_for(reported, timeout=60, message="the agent's inventory in NodeLayout.status")
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", node)
    status = obj["status"]
    assert status["backend"] == "simulated"
    assert [(g["uuid"], g["productName"], g["model"]) for g in status["gpus"]] == [
        (gpu0, "NVIDIA H100 80GB HBM3", "H100-80GB"),
        (gpu1, "NVIDIA H100 80GB HBM3", "H100-80GB"),
    ]
    assert all(g["migCapable"] and not g["migModeCurrent"] for g in status["gpus"])
    assert _condition(obj, "Ready")["status"] == "True"

    # 2. A new spec changes the simulated hardware and the status.
    generation = _set_spec(
        cluster, node,
        [{"uuid": gpu0, "strategy": "MIG", "migInstances": [
            {"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}],
    )

    def applied() -> dict[str, Any] | None:
        obj = _layout(cluster, node)
        if obj is None or obj.get("status", {}).get("observedGeneration") != generation:
            return None
        return obj if _condition(obj, "Ready").get("status") == "True" else None

    obj = await wait_for(applied, timeout=30, message="the MIG layout applied")
    g0 = obj["status"]["gpus"][0]
    assert g0["strategy"] == "MIG"
    assert g0["applied"] is True
    assert [(i["profile"], i["start"], i["inUse"]) for i in g0["migInstances"]] == [
        ("3g.40gb", 0, False), ("3g.40gb", 4, False)]
    hw = SimulatedHardware.open(state)
    gpu = hw.snapshot().gpus[0]
    assert gpu.mig_current
    assert [(i.profile_id, i.start) for i in gpu.instances] == [(9, 0), (9, 4)]
    # The lists are atomic (tessera.models.layout): the apiserver owns each side's list as one
    # field, not every field of every GPU and instance.
    stored = json.loads(cluster.kubectl("get", RESOURCE, node, "-o", "json", "--show-managed-fields").stdout)
    owned = {m["manager"] + m.get("subresource", ""): m["fieldsV1"] for m in stored["metadata"]["managedFields"]}
    status_fields = owned["Pythonstatus"]["f:status"]  # the agent's status writes
    assert (status_fields["f:gpus"], status_fields["f:conditions"]) == ({}, {})
    assert owned["kubectl-patch"]["f:spec"] == {"f:gpus": {}}  # this test's spec write

    # 3. A process on 3g.40gb at slice 4; a spec without it leaves it, and says why.
    busy = next(i for i in gpu.instances if i.start == 4)
    assert busy.uuid is not None
    hw.hold(busy.uuid, "pid:31337")
    generation = _set_spec(
        cluster, node, [{"uuid": gpu0, "strategy": "MIG", "migInstances": [{"profile": "7g.80gb", "start": 0}]}]
    )

    def blocked() -> dict[str, Any] | None:
        obj = _layout(cluster, node)
        if obj is None or obj.get("status", {}).get("observedGeneration") != generation:
            return None
        return obj if _condition(obj, "Ready").get("reason") == "InstanceInUse" else None

    obj = await wait_for(blocked, timeout=30, message="Ready=False with reason InstanceInUse")
    ready = _condition(obj, "Ready")
    assert ready["status"] == "False"
    assert "GPU 0: 3g.40gb at slice 4 is in use; the spec wants 7g.80gb at slice 0" in ready["message"]
    progressing = _condition(obj, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "InstanceInUse")
    g0 = obj["status"]["gpus"][0]
    assert g0["applied"] is False
    assert [(i["profile"], i["start"], i["inUse"]) for i in g0["migInstances"]] == [("3g.40gb", 4, True)]
    assert [(i.profile_id, i.start) for i in hw.snapshot().gpus[0].instances] == [(9, 4)]

    # 4. The process ends: the next resync finishes the layout.
    hw.release(busy.uuid, "pid:31337")
    obj = await wait_for(applied, timeout=30, message="the layout applied once the instance is free")
    assert [(i["profile"], i["start"]) for i in obj["status"]["gpus"][0]["migInstances"]] == [("7g.80gb", 0)]

    # 5. Health and metrics.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert r.status == 200
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            metrics = await r.text()
    assert 'tessera_agent_operations_total{kind="CreateInstance",result="ok"} 3.0' in metrics
    assert 'tessera_agent_gpus{health="Healthy"} 2.0' in metrics
    assert "tessera_agent_gpus_applied 2.0" in metrics

    # 6. Passes that find nothing changed write nothing: resync passes (every second here) go
    # by, and neither the status-write counter nor the object's version moves.
    def sample(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))

    async def scrape() -> str:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
            return await r.text()

    version = _layout(cluster, node)["metadata"]["resourceVersion"]  # type: ignore[index]
    before = await scrape()
    await asyncio.sleep(3.5)
    after = await scrape()
    passes = 'tessera_agent_reconcile_passes_total{result="ok"}'
    assert sample(after, passes) >= sample(before, passes) + 2, "resync passes went by"
    writes = "tessera_agent_status_writes_total"
    assert sample(after, writes) == sample(before, writes), "an unchanged status is not written again"
    assert _layout(cluster, node)["metadata"]["resourceVersion"] == version  # type: ignore[index]
