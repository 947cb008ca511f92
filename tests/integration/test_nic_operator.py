"""The NIC family end to end on the control plane: a node agent (simulated backend, an HGX-like
node of 8 GPUs and 4 NICs) reports its NICs in NodeLayout status, the operator's NIC room turns
a NetworkSharingPolicy into the node's nic.tessera.dev slice and reports on the policy, and the
stock scheduler allocates bandwidth shares from it."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from tessera.agent.plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tessera.dra.nics import NIC_DRIVER, SHARED_NIC_CLASS
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tessera.models.quantity import parse_quantity
from tests.integration.kube_helpers import (
    allocation,
    apply,
    claim_template,
    condition,
    get,
    get_or_none,
    gpu_node,
    on_node,
    pod_with_claim,
)

pytestmark = pytest.mark.integration

LABEL = "nic-operator"


def _network_policy(interfaces: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NetworkSharingPolicy",
        "metadata": {"name": "hgx-uplinks"},
        "spec": {
            "nodeSelector": {"matchLabels": {"tessera.dev/test": LABEL}},
            "interfaces": interfaces,
            "share": {"default": "25G", "min": "25G", "step": "25G"},
        },
    }


def _nic_devices(cluster: LocalCluster, node: str) -> dict[str, dict[str, Any]] | None:
    items = get(cluster, "resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    nic = [s for s in items if s["spec"]["driver"] == NIC_DRIVER]
    return {d["name"]: d for s in nic for d in s["spec"].get("devices", [])} if nic else None


def _policy_status(cluster: LocalCluster) -> dict[str, Any]:
    body = get_or_none(cluster, "networksharingpolicy", "hgx-uplinks")
    return (body or {}).get("status") or {}


async def test_an_agents_nics_are_published_by_the_operator_and_shared_by_the_scheduler(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    node = "nic-hgx-1"
    gpu_node(cluster, tessera, node, LABEL, "8xH100-80GB,4xNIC-400G")
    await wait_for(
        lambda: len(((get_or_none(cluster, "nodelayout", node) or {}).get("status") or {}).get("nics", [])) == 4,
        timeout=90, message="the agent to report 4 NICs",
    )  # fmt: skip
    apply(cluster, _network_policy(["simnic0", "simnic1", "simnic2", "simnic3", "eth9"]))

    devices = await wait_for(lambda: _nic_devices(cluster, node), timeout=60, message="the NIC slice")
    assert sorted(devices) == ["nic-simnic0", "nic-simnic1", "nic-simnic2", "nic-simnic3"]
    assert devices["nic-simnic2"]["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:50"}
    assert devices["nic-simnic0"]["capacity"]["bandwidth"]["value"] == "400G"

    # The missing interface makes the policy Degraded, named by node, and nothing crashes.
    status = await wait_for(
        lambda: (s := _policy_status(cluster)).get("nics") == 4 and s, timeout=60, message="the policy's status"
    )
    degraded = condition({"status": status}, "Degraded")
    assert degraded is not None
    assert degraded["status"] == "True"
    assert f"{node}: no interface 'eth9' on this node" in degraded["message"]
    assert status["nodes"] == 1

    apply(cluster, claim_template("bw-100g", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "100G"}),
          pod_with_claim("nic-user", namespace, "bw-100g", node_selector=on_node(node)))  # fmt: skip
    alloc = await wait_for(lambda: allocation(cluster, namespace, "nic-user"), timeout=60, message="a NIC share")
    [result] = alloc["devices"]["results"]
    assert result["driver"] == NIC_DRIVER
    assert parse_quantity(result["consumedCapacity"]["bandwidth"]) == 100 * 10**9

    # The agent serves nic.tessera.dev to the kubelet: asked to prepare the claim, it reads it from
    # the API, finds its share on simnic0, and refuses cleanly (a simulated NIC has no link to shape).
    folder = tessera.node_folder(node)
    registration = folder / "plugins_registry" / f"{NIC_DRIVER}-reg.sock"
    await wait_for(registration.exists, timeout=30, message="the NIC plugin's registration socket")
    claim = get(cluster, "resourceclaims", "-n", namespace)["items"][0]
    async with grpc.aio.insecure_channel(f"unix://{folder / 'plugins' / NIC_DRIVER / 'dra.sock'}") as channel:
        answer = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
                namespace=namespace, name=claim["metadata"]["name"], uid=claim["metadata"]["uid"])])
        )  # fmt: skip
    assert "uplink 'simnic0' does not exist" in answer.claims[claim["metadata"]["uid"]].error

    # Fixing the policy makes it Ready; dropping a NIC withdraws its device only.
    cluster.kubectl("patch", "networksharingpolicy", "hgx-uplinks", "--type=merge", "-p",
                    json.dumps({"spec": {"interfaces": ["simnic0", "simnic1", "simnic2"]}}))  # fmt: skip
    await wait_for(
        lambda: (condition({"status": _policy_status(cluster)}, "Ready") or {}).get("status") == "True",
        timeout=60, message="the policy to be Ready",
    )  # fmt: skip
    await wait_for(
        lambda: sorted(_nic_devices(cluster, node) or {}) == ["nic-simnic0", "nic-simnic1", "nic-simnic2"],
        timeout=60, message="simnic3 withdrawn",
    )  # fmt: skip

    cluster.kubectl("delete", "networksharingpolicy", "hgx-uplinks")
    await wait_for(lambda: _nic_devices(cluster, node) is None, timeout=60, message="the NIC slice to go")
