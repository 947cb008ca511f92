"""Pods really run on Tessera's devices: real nodes (a kubelet with its own containerd, runc and
CNI bridge each) beside the local control plane, the operator and each node's agent running as
the DaemonSet would (inside the node's mount namespace, the kubelet's plugin folders, the CDI
folder its containerd reads, simulated GPUs with device nodes). The kubelet calls the DRA
plugin, the runtime applies the CDI specs, and each container prints what it got; the tests
read that from ``kubectl logs``.

Needs root, runc and the CNI plugins (``.ci/run`` installs them); without them the module is
skipped with the reason, unless ``TESSERA_REQUIRE_REAL_NODES=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera.agent.backends.simulated import SimulatedHardware
from tessera.agent.nics.shaping import UplinkShaper, host_link_name, ifb_name, share_mac
from tessera.dra.nics import NIC_DRIVER, SHARED_NIC_CLASS, nic_device_name
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS, wait_for
from tessera.localcluster.fabric import Fabric
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.nodes import KUBELET_ROOT, SIMULATED_STATE_DIR, RealNode, real_nodes_possible
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim, show_devices_args
from tessera.models.quantity import parse_quantity

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ATTRS = 'device.attributes["gpu.tessera.dev"]'
NODE_A, NODE_B = "real-a", "real-b"
CHEAP = "cheap-c"  # a kubelet-less node (a Node object and a local agent) in the same cluster
SIMULATE = {NODE_A: "4xH100-80GB", NODE_B: "1xH200-141GB"}
# A GPU with a fault clears after 10 s without another (a reset needs an idle GPU; a Pod keeps it busy).
AGENT_FLAGS = ["--health-recovery-seconds", "10"]
# Node B's uplink: a veth in the host's network namespace (the nodes' own) whose far end sits in
# a namespace of this run playing the fabric; names unique per run (other runs share the machine).
_RUN = uuid.uuid4().hex[:6]
UPLINK = f"tu{_RUN}"
FABRIC_NETWORK, FABRIC_GATEWAY = "10.97.0.0/24", "10.97.0.1"  # shares get .2, .3, ... (spec.addresses)
FABRIC = Fabric(UPLINK, f"tf{_RUN}", f"tessera-fabric-{_RUN}", f"{FABRIC_GATEWAY}/24")
# The CDI hook runs on the node's host (the runtime's namespaces): this checkout's tessera command.
HOOK = str(Path(sys.executable).parent / "tessera")
NIC_FLAGS = {NODE_B: ["--nic-interfaces", UPLINK, "--nic-attach-executable", HOOK]}

_why_not = real_nodes_possible()
if _why_not and os.environ.get("TESSERA_REQUIRE_REAL_NODES") != "1":
    pytest.skip(f"no real nodes on this machine: {_why_not}", allow_module_level=True)


def policy(name: str, node: str, gpu_index: int | None, spec: dict[str, Any]) -> dict[str, Any]:
    selector = {"gpuSelector": {"cel": f"{ATTRS}.index == {gpu_index}"}} if gpu_index is not None else {}
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "SharingPolicy",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}}, **selector, **spec},
    }


MPS = {
    "memory": {"default": "4Gi", "min": "1Gi", "step": "1Gi"},
    "compute": {"default": 10, "values": [10, 25, 50, 100]},
}
POLICIES = [
    policy("real-whole", NODE_A, 0, {"strategy": "Exclusive"}),
    policy("real-mig", NODE_A, 1, {"strategy": "MIG", "mig": {"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}}),
    policy("real-mps", NODE_A, 2, {"strategy": "MPS", "mps": MPS}),
    policy("real-drain", NODE_A, 3, {"strategy": "Exclusive"}),
    policy("real-dynamic", NODE_B, None, {"strategy": "DynamicMIG"}),
    policy("cheap-whole", CHEAP, None, {"strategy": "Exclusive"}),
]


@dataclass
class RealCluster:
    cluster: LocalCluster
    processes: TesseraProcesses
    nodes: dict[str, RealNode]
    agents: dict[str, TesseraProcess]

    def restart_agent(self, node: str) -> TesseraProcess:
        self.agents[node].stop()
        self.processes.processes.remove(self.agents[node])
        self.agents[node] = self.processes.agent_on(self.nodes[node], SIMULATE[node],
                                                    AGENT_FLAGS + NIC_FLAGS.get(node, []))
        return self.agents[node]

    def hardware(self, node: str) -> SimulatedHardware:
        return SimulatedHardware.open(self.nodes[node].host_path(f"{SIMULATED_STATE_DIR}/simulated-gpus.json"))


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    started = time.monotonic()
    with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        processes = TesseraProcesses(cluster, tmp_path_factory.mktemp("real-nodes"))
        nodes: dict[str, RealNode] = {}
        try:
            FABRIC.make()
            for name in SIMULATE:
                nodes[name] = RealNode.start(cluster, name)
            processes.operator()
            agents = {name: processes.agent_on(node, SIMULATE[name], AGENT_FLAGS + NIC_FLAGS.get(name, []))
                      for name, node in nodes.items()}
            cluster.add_node(CHEAP)
            agents[CHEAP] = processes.agent(CHEAP, "1xA100-80GB")
            cluster.apply_objects(POLICIES)
            print(f"\nreal nodes up in {time.monotonic() - started:.1f}s")
            yield RealCluster(cluster, processes, nodes, agents)
        finally:
            processes.stop_all()
            for node in nodes.values():
                node.stop()
            FABRIC.remove(also=[ifb_name(UPLINK)])


@pytest.fixture
def namespace(real: RealCluster) -> str:
    name = f"r-{uuid.uuid4().hex[:8]}"
    real.cluster.kubectl("create", "namespace", name)
    return name


# -- helpers ---------------------------------------------------------------------------------


def get(real: RealCluster, *args: str) -> dict[str, Any]:
    return real.cluster.get_json(*args)


def pod_phase(real: RealCluster, namespace: str, pod: str) -> str:
    proc = real.cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
    return str(json.loads(proc.stdout)["status"].get("phase", "")) if proc.returncode == 0 else "Gone"


async def start_pods(real: RealCluster, namespace: str, node: str, template: dict[str, Any], names: list[str],
                     hold: int = 600, restart: str | None = None) -> None:
    pods = [pod_with_claim(n, namespace, template["metadata"]["name"], on_node(node), BUSYBOX_IMAGE,
                           show_devices_args(hold), restart_policy=restart) for n in names]
    real.cluster.apply_objects([template, *pods])
    wanted = {"Running", "Succeeded"}

    def started() -> bool:
        phases = [pod_phase(real, namespace, n) for n in names]
        if "Failed" in phases:
            raise AssertionError(f"a Pod failed: {dict(zip(names, phases, strict=True))}")
        return all(p in wanted for p in phases) and all("ready" in logs(real, namespace, n) for n in names)

    await wait_for(started, timeout=120, interval=0.5, message=f"{names} to run and print their devices")


def logs(real: RealCluster, namespace: str, pod: str) -> str:
    proc = real.cluster.kubectl("logs", pod, "-n", namespace, check=False)
    return proc.stdout if proc.returncode == 0 else ""


def seen(real: RealCluster, namespace: str, pod: str) -> tuple[dict[str, str], list[str]]:
    """What the container printed: its device variables and device nodes."""
    env: dict[str, str] = {}
    devices: list[str] = []
    for line in logs(real, namespace, pod).splitlines():
        if line.startswith("device "):
            devices.append(line.removeprefix("device "))
        elif "=" in line:
            key, _, value = line.partition("=")
            env[key] = value
    return env, sorted(devices)


def claim_results(real: RealCluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The pod's claim's allocation results; empty before the scheduler allocated it."""
    statuses = get(real, "pod", pod, "-n", namespace)["status"].get("resourceClaimStatuses") or [{}]
    if not statuses[0].get("resourceClaimName"):
        return []
    claim = get(real, "resourceclaim", statuses[0]["resourceClaimName"], "-n", namespace)
    return list((claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []))


