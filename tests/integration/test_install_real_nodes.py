"""The install, for real: Tessera's image built from the Dockerfile without Docker (buildah on
a Debian-made base), imported into a real node's containerd, ``kubectl apply -f
manifests/install.yaml``, the simulated backend chosen by the documented patch
(``e2e/local/simulated-agent.yaml``). The operator Deployment and the agent DaemonSet run as
Pods with the shipped RBAC, admission policy, host paths and probes; the sample policies and
the sample workloads (``e2e/local/samples``: the same claims, a local image) reach Running and
print the devices they got. Then, on that install, MPS daemons (started by the
``tessera-mps-host`` Pod) and an MPS client outlive a kill of the agent's container and a
rolling update of the agent DaemonSet, and a new MPS client starts after them. Then, on the same
node, the Helm chart: it takes that install over
(nothing allocated is lost), upgrades the agent while the samples hold devices (they keep running,
the plugin's checkpoint is kept), uninstalls leaving only the CRDs, and installs afresh; a second
release elsewhere is refused. The seconds a sample's device was missing are printed (``-s``).

Needs root, runc, the CNI plugins, buildah and mmdebstrap (``.ci/run`` installs them);
skipped with the reason where they are missing, unless ``TESSERA_REQUIRE_REAL_NODES=1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera import INSTALL_NAMESPACE
from tessera.agent.nics.shaping import ifb_name
from tessera.dra.nics import SHARED_NIC_CLASS
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS, wait_for
from tessera.localcluster.fabric import Fabric
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.ownimage import IMAGE, build_own_image, own_image_possible
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim
from tessera.manifests import load_documents
from tests.integration.helm_helpers import CHART, helm

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
        return (len(operator) == 2 and all(running_and_ready(p) for p in operator)  # leader and standby
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


async def test_the_installed_agent_pod_attaches_a_nic_share_through_its_hook_on_the_host(
    installed: Installed,
) -> None:
    """The DaemonSet with the shared-NICs patch (hostNetwork, hostPID): the CDI hook that the
    runtime runs on the host enters the agent container by the pid it wrote and runs the image's
    ``tessera nic-attach``; the Pod sees net1. The uplink is a veth whose far end is in a namespace.
    These nodes have no kube-proxy, so the host-network agent is pointed at the apiserver's
    loopback address (where a cluster's kube-proxy would serve the Service's IP to the host)."""
    cluster = installed.cluster
    suffix = uuid.uuid4().hex[:6]
    uplink = f"ti{suffix}"
    fabric = Fabric(uplink, f"tj{suffix}", f"tessera-ifab-{suffix}", "10.95.0.1/24")
    await asyncio.to_thread(fabric.make)  # both ends up: else the uplink is down, its device tainted
    namespace = f"nic-{suffix}"
    try:
        cluster.kubectl("-n", INSTALL_NAMESPACE, "patch", "daemonset", "tessera-agent",
                        "--patch-file", str(ROOT / "e2e" / "local" / "shared-nics-agent.yaml"))
        host, port = cluster.server.removeprefix("https://").rsplit(":", 1)
        cluster.kubectl("-n", INSTALL_NAMESPACE, "set", "env", "daemonset/tessera-agent",
                        f"TESSERA_NIC_INTERFACES={uplink}", f"KUBERNETES_SERVICE_HOST={host}",
                        f"KUBERNETES_SERVICE_PORT={port}")
        cluster.apply_objects([{
            "apiVersion": "tessera.dev/v1alpha1", "kind": "NetworkSharingPolicy", "metadata": {"name": "install-nic"},
            "spec": {"interfaces": [uplink], "lineRate": "10G", "share": {"default": "1G", "min": "1G", "step": "1G"}},
        }])  # fmt: skip

        def published() -> bool:
            return any(d["name"] == f"nic-{uplink}" for s in cluster.get_json("resourceslices")["items"]
                       for d in s["spec"].get("devices") or [])

        await wait_for(published, timeout=180, interval=1, message="the restarted agent Pod's NIC published")
        cluster.kubectl("create", "namespace", namespace)
        await wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                               check=False).returncode == 0, timeout=30, message="default account")
        cluster.apply_objects([
            claim_template("nic", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "2G"}),
            pod_with_claim("nic-0", namespace, "nic", on_node(NODE), BUSYBOX_IMAGE,
                           ["sh", "-c", "ls /sys/class/net; echo ready; exec sleep 600"]),
        ])

        def started() -> str:
            pod = cluster.get_json("pod", "nic-0", "-n", namespace)
            return cluster.kubectl("logs", "nic-0", "-n", namespace).stdout if running_and_ready(pod) else ""

        try:
            printed = await wait_for(started, timeout=120, interval=1, message="nic-0 Running")
        except TimeoutError as error:
            pod_status = json.dumps(cluster.get_json("pod", "nic-0", "-n", namespace).get("status"))[:1500]
            events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout[-1500:]
            agent = cluster.kubectl("-n", INSTALL_NAMESPACE, "logs", "daemonset/tessera-agent", "--tail=15",
                                    check=False).stdout[-3000:]
            raise AssertionError(f"{error}\n{pod_status}\n{events}\n{agent}") from error
        assert sorted(printed.split()) == ["eth0", "lo", "net1", "ready"], printed
        cluster.kubectl("delete", "namespace", namespace, "--timeout=90s")
        [shown] = await asyncio.to_thread(_run_each, ["tc", "class", "show", "dev", uplink])
        assert shown == "", f"the share's class is gone with the Pod: {shown}"
    finally:
        cluster.kubectl("delete", "networksharingpolicy", "install-nic", "--ignore-not-found", check=False)
        cluster.kubectl("-n", INSTALL_NAMESPACE, "set", "env", "daemonset/tessera-agent", "TESSERA_NIC_INTERFACES-",
                        "KUBERNETES_SERVICE_HOST-", "KUBERNETES_SERVICE_PORT-",
                        "TESSERA_NIC_ATTACH_IN_AGENT_NAMESPACE-", check=False)
        undo = [{"op": "remove", "path": "/spec/template/spec/hostNetwork"},  # hostPID stays: the install's own
                {"op": "replace", "path": "/spec/template/spec/dnsPolicy", "value": "ClusterFirst"}]
        cluster.kubectl("-n", INSTALL_NAMESPACE, "patch", "daemonset", "tessera-agent", "--type", "json", "-p",
                        json.dumps(undo), check=False)
        await asyncio.to_thread(fabric.remove, [ifb_name(uplink)])


def _run_each(*argvs: list[str], check: bool = True) -> list[str]:
    """Run each command in turn; what each printed."""
    return [subprocess.run(argv, check=check, capture_output=True, text=True).stdout for argv in argvs]


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
    # Gone before the Helm tests below, which count what the sample Pods alone hold.
    cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=1", "--wait=true", "--timeout=120s")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
# ---- The Helm chart on the same real node: from the kubectl install above to the chart, an
# upgrade while Pods hold devices, the uninstall, and a fresh install. One cycle, this cluster.

RELEASE = "tessera"
SIMULATED_VALUES = ("--set", "agent.backend=simulated", "--set", "agent.simulate=1xH100-80GB\\,1xH200-141GB",
                    "--set", "agent.simulatedDevDir=/var/lib/tessera/dev")
SAMPLES = "app.kubernetes.io/part-of=tessera-samples"


@dataclass(frozen=True)
class Holding:
    """A running sample Pod: its container, and the devices its claims were allocated."""

    container_id: str
    restarts: int
    devices: tuple[tuple[str, str], ...]


def holdings(cluster: LocalCluster) -> tuple[dict[str, Holding], set[tuple[str, str]]]:
    """Running sample Pods by namespace/name, and the (pool, device) pairs published untainted,
    read in one kubectl call."""
    items = cluster.get_json("pods,resourceclaims,resourceslices", "-A")["items"]
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in items if c["kind"] == "ResourceClaim"}
    published = {(s["spec"]["pool"]["name"], d["name"]) for s in items if s["kind"] == "ResourceSlice"
                 for d in s["spec"].get("devices") or [] if not d.get("taints")}
    held: dict[str, Holding] = {}
    for pod in items:
        if pod["kind"] != "Pod" or pod["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") != \
                "tessera-samples" or not running_and_ready(pod):
            continue
        namespace = pod["metadata"]["namespace"]
        devices = []
        for status in pod["status"].get("resourceClaimStatuses", []):
            claim = claims.get((namespace, status.get("resourceClaimName", "")), {})
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
            devices += [(r["pool"], r["device"]) for r in results]
        container = pod["status"]["containerStatuses"][0]
        held[f"{namespace}/{pod['metadata']['name']}"] = Holding(
            container["containerID"], container["restartCount"], tuple(sorted(devices)))
    return held, published


class AvailabilityWatch:
    """Samples, about every half second while an upgrade runs, whether every sample Pod still
    runs the same container with the same devices allocated and published untainted; adds up
    the seconds between a sample that found something missing and the next one."""

    def __init__(self, cluster: LocalCluster, expected: dict[str, Holding]) -> None:
        self.cluster, self.expected = cluster, expected
        self.unavailable_seconds = 0.0
        self.samples = 0
        self.missing: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _check(self) -> list[str]:
        held, published = holdings(self.cluster)
        wrong = []
        for pod, before in self.expected.items():
            now = held.get(pod)
            if now is None or now.container_id != before.container_id or now.restarts != before.restarts:
                wrong.append(f"{pod} not running its container")
            elif now.devices != before.devices:
                wrong.append(f"{pod} holds {now.devices}, not {before.devices}")
            else:
                wrong += [f"{pod}: {d} not published" for d in now.devices if d not in published]
        return wrong

    def _run(self) -> None:
        last = time.monotonic()
        last_bad = False
        while not self._stop.is_set():
            wrong = self._check()
            now = time.monotonic()
            if last_bad:
                self.unavailable_seconds += now - last
            last, last_bad = now, bool(wrong)
            self.samples += 1
            self.missing += wrong
            self._stop.wait(0.5)

    def __enter__(self) -> AvailabilityWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def agent_pod(cluster: LocalCluster) -> dict[str, Any]:
    """The node's one agent Pod that is not going away (an empty object while none or two)."""
    live = [p for p in pods(cluster, INSTALL_NAMESPACE, "app.kubernetes.io/name=tessera-agent")
            if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 else {"metadata": {"uid": ""}, "spec": {"containers": [{"env": []}]}}


def tessera_objects_left(cluster: LocalCluster) -> list[str]:
    """Every object labelled part of Tessera, but the CRDs and the namespace the test made."""
    kinds = ("deployments,daemonsets,services,serviceaccounts,configmaps,roles,rolebindings,clusterroles,"
             "clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,deviceclasses")
    items = cluster.get_json(kinds, "-A", "-l", "app.kubernetes.io/part-of=tessera")["items"]
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in items)


