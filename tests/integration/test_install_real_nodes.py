"""The install, for real: Tessera's image built from the Dockerfile without Docker (buildah on
a Debian-made base), imported into a real node's containerd, ``kubectl apply -f
manifests/install.yaml``, the simulated backend chosen by the documented patch
(``e2e/local/simulated-agent.yaml``). The operator Deployment and the agent DaemonSet run as
Pods with the shipped RBAC, admission policy, host paths and probes; the sample policies and
the sample workloads (``e2e/local/samples``: the same claims, a local image) reach Running and
print the devices they got.

Needs root, runc, the CNI plugins, buildah and mmdebstrap (``.ci/run`` installs them);
skipped with the reason where they are missing, unless ``TESSERA_REQUIRE_REAL_NODES=1``.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
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