def device_attr(real: RealCluster, node: str, device: str, attr: str) -> str:
    slices = get(real, "resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                value = d["attributes"][attr]
                return str(value.get("string", value.get("int", "")))
    raise AssertionError(f"no device {device} on {node}")


async def delete_pods(real: RealCluster, namespace: str, *pods: str) -> None:
    real.cluster.kubectl("delete", "pod", *pods, "-n", namespace, "--wait=false")
    await wait_for(lambda: all(pod_phase(real, namespace, p) == "Gone" for p in pods), timeout=90,
                   message=f"{pods} to be gone")


async def policy_ready(real: RealCluster, name: str) -> None:
    def ready() -> bool:
        body = get(real, "sharingpolicy", name)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in body.get("status", {}).get("conditions", []))

    await wait_for(ready, timeout=90, interval=0.5, message=f"policy {name} Ready")


def agent_events(agent: TesseraProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in agent.log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            out.append(record)
    return out


# -- tests -----------------------------------------------------------------------------------


async def test_a_whole_gpu_pod_runs_and_sees_its_gpu_uuid_and_device_node(real: RealCluster, namespace: str) -> None:
    await policy_ready(real, "real-whole")
    template = claim_template("whole", namespace, "whole-gpu.tessera.dev", f"{ATTRS}.index == 0")
    await start_pods(real, namespace, NODE_A, template, ["whole-0"])
    [result] = claim_results(real, namespace, "whole-0")
    gpu_uuid = device_attr(real, NODE_A, result["device"], "uuid")
    env, devices = seen(real, namespace, "whole-0")
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid
    assert env["CUDA_VISIBLE_DEVICES"] == gpu_uuid
    assert devices == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]
    await delete_pods(real, namespace, "whole-0")


def allocated_health(real: RealCluster, namespace: str, pod: str) -> list[tuple[str, str]]:
    """What the kubelet wrote in the Pod's ``allocatedResourcesStatus``: (health, message) per device."""
    statuses = get(real, "pod", pod, "-n", namespace)["status"].get("containerStatuses") or [{}]
    return [(r.get("health", ""), r.get("message", ""))
            for s in statuses[0].get("allocatedResourcesStatus") or [] for r in s.get("resources") or []]


