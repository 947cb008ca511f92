"""Shared NICs on the real control plane: the devices tessera.dra.nics builds, published in a
ResourceSlice of the nic.tessera.dev driver, are allocated by the stock kube-scheduler by
consumable bandwidth (20 shares of 2G fit a 40G NIC, the 21st waits; requests off the request
policy are rounded up or never allocated), a GPU and a NIC share are aligned on one PCIe root
with matchAttribute on an HGX-like node, and the apiserver refuses a bad NetworkSharingPolicy
with the field's message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.agent.nics.simulated import simulated_nics
from tessera.dra.devices import build_gpu_devices
from tessera.dra.nics import SHARED_NIC_CLASS, choose_shared_nics, nic_slice
from tessera.dra.slices import NodeRef, build_slices_from_devices
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim
from tessera.models.network import NetworkSharingPolicy
from tessera.models.quantity import parse_quantity
from tests.dra_gpus import gpu
from tests.integration.kube_helpers import allocation, apply, get, unschedulable

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def _policy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NetworkSharingPolicy",
        "metadata": {"name": "nics-under-test"},
        "spec": {"interfaces": ["simnic0", "simnic1", "simnic2", "simnic3"], **spec},
    }


def _allocated_results(cluster: LocalCluster, namespace: str, want: int) -> list[dict[str, Any]] | None:
    """The device results of every allocated claim in the namespace, once there are ``want`` (one list call)."""
    claims = get(cluster, "resourceclaims", "-n", namespace)["items"]
    allocations = [c.get("status", {}).get("allocation", {}) for c in claims]
    results = [r for a in allocations for r in a.get("devices", {}).get("results", [])]
    return results if len(results) >= want else None


def _gpu_index_is(index: int) -> str:
    return f'device.attributes["gpu.tessera.dev"].index == {index}'


def _publish(cluster: LocalCluster, node: str, simulate: str, gpu_count: int, policy: dict[str, Any]) -> NodeRef:
    created = cluster.add_node(node, labels={"tessera.dev/test": "nics"})
    ref = NodeRef(node, created["metadata"]["uid"])
    chosen = choose_shared_nics([NetworkSharingPolicy.from_kube(policy)], {}, simulated_nics(node, simulate, gpu_count))
    assert chosen.problems == ()
    slices = [nic_slice(ref, chosen.shared)]
    if gpu_count:
        slices += build_slices_from_devices(ref, [build_gpu_devices(gpu(i)) for i in range(gpu_count)])
    apply(cluster, *slices)
    return ref


@pytest.fixture(scope="module", autouse=True)
def _classes_and_crds(cluster: LocalCluster) -> None:
    cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")


async def test_twenty_2g_shares_fit_a_40g_nic_and_the_21st_waits(cluster: LocalCluster, namespace: str) -> None:
    node = "nic-node-40g"
    _publish(cluster, node, "NIC-40G", 0, _policy(interfaces=["simnic0"], share={"default": "2G", "min": "1G"}))
    apply(
        cluster,
        claim_template("bw-2g", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "2G"}),
        *(pod_with_claim(f"share-{i}", namespace, "bw-2g", node_selector=on_node(node)) for i in range(20)),
    )
    results = await wait_for(
        lambda: _allocated_results(cluster, namespace, 20), timeout=180, message="20 claims of 2G to be allocated"
    )
    assert {r["device"] for r in results} == {"nic-simnic0"}
    # The scheduler writes what it booked in a form of its own ("1953125Ki" for 2G): compare values.
    assert {parse_quantity(r["consumedCapacity"]["bandwidth"]) for r in results} == {2 * 10**9}
    assert len({r["shareID"] for r in results}) == 20

    apply(cluster, pod_with_claim("share-20", namespace, "bw-2g", node_selector=on_node(node)))
    await wait_for(lambda: unschedulable(cluster, namespace, "share-20"), timeout=60, message="the 21st to wait")
    assert allocation(cluster, namespace, "share-20") is None


async def test_requests_off_the_policy_are_rounded_up_to_a_step_or_never_allocated(
    cluster: LocalCluster, namespace: str
) -> None:
    node = "nic-node-policy"
    _publish(cluster, node, "NIC-40G", 0, _policy(interfaces=["simnic0"], share={"default": "2G", "min": "1G"}))
    apply(
        cluster,
        claim_template("bw-off-step", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "1500M"}),
        claim_template("bw-above-rate", namespace, SHARED_NIC_CLASS, capacity={"bandwidth": "41G"}),
        claim_template("bw-default", namespace, SHARED_NIC_CLASS),
        pod_with_claim("off-step", namespace, "bw-off-step", node_selector=on_node(node)),
        pod_with_claim("above-rate", namespace, "bw-above-rate", node_selector=on_node(node)),
        pod_with_claim("default", namespace, "bw-default", node_selector=on_node(node)),
    )
    for pod in ("off-step", "default"):
        alloc = await wait_for(lambda p=pod: allocation(cluster, namespace, p), timeout=60, message=f"{pod} allocated")
        assert parse_quantity(alloc["devices"]["results"][0]["consumedCapacity"]["bandwidth"]) == 2 * 10**9
    await wait_for(lambda: unschedulable(cluster, namespace, "above-rate"), timeout=60, message="41G to be refused")
    assert allocation(cluster, namespace, "above-rate") is None


async def test_a_gpu_and_a_nic_share_are_aligned_on_one_pcie_root(cluster: LocalCluster, namespace: str) -> None:
    node = "nic-node-hgx"
    _publish(cluster, node, "8xH100-80GB,4xNIC-400G", 8, _policy(share={"default": "10G", "min": "10G", "step": "10G"}))
    templates, pods = [], []
    for index in range(8):
        templates.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"gpu-{index}-with-nic", "namespace": namespace},
                "spec": {"spec": {"devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {
                            "deviceClassName": "whole-gpu.tessera.dev",
                            "selectors": [{"cel": {"expression": _gpu_index_is(index)}}],
                        }},
                        {"name": "nic", "exactly": {
                            "deviceClassName": SHARED_NIC_CLASS, "capacity": {"requests": {"bandwidth": "100G"}},
                        }},
                    ],
                    "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}],
                }}},
            }
        )  # fmt: skip
        pods.append(pod_with_claim(f"gpu-{index}", namespace, f"gpu-{index}-with-nic", node_selector=on_node(node)))
    apply(cluster, *templates, *pods)
    slices = get(cluster, "resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    roots = {
        (s["spec"]["driver"], d["name"]): d["attributes"][PCIE_ROOT]["string"]
        for s in slices
        for d in s["spec"].get("devices", [])
    }
    for index in range(8):
        alloc = await wait_for(
            lambda i=index: allocation(cluster, namespace, f"gpu-{i}"), timeout=120, message=f"gpu-{index} allocated"
        )
        by_request = {r["request"]: r for r in alloc["devices"]["results"]}
        gpu_root = roots[(by_request["gpu"]["driver"], by_request["gpu"]["device"])]
        nic_root = roots[(by_request["nic"]["driver"], by_request["nic"]["device"])]
        assert by_request["nic"]["driver"] == "nic.tessera.dev"
        assert gpu_root == nic_root, f"gpu-{index}: GPU on {gpu_root}, NIC on {nic_root}"
        assert by_request["nic"]["device"] == f"nic-simnic{index // 2}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"share": {"default": "2500M", "min": "1G", "step": "1G"}}, "share.default must be share.min plus a whole"),
        ({"share": {"ceiling": "500M"}}, "share.ceiling must be at least share.min"),
        ({"lineRate": "500M"}, "lineRate must be at least share.min"),
        ({"addresses": {"cidr": "10.0.0.300/24"}}, "addresses.cidr must be a network"),
        ({"interfaces": ["a/b"]}, "spec.interfaces[0]"),
    ],
)
def test_the_apiserver_refuses_a_bad_network_sharing_policy_naming_the_field(
    cluster: LocalCluster, spec: dict[str, Any], message: str
) -> None:
    refused = cluster.kubectl("apply", "-f", "-", input=_yaml(_policy(**spec)), check=False)
    assert refused.returncode != 0
    assert message in refused.stderr


def test_the_apiserver_takes_a_good_network_sharing_policy(cluster: LocalCluster) -> None:
    policy = _policy(lineRate="40G", share={"default": "2G", "min": "1G", "step": "1G", "ceiling": "10G"},
                     addresses={"cidr": "10.20.0.0/24"})  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=_yaml(policy))
    stored = get(cluster, "networksharingpolicy", "nics-under-test")
    parsed = NetworkSharingPolicy.from_kube({**stored, "metadata": {"name": "nics-under-test"}})
    assert parsed.spec.line_rate_bps == 40 * 10**9
    cluster.kubectl("delete", "networksharingpolicy", "nics-under-test")


def _yaml(obj: dict[str, Any]) -> str:
    return json.dumps(obj)  # JSON is YAML
