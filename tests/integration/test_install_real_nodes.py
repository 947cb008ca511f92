"""The install, for real: Tessera's image built from the Dockerfile without Docker (buildah on
a Debian-made base), imported into a real node's containerd, ``kubectl apply -f
manifests/install.yaml``, the simulated backend chosen by the documented patch
(``e2e/local/simulated-agent.yaml``). The operator Deployment and the agent DaemonSet run as
Pods with the shipped RBAC, admission policy, host paths and probes; the sample policies and
the sample workloads (``e2e/local/samples``: the same claims, a local image) reach Running and
print the devices they got. Then, on that install, MPS daemons (started by the
``tessera-mps-host`` Pod) and an MPS client outlive a kill of the agent's container and a
rolling update of the agent DaemonSet, and a new MPS client starts after them.

Needs root, runc, the CNI plugins, buildah and mmdebstrap (``.ci/run`` installs them);
skipped with the reason where they are missing, unless ``TESSERA_REQUIRE_REAL_NODES=1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera import INSTALL_NAMESPACE
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS, wait_for
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.ownimage import IMAGE, build_own_image, own_image_possible
from tessera.manifests import load_documents

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE = "install-real"
FORBIDDEN = re.compile(r"forbidden|\b403\b", re.IGNORECASE)

_why_not = real_nodes_possible() or own_image_possible()
if _why_not and os.environ.get("TESSERA_REQUIRE_REAL_NODES") != "1":
    pytest.skip(f"no real install on this machine: {_why_not}", allow_module_level=True)


@dataclass
class Installed:
    cluster: LocalCluster
    node: RealNode


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    started = time.monotonic()
    image = build_own_image(ROOT)
    print(f"\nimage ready in {time.monotonic() - started:.0f}s: {image}")
    with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster:
        node = RealNode.start(cluster, NODE, labels={"pool": "inference", "nvidia.com/gpu.present": "true"})
        try:
            imported = time.monotonic()
            node.import_image(image)
            print(f"image imported into {NODE} in {time.monotonic() - imported:.0f}s")
            yield Installed(cluster, node)
        finally:
            node.stop()


def pods(cluster: LocalCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(cluster.get_json("pods", "-n", namespace, "-l", selector)["items"])


def running_and_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return status.get("phase") == "Running" and all(c.get("ready") for c in status.get("containerStatuses", []))


def waiting_reasons(cluster: LocalCluster, namespace: str) -> str:
    out = []
    for pod in cluster.get_json("pods", "-n", namespace)["items"]:
        for c in pod.get("status", {}).get("containerStatuses", []):
            state = c.get("state", {})
            out.append(f"{pod['metadata']['name']}: {json.dumps(state)[:300]}")
    return "\n".join(out)


async def test_the_install_runs_as_pods_from_the_local_image_and_the_samples_reach_running(
    installed: Installed,
) -> None:
    cluster = installed.cluster
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "install.yaml"))
    cluster.kubectl("-n", INSTALL_NAMESPACE, "patch", "daemonset", "tessera-agent",
                    "--patch-file", str(ROOT / "e2e" / "local" / "simulated-agent.yaml"))
    started = time.monotonic()

    def components_running() -> bool:
        operator = pods(cluster, INSTALL_NAMESPACE, "app.kubernetes.io/name=tessera-operator")
        agents = pods(cluster, INSTALL_NAMESPACE, "app.kubernetes.io/name=tessera-agent")
        simulated = [a for a in agents if any(
            e.get("value") == "simulated" for e in a["spec"]["containers"][0].get("env", []))]
        return (len(operator) == 1 and running_and_ready(operator[0])
                and len(simulated) == 1 and running_and_ready(simulated[0]) and len(agents) == 1)

    try:
        await wait_for(components_running, timeout=240, interval=1, message="the operator and agent Pods Running")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{waiting_reasons(cluster, INSTALL_NAMESPACE)}") from error
    print(f"\noperator and agent Running as Pods {time.monotonic() - started:.0f}s after apply")
    for pod in cluster.get_json("pods", "-n", INSTALL_NAMESPACE)["items"]:
        assert pod["spec"]["nodeName"] == NODE
        assert pod["spec"]["containers"][0]["image"] == IMAGE

    policies = [d["metadata"]["name"] for d in load_documents(
        (ROOT / "manifests" / "samples" / "sharingpolicies.yaml").read_text())]
    cluster.kubectl("apply", "-f", str(ROOT / "manifests" / "samples" / "sharingpolicies.yaml"))
    namespace = f"samples-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)

    def applied_policies() -> bool:
        items = cluster.get_json("sharingpolicies")["items"]
        ready = {p["metadata"]["name"] for p in items if any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))}
        return {"h100-inference", "big-memory-balanced"} <= ready and set(policies) <= {
            p["metadata"]["name"] for p in items}

    await wait_for(applied_policies, timeout=180, interval=1, message="the sample policies Ready on the node")
    cluster.kubectl("apply", "-n", namespace, "-k", str(ROOT / "e2e" / "local" / "samples"))
    samples = ["vllm-mig-3g", "vllm-shared-10gi"]

    def samples_running() -> bool:
        items = {p["metadata"]["name"]: p for p in cluster.get_json("pods", "-n", namespace)["items"]}
        return all(n in items and running_and_ready(items[n]) for n in samples)

    try:
        await wait_for(samples_running, timeout=180, interval=1, message="the sample workloads Running")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{waiting_reasons(cluster, namespace)}") from error
    for sample in samples:
        printed = cluster.kubectl("logs", sample, "-n", namespace).stdout
        assert re.search(r"^NVIDIA_VISIBLE_DEVICES=(GPU|MIG)-", printed, re.M), printed
        assert re.search(r"^device /dev/nvidia\d+$", printed, re.M), printed
    for pod in cluster.get_json("pods", "-n", INSTALL_NAMESPACE)["items"]:
        text = cluster.kubectl("logs", pod["metadata"]["name"], "-n", INSTALL_NAMESPACE).stdout
        assert not FORBIDDEN.search(text), f"{pod['metadata']['name']} was refused something:\n{text[-3000:]}"


# -- MPS daemons outlive the agent's container (runs after the install test, on what it installed) --

MPS_ROOT = "/run/tessera/mps"
MPS_SHARE = 'device.attributes["gpu.tessera.dev"].sharing == "MPS"'
# An MPS client that keeps looking at its daemon's folders: the control socket and the daemon's pid.
MPS_CLIENT = (
    "env | grep -E '^(NVIDIA|CUDA)_' | sort; echo ready; "
    "while true; do if [ -S \"$CUDA_MPS_PIPE_DIRECTORY/control\" ] && [ -d \"$CUDA_MPS_LOG_DIRECTORY\" ]; then "
    "echo \"mps $(cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid)\"; else echo 'mps missing'; fi; "
    "sleep 2; done"
)


def mps_daemons(node: RealNode) -> dict[str, int]:
    """Device UUID -> pid of every live MPS daemon on the node (read from the host's side)."""
    found = {}
    for pid_file in sorted(node.host_path(MPS_ROOT).glob("*/pipe/nvidia-cuda-mps-control.pid")):
        pid = int(pid_file.read_text())
        if Path(f"/proc/{pid}").exists():
            found[pid_file.parent.parent.name] = pid
    return found


def daemon_answers(node: RealNode, device_uuid: str) -> bool:
    from tessera.agent.backends.mps import run_command
    from tessera.agent.backends.simulated import STANDIN_MPS_CONTROL

    pipe = node.host_path(f"{MPS_ROOT}/{device_uuid}/pipe")
    done = run_command(list(STANDIN_MPS_CONTROL), {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                       "get_default_active_thread_percentage\n")
    return done.returncode == 0 and done.stdout.strip() != ""


def one_pod(cluster: LocalCluster, namespace: str, selector: str) -> dict[str, Any]:
    found = pods(cluster, namespace, selector)
    assert len(found) == 1, [p["metadata"]["name"] for p in found]
    return found[0]


async def test_mps_daemons_and_their_clients_outlive_an_agent_restart_and_a_rolling_update(
    installed: Installed,
) -> None:
    from tessera.localcluster.images import BUSYBOX_IMAGE
    from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim

    cluster, node = installed.cluster, installed.node
    agents = "app.kubernetes.io/name=tessera-agent"
    assert pods(cluster, INSTALL_NAMESPACE, agents), "the install test runs first and installs Tessera"

    def mps_host_running() -> bool:
        found = pods(cluster, INSTALL_NAMESPACE, "app.kubernetes.io/name=tessera-mps-host")
        return len(found) == 1 and running_and_ready(found[0])

    await wait_for(mps_host_running, timeout=120, interval=1, message="the MPS host Pod Running")
    namespace = f"mps-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    template = claim_template("mps-share", namespace, "shared-gpu.tessera.dev", MPS_SHARE, {"memory": "4Gi"})

    def client(name: str) -> dict[str, Any]:
        return pod_with_claim(name, namespace, "mps-share", on_node(NODE), BUSYBOX_IMAGE, ["sh", "-c", MPS_CLIENT])

    def running(name: str) -> Callable[[], bool]:
        def check() -> bool:
            proc = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
            return proc.returncode == 0 and running_and_ready(json.loads(proc.stdout))
        return check

    cluster.apply_objects([template, client("mps-before")])
    try:
        await wait_for(running("mps-before"), timeout=120, interval=1, message="the first MPS client Running")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{waiting_reasons(cluster, namespace)}") from error
    printed = cluster.kubectl("logs", "mps-before", "-n", namespace).stdout
    device = re.search(r"^NVIDIA_VISIBLE_DEVICES=(\S+)$", printed, re.M)
    assert device, printed
    daemons = mps_daemons(node)
    assert device.group(1) in daemons, f"the client's device {device.group(1)} has no live daemon: {daemons}"
    assert daemon_answers(node, device.group(1))
    mps_host_uid = one_pod(cluster, INSTALL_NAMESPACE, "app.kubernetes.io/name=tessera-mps-host")["metadata"]["uid"]

    # 1. The agent's container dies (SIGKILL to its task, as a crash or an OOM kill does) and the kubelet restarts it.
    agent = one_pod(cluster, INSTALL_NAMESPACE, agents)
    container_id = agent["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    ctr = [str(node.binaries.ctr), "--address", str(node.containerd_socket), "-n", "k8s.io"]
    await asyncio.to_thread(subprocess.run, [*ctr, "tasks", "kill", "-s", "SIGKILL", container_id], check=True,
                            capture_output=True)

    def agent_restarted() -> bool:
        pod = one_pod(cluster, INSTALL_NAMESPACE, agents)
        return running_and_ready(pod) and pod["status"]["containerStatuses"][0]["restartCount"] >= 1

    await wait_for(agent_restarted, timeout=180, interval=1, message="the agent container restarted and Ready")
    assert mps_daemons(node) == daemons, "every MPS daemon lives on, with the same pid"
    assert daemon_answers(node, device.group(1))

    # 2. A rolling update of the agent DaemonSet: a new Pod replaces the old one.
    old_uid = one_pod(cluster, INSTALL_NAMESPACE, agents)["metadata"]["uid"]
    cluster.kubectl("-n", INSTALL_NAMESPACE, "rollout", "restart", "daemonset/tessera-agent")

    def agent_replaced() -> bool:
        found = pods(cluster, INSTALL_NAMESPACE, agents)
        return (len(found) == 1 and found[0]["metadata"]["uid"] != old_uid and running_and_ready(found[0])
                and found[0]["metadata"].get("deletionTimestamp") is None)

    await wait_for(agent_replaced, timeout=180, interval=1, message="the agent Pod replaced by the rollout")
    assert mps_daemons(node) == daemons, "every MPS daemon lives on through the rollout, with the same pid"
    assert daemon_answers(node, device.group(1))
    mps_host = one_pod(cluster, INSTALL_NAMESPACE, "app.kubernetes.io/name=tessera-mps-host")
    assert mps_host["metadata"]["uid"] == mps_host_uid, "the MPS host's Pod is untouched by the agent's rollout"

    # The client never noticed: same container, still running, still sees its daemon's socket and pid.
    before = json.loads(cluster.kubectl("get", "pod", "mps-before", "-n", namespace, "-o", "json").stdout)
    assert running_and_ready(before)
    assert before["status"]["containerStatuses"][0]["restartCount"] == 0
    await asyncio.sleep(3)  # a fresh line of the client's loop, written after the rollout
    last = cluster.kubectl("logs", "mps-before", "-n", namespace, "--tail", "1").stdout.strip()
    assert last == f"mps {daemons[device.group(1)]}", last

    # 3. A new MPS client starts after it, on the same daemons.
    cluster.apply_objects([client("mps-after")])
    try:
        await wait_for(running("mps-after"), timeout=120, interval=1, message="an MPS client started after the rollout")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{waiting_reasons(cluster, namespace)}") from error
    await asyncio.sleep(3)
    after = cluster.kubectl("logs", "mps-after", "-n", namespace).stdout
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in after
    assert "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps" in after
    seen = re.search(r"^NVIDIA_VISIBLE_DEVICES=(\S+)$", after, re.M)
    assert seen, after
    assert f"mps {daemons[seen.group(1)]}" in after.splitlines(), after
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