async def test_an_unhealthy_gpu_shows_in_the_pods_allocated_resources_status_then_recovers(
    real: RealCluster, namespace: str
) -> None:
    await policy_ready(real, "real-whole")
    template = claim_template("health", namespace, "whole-gpu.tessera.dev", f"{ATTRS}.index == 0")
    await start_pods(real, namespace, NODE_A, template, ["health-0"])

    def health_is(want: str) -> list[tuple[str, str]] | None:
        seen_now = allocated_health(real, namespace, "health-0")
        return seen_now if [h for h, _ in seen_now] == [want] else None

    try:
        # The kubelet reads the plugin's health stream and writes it into the Pod's status.
        await wait_for(lambda: health_is("Healthy"), timeout=60, interval=0.5,
                       message="the kubelet to report the Pod's GPU Healthy")
        hardware = real.hardware(NODE_A)
        hardware.inject_xid(0, 79)
        [(_, message)] = await wait_for(lambda: health_is("Unhealthy"), timeout=60, interval=0.5,
                                        message="the XID to show as Unhealthy in the Pod's status")
        assert "79" in message, f"the kubelet passes on the plugin's reason: {message!r}"
        assert pod_phase(real, namespace, "health-0") == "Running", "a NoSchedule taint evicts nothing"
        await wait_for(lambda: health_is("Healthy"), timeout=60, interval=0.5,
                       message="the GPU Healthy again in the Pod's status after the quiet period")
    finally:  # GPU 0 is free again for the tests after this one, pass or fail
        await delete_pods(real, namespace, "health-0")


async def test_a_static_mig_pod_sees_exactly_its_mig_uuid(real: RealCluster, namespace: str) -> None:
    await policy_ready(real, "real-mig")
    cel = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "2g.20gb"'
    await start_pods(real, namespace, NODE_A, claim_template("mig", namespace, "mig.tessera.dev", cel), ["mig-0"])
    [result] = claim_results(real, namespace, "mig-0")
    mig_uuid = device_attr(real, NODE_A, result["device"], "uuid")
    assert mig_uuid.startswith("MIG-")
    env, devices = seen(real, namespace, "mig-0")
    assert env["NVIDIA_VISIBLE_DEVICES"] == mig_uuid
    assert env["CUDA_VISIBLE_DEVICES"] == mig_uuid
    assert "/dev/nvidia1" in devices  # the parent GPU's node
    await delete_pods(real, namespace, "mig-0")


async def test_a_dynamic_mig_instance_is_made_at_prepare_and_destroyed_after_the_pod_ends(
    real: RealCluster, namespace: str
) -> None:
    await policy_ready(real, "real-dynamic")
    hardware = real.hardware(NODE_B)
    assert [i for g in hardware.snapshot().gpus for i in g.instances] == []
    cel = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "3g.71gb"'
    template = claim_template("dyn", namespace, "mig.tessera.dev", cel)
    await start_pods(real, namespace, NODE_B, template, ["dyn-0"], hold=0, restart="Never")
    env, devices = seen(real, namespace, "dyn-0")
    made = [i for g in hardware.snapshot().gpus for i in g.instances]
    assert len(made) == 1
    assert env["NVIDIA_VISIBLE_DEVICES"] == made[0].uuid
    assert "/dev/nvidia0" in devices
    await wait_for(lambda: pod_phase(real, namespace, "dyn-0") == "Succeeded", timeout=60, message="dyn-0 done")
    # The Pod ended: the kubelet unprepares, the plugin destroys the instance it made.
    await wait_for(lambda: not [i for g in hardware.snapshot().gpus for i in g.instances], timeout=60,
                   message="the dynamic MIG instance to be destroyed after the Pod ended")
    await delete_pods(real, namespace, "dyn-0")