async def test_the_chart_takes_over_the_kubectl_install_and_nothing_allocated_is_lost(installed: Installed) -> None:
    cluster = installed.cluster
    before, _ = holdings(cluster)
    assert len(before) == 2, "the kubectl install's sample Pods run with their devices"
    refused = helm("install", RELEASE, str(CHART), "-n", INSTALL_NAMESPACE, *SIMULATED_VALUES,
                   kubeconfig=cluster.kubeconfig, check=False)
    assert refused.returncode != 0
    assert "already installed in this cluster without Helm (kubectl apply" in refused.stderr, refused.stderr
    install_file = str(ROOT / "manifests" / "install.yaml")
    # The README's two commands that hand the kubectl install's objects to the release.
    cluster.kubectl("label", "-f", install_file, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    cluster.kubectl("annotate", "-f", install_file, f"meta.helm.sh/release-name={RELEASE}",
                    f"meta.helm.sh/release-namespace={INSTALL_NAMESPACE}", "--overwrite")
    started = time.monotonic()
    with AvailabilityWatch(cluster, before) as watch:
        # --server-side=false: Helm patches (a three-way merge) instead of applying server-side, so
        # the fields kubectl's apply owns are no conflict, now or in later upgrades ("auto" keeps
        # the release's method).
        out = helm("upgrade", "--install", RELEASE, str(CHART), "-n", INSTALL_NAMESPACE, *SIMULATED_VALUES,
                   "--server-side=false", "--wait", "--timeout", "4m", kubeconfig=cluster.kubeconfig).stdout
        await wait_for(lambda: running_and_ready(agent_pod(cluster)), timeout=120, interval=1,
                       message="the chart's agent Pod Ready")
        await asyncio.sleep(5)  # the agent's first passes, while the watch keeps sampling
    print(f"\nkubectl install -> chart: {time.monotonic() - started:.0f}s, sample Pods' devices unavailable "
          f"{watch.unavailable_seconds:.1f}s over {watch.samples} samples {sorted(set(watch.missing))[:4]}")
    assert "STATUS: deployed" in out
    assert "keeps the CRDs" in out, "the NOTES say what an uninstall leaves"
    after, published = holdings(cluster)
    assert after == before, "every sample Pod runs the same container with the same devices"
    assert all(d in published for h in after.values() for d in h.devices)
    assert not [m for m in watch.missing if "not running" in m or "holds" in m], watch.missing


async def test_an_upgrade_of_the_agent_keeps_running_pods_and_their_devices(installed: Installed) -> None:
    cluster = installed.cluster
    before, _ = holdings(cluster)
    assert len(before) == 2
    old_agent = agent_pod(cluster)
    checkpoint = installed.node.host_path("/var/lib/kubelet/plugins/gpu.tessera.dev/checkpoint.json")

    def prepared_claims() -> set[str]:
        return set(json.loads(checkpoint.read_text())["data"]["claims"])

    # The kubelet unprepares the claims of Pods that earlier tests deleted on its own time.
    await wait_for(lambda: len(prepared_claims()) == 2, timeout=120, interval=1,
                   message="the checkpoint holding the two sample Pods' claims alone")
    prepared = prepared_claims()
    started = time.monotonic()
    with AvailabilityWatch(cluster, before) as watch:
        helm("upgrade", RELEASE, str(CHART), "-n", INSTALL_NAMESPACE, "--reuse-values",
             "--set", "agent.logLevel=debug", "--wait", "--timeout", "4m", kubeconfig=cluster.kubeconfig)

        def new_agent_ready() -> bool:
            pod = agent_pod(cluster)
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
            return (pod["metadata"]["uid"] != old_agent["metadata"]["uid"] and running_and_ready(pod)
                    and env["TESSERA_LOG_LEVEL"] == "debug")

        await wait_for(new_agent_ready, timeout=120, interval=1, message="the agent rolled to log level debug")
        await asyncio.sleep(5)  # the new agent's first passes, while the watch keeps sampling
    print(f"\nagent upgrade (log level): {time.monotonic() - started:.0f}s, sample Pods' devices unavailable "
          f"{watch.unavailable_seconds:.1f}s over {watch.samples} samples {sorted(set(watch.missing))[:4]}")
    after, published = holdings(cluster)
    assert after == before, "the Pods kept running, with the same devices"
    assert set(json.loads(checkpoint.read_text())["data"]["claims"]) == prepared, "the checkpoint kept every claim"
    assert all(d in published for h in after.values() for d in h.devices)
    assert not [m for m in watch.missing if "not running" in m or "holds" in m], watch.missing
    logs = cluster.kubectl("logs", agent_pod(cluster)["metadata"]["name"], "-n", INSTALL_NAMESPACE).stdout
    assert re.search(r'"level":\s*"debug"', logs), logs[-2000:]


async def test_helm_uninstall_leaves_only_the_crds_and_a_fresh_install_runs_a_pod_with_a_device(
    installed: Installed,
) -> None:
    cluster = installed.cluster
    # What people made goes first, while the operator runs to lift its finalizers.
    namespaces = {key.split("/")[0] for key in holdings(cluster)[0]}
    for namespace in namespaces:
        cluster.kubectl("delete", "namespace", namespace, "--timeout=120s", timeout=150)
    cluster.kubectl("delete", "sharingpolicies", "--all", "--timeout=60s", timeout=90)
    out = helm("uninstall", RELEASE, "-n", INSTALL_NAMESPACE, "--wait", "--timeout", "2m",
               kubeconfig=cluster.kubeconfig).stdout
    assert f'release "{RELEASE}" uninstalled' in out
    assert tessera_objects_left(cluster) == []
    crds = {c["metadata"]["name"] for c in cluster.get_json("crds")["items"]}
    assert {"sharingpolicies.tessera.dev", "nodelayouts.tessera.dev"} <= crds

    started = time.monotonic()
    helm("install", RELEASE, str(CHART), "-n", INSTALL_NAMESPACE, *SIMULATED_VALUES, kubeconfig=cluster.kubeconfig)
    cluster.kubectl("apply", "-f", str(ROOT / "manifests" / "samples" / "sharingpolicies.yaml"))
    namespace = f"helm-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-n", namespace, "-k", str(ROOT / "e2e" / "local" / "samples"))

    def first_pod_with_a_device() -> bool:
        held, published = holdings(cluster)
        return any(h.devices and all(d in published for d in h.devices) for h in held.values())

    try:
        await wait_for(first_pod_with_a_device, timeout=300, interval=1, message="a sample Pod Running with a device")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{waiting_reasons(cluster, namespace)}") from error
    print(f"\nhelm install -> first Pod Running with a Tessera device: {time.monotonic() - started:.0f}s")

    second = helm("install", "tessera-again", str(CHART), "-n", "tessera-again", "--create-namespace",
                  *SIMULATED_VALUES, kubeconfig=cluster.kubeconfig, check=False)
    assert second.returncode != 0
    assert f'already installed in this cluster: release "{RELEASE}" in namespace "{INSTALL_NAMESPACE}"' in \
        second.stderr, second.stderr
