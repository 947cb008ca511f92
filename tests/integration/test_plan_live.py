"""``tessera plan --live`` against the real control plane with the operator and a simulated
agent running: a policy file that would turn a node's seven 1g MIG partitions into one 7g
shows today's and the new layout, the devices that would drain, the claim (namespace/name)
that holds one of them, and the policy it outranks; nothing in the cluster changes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tests.integration.kube_helpers import (
    allocated_devices,
    apply,
    claim_of,
    claim_template,
    delete_pod_now,
    get,
    node_devices,
    on_node,
    pod_with_claim,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tessera(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TesseraProcesses]:
    cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
    processes = TesseraProcesses(cluster, tmp_path_factory.mktemp("tessera"))
    processes.operator()
    try:
        yield processes
    finally:
        processes.stop_all()
        cluster.kubectl("delete", "sharingpolicies", "live", "live-low", "--ignore-not-found", "--wait=false")


def _policy(name: str, priority: int, mig: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": name},
            "spec": {"priority": priority, "nodeSelector": {"matchLabels": {"tessera.dev/test": "live"}},
                     "strategy": "MIG", "mig": mig}}


async def test_plan_live_names_the_claim_holding_a_device_the_new_policy_would_drain(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str, tmp_path: Path
) -> None:
    cluster.add_node("live-a", labels={"tessera.dev/test": "live"})
    tessera.agent("live-a", "1xH100-80GB")
    apply(cluster, _policy("live", 10, {"preset": "all-1g"}), _policy("live-low", 1, {"preset": "all-balanced"}))
    await wait_for(lambda: len(node_devices(cluster, "live-a")) == 7, timeout=90, message="seven 1g partitions")
    apply(cluster, claim_template("one-g", namespace, "mig.tessera.dev"),
          pod_with_claim("holder", namespace, "one-g", on_node("live-a")))
    (held,) = await wait_for(lambda: allocated_devices(cluster, namespace, "holder"), timeout=60,
                             message="the 1g claim to be allocated")
    claim = claim_of(cluster, namespace, "holder")
    assert claim is not None
    spec_before = get(cluster, "nodelayout", "live-a")["spec"]

    new_policy = tmp_path / "live.yaml"
    new_policy.write_text(yaml.safe_dump(_policy("live", 10, {"preset": "whole"})))
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tessera", "plan", "--live", "--kubeconfig", str(cluster.kubeconfig),
         "--policy", str(new_policy)],
        capture_output=True, text=True, timeout=120, check=False,
    )

    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    block = lines[lines.index("live-a GPU 0 (H100-80GB): changes"):]
    assert block[1].split() == ["policy", "live", "->", "live"]
    assert block[2] == "  today   MIG " + " ".join(f"1g.10gb@{s}" for s in range(7))
    assert block[3] == "  new     MIG 7g.80gb@0"
    assert block[4] == "  drains  7 device(s); 1 held by a claim"
    assert f"    {held['device']}  held by {namespace}/{claim['metadata']['name']}" in block
    assert any(line.endswith("live wins over live-low") for line in lines), out.stdout
    assert get(cluster, "nodelayout", "live-a")["spec"] == spec_before, "a preview writes nothing"
    assert get(cluster, "sharingpolicy", "live")["spec"]["mig"] == {"preset": "all-1g"}
    delete_pod_now(cluster, namespace, "holder")


async def test_kubectl_finds_the_plugin_on_path_and_kubectl_tessera_status_names_the_claim_holding_a_gpu(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str, tmp_path: Path
) -> None:
    cluster.add_node("status-a", labels={"tessera.dev/test": "status"})
    tessera.agent("status-a", "2xH100-80GB")  # no policy selects it: both GPUs unmanaged, whole
    await wait_for(lambda: len(node_devices(cluster, "status-a")) == 2, timeout=90, message="two whole GPUs")
    apply(cluster, claim_template("whole", namespace, "whole-gpu.tessera.dev"),
          pod_with_claim("trainer", namespace, "whole", on_node("status-a")))
    (held,) = await wait_for(lambda: allocated_devices(cluster, namespace, "trainer"), timeout=60,
                             message="the whole-GPU claim to be allocated")
    claim = claim_of(cluster, namespace, "trainer")
    assert claim is not None
    # kubectl runs `kubectl-tessera` from PATH as `kubectl tessera`, passing KUBECONFIG on.
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "KUBECONFIG": str(cluster.kubeconfig),
           "HOME": str(tmp_path)}
    kubectl = str(cluster.binaries.kubectl)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([kubectl, *args], capture_output=True, text=True, env=env, timeout=120, check=False)

    listed = await asyncio.to_thread(run, "plugin", "list")
    assert f"{Path(sys.executable).parent}/kubectl-tessera" in listed.stdout, listed.stdout + listed.stderr
    out = await asyncio.to_thread(run, "tessera", "status", "status-a")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "node status-a"
    assert [line.split()[:2] for line in lines if line.startswith("  GPU")] == [["GPU", "0"], ["GPU", "1"]]
    holder = next(line for line in lines if line.split()[0] == held["device"])
    assert holder.endswith(f"<- {namespace}/{claim['metadata']['name']}"), out.stdout
    other = next(line for line in lines if line.split()[0] in {"gpu-0", "gpu-1"} - {held["device"]})
    assert other.endswith("free"), out.stdout
    plan_args = ["plan", "--policy", str(ROOT / "examples" / "policies" / "h100-inference.yaml"),
                 "--inventory", str(ROOT / "examples" / "inventory.yaml")]
    plugin = await asyncio.to_thread(run, "tessera", *plan_args)
    direct = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "tessera", *plan_args],
                                     capture_output=True, text=True, timeout=120, check=False)
    assert "h100-inference" in plugin.stdout
    assert (plugin.returncode, plugin.stdout) == (direct.returncode, direct.stdout), "the plugin is tessera plan"
    delete_pod_now(cluster, namespace, "trainer")