async def test_three_mps_pods_each_see_their_own_limits_from_consumed_capacity(
    real: RealCluster, namespace: str
) -> None:
    await policy_ready(real, "real-mps")
    asks = {"mps-10": ("10Gi", "10"), "mps-25": ("20Gi", "25"), "mps-50": ("30Gi", "50")}
    for pod, (memory, compute) in asks.items():
        template = claim_template(f"t-{pod}", namespace, "shared-gpu.tessera.dev",
                                  capacity={"memory": memory, "compute": compute})
        await start_pods(real, namespace, NODE_A, template, [pod])
    gpus = set()
    for pod, (memory, _) in asks.items():
        [result] = claim_results(real, namespace, pod)
        consumed = result["consumedCapacity"]
        assert parse_quantity(consumed["memory"]) == parse_quantity(memory)
        gpu_uuid = device_attr(real, NODE_A, result["device"], "uuid")
        gpus.add(gpu_uuid)
        env, devices = seen(real, namespace, pod)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(int(parse_quantity(consumed["compute"])))
        mib = int(parse_quantity(consumed["memory"]) // 2**20)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu_uuid}={mib}M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid
        assert "/dev/nvidia2" in devices
    assert len(gpus) == 1
    await delete_pods(real, namespace, *asks)


async def test_drain_waits_for_the_running_pod_and_repartitions_after_the_kubelet_unprepared(
    real: RealCluster, namespace: str
) -> None:
    await policy_ready(real, "real-drain")
    template = claim_template("drain", namespace, "whole-gpu.tessera.dev", f"{ATTRS}.index == 3")
    await start_pods(real, namespace, NODE_A, template, ["held-0"])
    hardware = real.hardware(NODE_A)
    gpu3 = hardware.snapshot().gpus[3]
    held_uid = get(real, "resourceclaim", get(real, "pod", "held-0", "-n", namespace)["status"]
                   ["resourceClaimStatuses"][0]["resourceClaimName"], "-n", namespace)["metadata"]["uid"]
    balanced = {"strategy": "MIG", "mig": {"preset": "all-balanced"}}
    real.cluster.apply_objects([policy("real-drain", NODE_A, 3, balanced)])

    def gpu3_devices() -> list[dict[str, Any]]:
        slices = get(real, "resourceslices", "--field-selector", f"spec.nodeName={NODE_A}")["items"]
        return [d for s in slices for d in s["spec"].get("devices") or [] if d["name"].startswith("gpu-3")]

    # The operator taints the GPU's published device and waits: the GPU is left as it is.
    await wait_for(lambda: any(d.get("taints") for d in gpu3_devices()), timeout=60, message="gpu-3 tainted")
    await asyncio.sleep(3)  # a window in which nothing may change while the Pod runs
    assert pod_phase(real, namespace, "held-0") == "Running"
    assert hardware.snapshot().gpus[3].instances == gpu3.instances == []

    real.cluster.kubectl("delete", "pod", "held-0", "-n", namespace, "--wait=false")
    await wait_for(lambda: pod_phase(real, namespace, "held-0") == "Gone", timeout=60, message="held-0 gone")
    gone = time.monotonic()
    await wait_for(lambda: any("mig" in d["name"] for d in gpu3_devices()), timeout=90, interval=0.1,
                   message="gpu-3's MIG devices published")
    print(f"\ndrain: Pod gone -> new devices published in {time.monotonic() - gone:.2f}s")
    assert hardware.snapshot().gpus[3].instances, "the new layout was applied"
    agent = real.agents[NODE_A]
    [unprepared] = [e for e in agent_events(agent, "claim unprepared") if e.get("uid") == held_uid]
    changes = [e for e in agent_events(agent, "operation done") if str(e.get("operation", "")).startswith("GPU 3:")]
    assert changes, "the agent changed GPU 3"
    assert unprepared["timestamp"] < min(e["timestamp"] for e in changes), "GPU 3 changed before the kubelet unprepared"


async def test_an_agent_restart_keeps_the_pod_running_and_its_partition(real: RealCluster, namespace: str) -> None:
    await policy_ready(real, "real-mig")
    cel = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "3g.40gb"'
    await start_pods(real, namespace, NODE_A, claim_template("keep", namespace, "mig.tessera.dev", cel), ["keep-0"])
    before = get(real, "pod", "keep-0", "-n", namespace)["status"]["containerStatuses"][0]
    instances = [(i.uuid, i.start, i.profile_id) for i in real.hardware(NODE_A).snapshot().gpus[1].instances]
    agent = real.restart_agent(NODE_A)
    await wait_for(lambda: agent_events(agent, "registered with the kubelet"), timeout=60,
                   message="the restarted agent's plugin to be registered again by the kubelet")
    # The re-registered plugin serves the kubelet: a new Pod on the node gets its device.
    cel2 = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "1g.10gb"'
    await start_pods(real, namespace, NODE_A, claim_template("after", namespace, "mig.tessera.dev", cel2),
                     ["after-0"])
    now = get(real, "pod", "keep-0", "-n", namespace)["status"]["containerStatuses"][0]
    assert now["state"].get("running")
    assert now["restartCount"] == 0
    assert now["containerID"] == before["containerID"]
    assert [(i.uuid, i.start, i.profile_id) for i in real.hardware(NODE_A).snapshot().gpus[1].instances] == instances
    await delete_pods(real, namespace, "keep-0", "after-0")


async def test_a_kubelet_restart_prepares_nothing_twice_and_loses_nothing(real: RealCluster, namespace: str) -> None:
    await policy_ready(real, "real-dynamic")
    cel = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "2g.35gb"'
    await start_pods(real, namespace, NODE_B, claim_template("kr", namespace, "mig.tessera.dev", cel), ["kr-0"])
    agent = real.agents[NODE_B]
    uid = get(real, "resourceclaim", get(real, "pod", "kr-0", "-n", namespace)["status"]["resourceClaimStatuses"][0]
              ["resourceClaimName"], "-n", namespace)["metadata"]["uid"]
    before = get(real, "pod", "kr-0", "-n", namespace)["status"]["containerStatuses"][0]
    made = [i.uuid for g in real.hardware(NODE_B).snapshot().gpus for i in g.instances]
    node = real.nodes[NODE_B]
    registered = len(agent_events(agent, "registered with the kubelet"))
    node.stop_kubelet()
    node.start_kubelet()
    node.wait_ready(time.monotonic() + 90)
    await wait_for(lambda: len(agent_events(agent, "registered with the kubelet")) > registered, timeout=60,
                   message="the plugin registered with the restarted kubelet")
    await asyncio.sleep(5)  # let the restarted kubelet sync its Pods (a wrong sync would restart one)
    now = get(real, "pod", "kr-0", "-n", namespace)["status"]["containerStatuses"][0]
    assert now["containerID"] == before["containerID"]
    assert now["restartCount"] == 0
    assert len([e for e in agent_events(agent, "claim prepared") if e.get("uid") == uid]) == 1
    assert [i.uuid for g in real.hardware(NODE_B).snapshot().gpus for i in g.instances] == made
    assert re.search(r"NVIDIA_VISIBLE_DEVICES=MIG-", logs(real, namespace, "kr-0"))
    await delete_pods(real, namespace, "kr-0")


async def test_real_and_kubelet_less_nodes_mix_in_one_cluster(real: RealCluster, namespace: str) -> None:
    await policy_ready(real, "cheap-whole")
    await policy_ready(real, "real-whole")
    cheap = claim_template("cheap", namespace, "whole-gpu.tessera.dev")
    real.cluster.apply_objects([cheap, pod_with_claim("cheap-0", namespace, "cheap", on_node(CHEAP), BUSYBOX_IMAGE,
                                                      show_devices_args(600))])
    await wait_for(lambda: get(real, "pod", "cheap-0", "-n", namespace)["status"].get("resourceClaimStatuses"),
                   timeout=60, message="cheap-0's claim")
    await wait_for(lambda: claim_results(real, namespace, "cheap-0"), timeout=60, message="cheap-0 allocated",
                   interval=0.5)
    [result] = claim_results(real, namespace, "cheap-0")
    assert result["pool"] == CHEAP
    template = claim_template("whole", namespace, "whole-gpu.tessera.dev", f"{ATTRS}.index == 0")
    await start_pods(real, namespace, NODE_A, template, ["beside-0"])
    assert pod_phase(real, namespace, "cheap-0") == "Pending", "no kubelet runs it: it stays bound and Pending"
    real.cluster.kubectl("delete", "pod", "cheap-0", "-n", namespace, "--grace-period=0", "--force")
    await delete_pods(real, namespace, "beside-0")


# -- shared NICs -----------------------------------------------------------------------------


def nic_policy() -> dict[str, Any]:
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NetworkSharingPolicy",
        "metadata": {"name": "real-nic"},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE_B}}, "interfaces": [UPLINK],
                 "lineRate": "10G", "share": {"default": "1G", "min": "1G", "step": "1G"},
                 "addresses": {"cidr": FABRIC_NETWORK}},
    }


