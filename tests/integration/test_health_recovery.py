"""GPU health end to end, with the real operator and agent processes on the real control plane:
a fatal XID → NodeLayout status Unhealthy → the GPU's devices tainted in the ResourceSlice (and
Unhealthy on the kubelet's health stream) → recovery → status Healthy → taint gone. Recovery
both ways: a GPU reset (the driver reports it; the probe passes), and the quiet period
(``--health-recovery-seconds``) with no reset at all. A lost GPU is tainted until it answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tessera.agent.backends.simulated import SimulatedHardware
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2 as pb
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2_grpc as pb_grpc
from tessera.dra.devices import UNHEALTHY_TAINT_KEY
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tests.integration.kube_helpers import apply, get_or_none, node_devices

pytestmark = pytest.mark.integration

LABEL = "tessera.dev/test"


@pytest.fixture(scope="module")
def policy(cluster: LocalCluster, tessera: TesseraProcesses) -> Iterator[str]:
    """Whole GPUs on the nodes of this module (the operator comes from conftest.py)."""
    apply(cluster, {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "SharingPolicy",
        "metadata": {"name": "health-whole"},
        "spec": {"nodeSelector": {"matchLabels": {LABEL: "health"}}, "strategy": "Exclusive"},
    })
    try:
        yield "health-whole"
    finally:
        for process in tessera.processes:  # shown by pytest when a test failed
            print(f"--- {process.name}\n{process.tail(60)}")
        cluster.kubectl("delete", "sharingpolicy", "health-whole", "--wait=false", check=False)


async def start_node(
    cluster: LocalCluster, tessera: TesseraProcesses, node: str, recovery_s: float
) -> SimulatedHardware:
    """A node and its agent (2 simulated H100s, resync 1 s); returns its simulated hardware."""
    cluster.add_node(node, labels={LABEL: "health"})
    tessera.agent(node, "2xH100-80GB", ["--resync-seconds", "1", "--health-recovery-seconds", str(recovery_s)])
    state = tessera.node_folder(node) / "simulated-gpus.json"
    await wait_for(state.exists, timeout=60, message=f"the agent of {node} to create {state}")
    return SimulatedHardware.open(state)


def gpu_health(cluster: LocalCluster, node: str, index: int) -> str | None:
    layout = get_or_none(cluster, "nodelayouts.tessera.dev", node)
    gpus = (layout or {}).get("status", {}).get("gpus", [])
    return next((g["health"] for g in gpus if g["index"] == index), None)


def taints(cluster: LocalCluster, node: str, device: str) -> list[dict[str, Any]] | None:
    """The device's taints as published; None while the device is not published."""
    found = node_devices(cluster, node).get(device)
    return None if found is None else list(found.get("taints") or [])


async def wait_state(
    cluster: LocalCluster, node: str, device: str, health: str, tainted: bool, what: str, timeout: float = 60
) -> None:
    def reached() -> bool:
        t = taints(cluster, node, device)
        has = t is not None and any(x["key"] == UNHEALTHY_TAINT_KEY for x in t)
        return gpu_health(cluster, node, int(device.split("-")[1])) == health and t is not None and has == tainted

    await wait_for(reached, timeout=timeout, message=what)


async def read_until(stream: Any, device: str, health: int, messages: int = 5) -> dict[str, int]:
    """Read the health stream until ``device`` has ``health`` (a refresh may come first)."""
    for _ in range(messages):
        message = await asyncio.wait_for(stream.read(), 15)
        seen = {d.device.device_name: d.health for d in message.devices}
        if seen.get(device) == health:
            return seen
    raise AssertionError(f"{device} never reported {pb.HealthStatus.Name(health)} on the stream")


async def test_a_fatal_xid_taints_the_gpu_until_a_reset_clears_it(
    cluster: LocalCluster, tessera: TesseraProcesses, policy: str
) -> None:
    node = "h-reset"  # short: unix socket paths under the node's folder are limited to 107 bytes
    hw = await start_node(cluster, tessera, node, recovery_s=0)  # 0: only a reset clears it
    await wait_state(cluster, node, "gpu-1", "Healthy", False, "gpu-1 published, healthy and untainted", 180)
    socket = tessera.node_folder(node) / "plugins" / "gpu.tessera.dev" / "dra.sock"

    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stream = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
        first = await asyncio.wait_for(stream.read(), 10)
        assert {d.device.device_name: d.health for d in first.devices} == {"gpu-0": pb.HEALTHY, "gpu-1": pb.HEALTHY}

        hw.inject_xid(1, 79)
        assert await read_until(stream, "gpu-1", pb.UNHEALTHY) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.UNHEALTHY}
        await wait_state(cluster, node, "gpu-1", "Unhealthy", True, "gpu-1 Unhealthy in status and tainted")
        taint = next(t for t in taints(cluster, node, "gpu-1") or [] if t["key"] == UNHEALTHY_TAINT_KEY)
        assert (taint["value"], taint["effect"]) == ("Unhealthy", "NoSchedule")
        assert taints(cluster, node, "gpu-0") == [], "only the GPU with the XID"

        await asyncio.sleep(3)  # resync passes go by: no quiet period, so it stays
        assert gpu_health(cluster, node, 1) == "Unhealthy"

        hw.reset_gpu(1)
        await wait_state(cluster, node, "gpu-1", "Healthy", False, "gpu-1 Healthy and the taint gone after the reset")
        assert await read_until(stream, "gpu-1", pb.HEALTHY, messages=10) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.HEALTHY}


async def test_an_unhealthy_gpu_clears_after_the_quiet_period_and_a_lost_one_when_it_answers(
    cluster: LocalCluster, tessera: TesseraProcesses, policy: str
) -> None:
    node = "h-quiet"
    hw = await start_node(cluster, tessera, node, recovery_s=4)
    await wait_state(cluster, node, "gpu-0", "Healthy", False, "gpu-0 published, healthy", 180)

    hw.inject_ecc_error(0)
    await wait_state(cluster, node, "gpu-0", "Unhealthy", True, "gpu-0 Unhealthy and tainted after an ECC error")
    await wait_state(cluster, node, "gpu-0", "Healthy", False, "gpu-0 clear again after 4 s without an error")

    hw.lose_gpu(1)
    await wait_state(cluster, node, "gpu-1", "Lost", True, "gpu-1 Lost and tainted")
    await asyncio.sleep(6)  # longer than the quiet period: a lost GPU waits for an answer, not for time
    assert gpu_health(cluster, node, 1) == "Lost"
    hw.reset_gpu(1)
    await wait_state(cluster, node, "gpu-1", "Healthy", False, "gpu-1 answers again: Healthy, untainted")