def host_share_pieces(shaper: UplinkShaper) -> dict[str, Any]:
    """What of shares exists in the host's namespace: classes and filters on the uplink and its
    ifb, our macvlans, the ifb itself (read off the test's event loop: pyroute2 runs one of its own)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(_host_share_pieces, shaper).result()


def _host_share_pieces(shaper: UplinkShaper) -> dict[str, Any]:
    ifb = ifb_name(UPLINK)
    return {"uplink classes": shaper.class_minors(UPLINK), "ifb classes": shaper.class_minors(ifb),
            "uplink filters": shaper.filter_prios(UPLINK), "ifb filters": shaper.filter_prios(ifb),
            "macvlans": shaper.host_links(), "ifb": Path(f"/sys/class/net/{ifb}").exists()}


NOTHING = {"uplink classes": set(), "ifb classes": set(), "uplink filters": set(), "ifb filters": set(),
           "macvlans": set(), "ifb": False}
# The container's first act is to list its interfaces.
SHOW_INTERFACES = ["sh", "-c", "ls /sys/class/net; ip -o link; ip -o -4 addr show net1; "
                   f"ping -c 1 -W 5 {FABRIC_GATEWAY} >/dev/null && echo fabric reached; echo ready; exec sleep 600"]


async def test_a_nic_share_pod_sees_net1_at_its_first_instruction_and_leaves_nothing_behind(
    real: RealCluster, namespace: str
) -> None:
    real.cluster.apply_objects([nic_policy()])
    await wait_for(lambda: any(d["name"] == nic_device_name(UPLINK) for s in get(
        real, "resourceslices", "--field-selector", f"spec.nodeName={NODE_B},spec.driver={NIC_DRIVER}")["items"]
        for d in s["spec"].get("devices") or []), timeout=90, interval=0.5, message="the uplink's NIC device")
    shaper = UplinkShaper()
    assert host_share_pieces(shaper) == NOTHING
    template = claim_template("nic", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "2G"})
    pod = pod_with_claim("nic-0", namespace, "nic", on_node(NODE_B), BUSYBOX_IMAGE, SHOW_INTERFACES)
    real.cluster.apply_objects([template, pod])
    await wait_for(lambda: pod_phase(real, namespace, "nic-0") == "Running" and "ready" in logs(
        real, namespace, "nic-0"), timeout=120, interval=0.5, message="nic-0 running and printing its interfaces")
    [result] = claim_results(real, namespace, "nic-0")
    claim = get(real, "pod", "nic-0", "-n", namespace)["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    uid = get(real, "resourceclaim", claim, "-n", namespace)["metadata"]["uid"]
    printed = logs(real, namespace, "nic-0").splitlines()
    listed = printed[:printed.index(next(line for line in printed if ": " in line))]
    assert sorted(listed) == ["eth0", "lo", "net1"], f"the first thing the container saw: {printed}"
    [net1] = [line for line in printed if re.match(r"\d+: net1@", line)]
    assert share_mac(uid, result["shareID"]) in net1, net1
    assert ",UP" in net1, net1
    assert any(re.match(r"\d+: net1\s+inet 10\.97\.0\.2/24", line) for line in printed), printed  # spec.addresses
    assert "fabric reached" in printed, "net1 carries the Pod's traffic over the uplink"
    [entry] = [d for d in get(real, "resourceclaim", claim, "-n", namespace)["status"]["devices"]
               if d["driver"] == NIC_DRIVER]
    assert entry["networkData"] == {"interfaceName": "net1", "hardwareAddress": share_mac(uid, result["shareID"]),
                                    "ips": ["10.97.0.2/24"]}
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
    here = host_share_pieces(shaper)
    [minor] = here["uplink classes"]
    assert here == {**NOTHING, "uplink classes": {minor}, "ifb classes": {minor},
                                          "uplink filters": {minor}, "ifb filters": {minor}, "ifb": True}, here
    assert host_link_name(uid, result["shareID"]) not in here["macvlans"], "the macvlan moved into the Pod"
    shown = await asyncio.to_thread(subprocess.run, ["tc", "class", "show", "dev", UPLINK], capture_output=True,
                                    text=True, check=True)
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith(f"class htb 1:{minor:x} root")]
    assert "rate 2Gbit ceil 2Gbit" in line, line

    await delete_pods(real, namespace, "nic-0")
    await wait_for(lambda: host_share_pieces(shaper) == NOTHING, timeout=60, interval=0.5,
                   message="no macvlan, class, filter or ifb left after the Pod was deleted")


async def test_a_pod_with_three_nic_claims_sees_net1_net2_and_the_name_its_claim_gave(
    real: RealCluster, namespace: str
) -> None:
    """The kubelet prepares the Pod's three claims in one call: the unnamed shares are numbered
    across it in the Pod's order, the third is named by its claim's NicShareConfig."""
    real.cluster.apply_objects([nic_policy()])
    named = claim_template("nic-named", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "1G"})
    named["spec"]["spec"]["devices"]["config"] = [{"opaque": {"driver": NIC_DRIVER, "parameters": {
        "apiVersion": "nic.tessera.dev/v1alpha1", "kind": "NicShareConfig", "interfaceName": "storage0"}}}]
    templates = [claim_template(f"nic-{c}", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "1G"}) for c in "ab"]
    pod = pod_with_claim("nic-3", namespace, "nic-a", on_node(NODE_B), BUSYBOX_IMAGE, SHOW_INTERFACES)
    pod["spec"]["resourceClaims"] = [{"name": n, "resourceClaimTemplateName": f"nic-{n}"} for n in ("a", "b", "named")]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": n} for n in ("a", "b", "named")]
    real.cluster.apply_objects([*templates, named, pod])
    await wait_for(lambda: pod_phase(real, namespace, "nic-3") == "Running" and "ready" in logs(
        real, namespace, "nic-3"), timeout=120, interval=0.5, message="nic-3 running and printing its interfaces")
    printed = logs(real, namespace, "nic-3").splitlines()
    listed = printed[:printed.index(next(line for line in printed if ": " in line))]
    assert sorted(listed) == ["eth0", "lo", "net1", "net2", "storage0"], f"the first thing the container saw: {printed}"
    by_claim = {}
    for status in get(real, "pod", "nic-3", "-n", namespace)["status"]["resourceClaimStatuses"]:
        claim = get(real, "resourceclaim", status["resourceClaimName"], "-n", namespace)
        [entry] = [d for d in claim["status"]["devices"] if d["driver"] == NIC_DRIVER]
        by_claim[status["name"]] = entry["networkData"]["interfaceName"]
        [line] = [ln for ln in printed if re.match(rf"\d+: {by_claim[status['name']]}@", ln)]
        assert entry["networkData"]["hardwareAddress"] in line, (status["name"], line)
    assert by_claim == {"a": "net1", "b": "net2", "named": "storage0"}
    await delete_pods(real, namespace, "nic-3")
    shaper = UplinkShaper()
    await wait_for(lambda: host_share_pieces(shaper) == NOTHING, timeout=60, interval=0.5,
                   message="nothing left after the Pod was deleted")


async def test_an_uplink_that_goes_down_is_tainted_by_its_link_event_and_cleared_when_back(
    real: RealCluster, namespace: str
) -> None:
    """The agent hears the link go down from the kernel and reports it at once: the device is
    tainted long before the agent's 30 s resync would have read the link, and clears the same way."""
    real.cluster.apply_objects([nic_policy()])

    def taints() -> list[dict[str, Any]] | None:
        slices = get(real, "resourceslices", "--field-selector", f"spec.nodeName={NODE_B},spec.driver={NIC_DRIVER}")
        found = [d for s in slices["items"] for d in s["spec"].get("devices") or []
                 if d["name"] == nic_device_name(UPLINK)]
        return found[0].get("taints") or [] if found else None

    await wait_for(lambda: taints() == [], timeout=90, interval=0.5, message="the uplink's device, untainted")
    try:
        started = time.monotonic()
        await asyncio.to_thread(FABRIC.set_uplink, False)
        [taint] = await wait_for(taints, timeout=15, interval=0.1, message="the link taint, before the resync")
        print(f"\nlink down -> device tainted in {time.monotonic() - started:.2f}s")
        assert (taint["key"], taint["value"], taint["effect"]) == ("nic.tessera.dev/link", "Down", "NoSchedule")
    finally:
        await asyncio.to_thread(FABRIC.set_uplink, True)
    await wait_for(lambda: taints() == [], timeout=15, interval=0.1, message="the taint cleared when the link is back")


def nic_conditions(real: RealCluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The conditions of the pod's claim's nic.tessera.dev entries in ``status.devices``."""
    statuses = get(real, "pod", pod, "-n", namespace)["status"].get("resourceClaimStatuses") or [{}]
    if not statuses[0].get("resourceClaimName"):
        return []
    claim = get(real, "resourceclaim", statuses[0]["resourceClaimName"], "-n", namespace)
    return [c for d in (claim.get("status") or {}).get("devices") or [] if d["driver"] == NIC_DRIVER
            for c in d.get("conditions") or []]


async def test_a_failed_attach_is_reported_on_the_claim_and_leaves_the_share_as_prepared(
    real: RealCluster, namespace: str
) -> None:
    """A hostNetwork Pod has no network namespace of its own to take net1: the hook refuses."""
    real.cluster.apply_objects([nic_policy()])
    shaper = UplinkShaper()
    template = claim_template("nic-host", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "1G"})
    pod = pod_with_claim("nic-host-0", namespace, "nic-host", on_node(NODE_B), BUSYBOX_IMAGE, SHOW_INTERFACES)
    pod["spec"]["hostNetwork"] = True
    real.cluster.apply_objects([template, pod])

    def failed() -> list[dict[str, Any]]:
        return [c for c in nic_conditions(real, namespace, "nic-host-0") if c["reason"] == "AttachFailed"]

    [condition] = await wait_for(failed, timeout=120, interval=0.5, message="AttachFailed on the claim")
    assert condition["status"] == "False"
    assert "host's network namespace" in condition["message"], condition
    [status] = get(real, "pod", "nic-host-0", "-n", namespace)["status"]["containerStatuses"]
    assert "running" not in status["state"], status
    [result] = claim_results(real, namespace, "nic-host-0")
    uid = get(real, "resourceclaim", get(real, "pod", "nic-host-0", "-n", namespace)["status"]
              ["resourceClaimStatuses"][0]["resourceClaimName"], "-n", namespace)["metadata"]["uid"]
    here = host_share_pieces(shaper)
    assert here["macvlans"] == {host_link_name(uid, result["shareID"])}, "the share is as prepared, in the host"
    assert "net1" not in os.listdir("/sys/class/net"), "nothing renamed or brought up in the host"
    operstate = await asyncio.to_thread(Path(f"/sys/class/net/{host_link_name(uid, result['shareID'])}/operstate")
                                        .read_text)
    assert operstate.strip() == "down"

    await delete_pods(real, namespace, "nic-host-0")
    await wait_for(lambda: host_share_pieces(shaper) == NOTHING, timeout=60, interval=0.5,
                   message="nothing left after the Pod was deleted")
# -- a node reboot ---------------------------------------------------------------------------


def published(real: RealCluster, node: str) -> dict[str, bool]:
    """Device name -> whether it carries a taint, of every device published for ``node``."""
    slices = get(real, "resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    return {d["name"]: bool(d.get("taints")) for s in slices for d in s["spec"].get("devices") or []}


def running_since(real: RealCluster, namespace: str, pod: str, after: str) -> bool:
    """The Pod's container runs, started again after ``after`` (its previous container ID)."""
    statuses = get(real, "pod", pod, "-n", namespace)["status"].get("containerStatuses") or [{}]
    return bool(statuses[0].get("state", {}).get("running")) and statuses[0].get("containerID") not in (None, after)


async def test_a_node_reboot_brings_back_the_layout_the_devices_and_the_pods_and_forgets_the_rest(
    real: RealCluster, namespace: str
) -> None:
    from tessera.agent.backends.simreboot import power_cycle
    from tessera.agent.plugin.checkpoint import load_checkpoint

    for name in ("real-whole", "real-mig", "real-mps"):
        await policy_ready(real, name)
    node = real.nodes[NODE_A]
    mig = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "3g.40gb"'
    small = f'has({ATTRS}.migProfile) && {ATTRS}.migProfile == "1g.10gb"'
    await start_pods(real, namespace, NODE_A, claim_template("rb-mig", namespace, "mig.tessera.dev", mig), ["rb-mig"])
    mps = claim_template("rb-mps", namespace, "shared-gpu.tessera.dev", f'{ATTRS}.sharing == "MPS"', {"memory": "4Gi"})
    await start_pods(real, namespace, NODE_A, mps, ["rb-mps"])
    await start_pods(real, namespace, NODE_A, claim_template("rb-gone", namespace, "mig.tessera.dev", small),
                     ["rb-gone"])
    before = published(real, NODE_A)
    assert before
    assert not any(before.values())
    containers = {p: get(real, "pod", p, "-n", namespace)["status"]["containerStatuses"][0]["containerID"]
                  for p in ("rb-mig", "rb-mps")}
    gone_claim = get(real, "pod", "rb-gone", "-n", namespace)["metadata"]["uid"]
    layout_before = sorted((i.profile_id, i.start) for i in real.hardware(NODE_A).snapshot().gpus[1].instances)
    assert layout_before, "the MIG layout exists before the reboot"

    def while_off() -> None:
        # The Pod deleted while its node is down never comes back (forced: no kubelet answers).
        real.cluster.kubectl("delete", "pod", "rb-gone", "-n", namespace, "--grace-period=0", "--force")
        power_cycle(real.hardware(NODE_A))
        dev = node.host_path(f"{SIMULATED_STATE_DIR}/dev")
        for entry in dev.iterdir() if dev.is_dir() else []:
            entry.unlink()  # device nodes as at boot: the driver makes them when it loads (the agent here)

    started = time.monotonic()
    await asyncio.to_thread(node.reboot, while_off)
    assert real.hardware(NODE_A).snapshot().gpus[1].instances == [], "the reboot took the MIG instances"
    booted = time.monotonic()
    agent = real.restart_agent(NODE_A)  # the DaemonSet's Pod starts again on the rebooted node

    def all_published_again() -> bool:
        # The devices the operator publishes exist again: the agent re-made the layout on the reset
        # GPUs (the slices alone would not tell: while the node is down they keep what the agent
        # last reported, and the re-made instances get the same names and UUIDs).
        remade = [(i.profile_id, i.start) for i in real.hardware(NODE_A).snapshot().gpus[1].instances]
        return sorted(remade) == layout_before and published(real, NODE_A) == before

    await wait_for(all_published_again, timeout=180, interval=0.5,
                   message="every device of the node published again, untainted")
    republished = time.monotonic()
    for pod, previous in containers.items():
        try:
            await wait_for(lambda p=pod, c=previous: running_since(real, namespace, p, c), timeout=180, interval=1,
                           message=f"{pod} running again after the reboot")
        except TimeoutError as error:
            status = json.dumps(get(real, "pod", pod, "-n", namespace)["status"].get("containerStatuses"))[:1500]
            events = real.cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                          f"involvedObject.name={pod}", check=False).stdout[-2500:]
            kubelet = (node.folder / "logs" / "kubelet.log").read_text(errors="replace").splitlines()
            raise AssertionError(f"{error}\n{status}\n{events}\nkubelet:\n" + "\n".join(
                line[:400] for line in kubelet[-40:]) + f"\nagent:\n{agent.tail(30)}") from error
    pods_back = time.monotonic()
    print(f"\nreboot of {NODE_A}: kubelet and containerd back {booted - started:.1f}s, layout re-made and every "
          f"device published again {republished - started:.1f}s, Pods running again {pods_back - started:.1f}s "
          "after the reboot began")

    # The Pods got their devices again: fresh CDI specs, the layout's instances, an MPS daemon.
    hardware = real.hardware(NODE_A).snapshot()
    mig_uuids = {i.uuid for i in hardware.gpus[1].instances}
    env, devices = seen(real, namespace, "rb-mig")
    assert env["NVIDIA_VISIBLE_DEVICES"] in mig_uuids, (env, mig_uuids)
    assert devices
    env, _ = seen(real, namespace, "rb-mps")
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["NVIDIA_VISIBLE_DEVICES"] == hardware.gpus[2].uuid
    assert list(node.host_path("/run/tessera/mps").glob(f"{hardware.gpus[2].uuid}/pipe/control")), "MPS runs again"

    # Nothing of the Pod that did not come back: not in the checkpoint, no CDI spec, no hold.
    claims = {p: get(real, "pod", p, "-n", namespace)["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
              for p in containers}
    uids = {get(real, "resourceclaim", c, "-n", namespace)["metadata"]["uid"] for c in claims.values()}
    checkpoint = load_checkpoint(node.host_path(f"{KUBELET_ROOT}/plugins/gpu.tessera.dev/checkpoint.json"))
    assert checkpoint is not None
    assert set(checkpoint.claims) == uids, "only the claims of the Pods that came back are prepared"
    specs = {p.name for p in node.host_path("/var/run/cdi").glob("*.json")}
    assert all(any(uid in name for uid in uids) for name in specs), specs
    assert len(specs) == len(uids)
    holders = {holder for held in hardware.holds.values() for holder in held}
    assert holders <= uids, f"holds after the reboot: {hardware.holds}"
    assert gone_claim not in holders
    assert agent_events(agent, "the node rebooted since the checkpoint was written: its claims are no longer prepared")

    # The operator's view converges: every policy of the node is Ready again.
    for name in ("real-whole", "real-mig", "real-mps", "real-drain"):
        await policy_ready(real, name)
    await delete_pods(real, namespace, *containers)
