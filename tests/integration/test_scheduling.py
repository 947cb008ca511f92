"""What the real kube-scheduler of 1.36 does with Tessera's devices, beyond one claim per
device: an unchanged ``nvidia.com/gpu`` Pod served through the extended resource of
``whole-gpu.tessera.dev``, ``matchAttribute`` on the PCIe root of the simulated HGX board
(4 roots x 2 GPUs), and ``firstAvailable`` alternatives.

Nodes are Node objects (there is no kubelet); their slices are what the operator's own slice
builder makes from what the agent's own status code reports for the simulated backend, so
the attributes the scheduler matches on are the ones a real node publishes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.status import gpu_status
from tessera.dra.deviceclasses import device_classes
from tessera.dra.slices import NodeRef, build_node_slices
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.models.attributes import PCIE_ROOT_ATTRIBUTE
from tests.integration.kube_helpers import (
    DRIVER,
    allocated_devices,
    apply,
    claim_template,
    delete_pod_now,
    get,
    get_or_none,
    node_devices,
    on_node,
    pod_with_claim,
    unschedulable,
)

pytestmark = pytest.mark.integration

ATTR = f'device.attributes["{DRIVER}"]'


class SimulatedNodes:
    """Nodes with simulated GPUs, published as Exclusive GPUs; removed again afterwards."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.names: list[str] = []
        self.slices: list[str] = []

    def add(self, name: str, spec: str) -> SimulatedBackend:
        node = self.cluster.add_node(name)
        backend = SimulatedBackend.from_spec(name, spec)
        inventory = backend.inventory()
        statuses = [gpu_status(g, None, None, inventory.driver_version) for g in inventory.gpus]
        slices = build_node_slices(NodeRef(name, node["metadata"]["uid"]), statuses)
        apply(self.cluster, *slices)
        self.names.append(name)
        self.slices += [s["metadata"]["name"] for s in slices]
        return backend

    def remove_all(self) -> None:
        if self.slices:
            self.cluster.kubectl("delete", "resourceslice", *self.slices, "--ignore-not-found")
        if self.names:
            self.cluster.kubectl("delete", "node", *self.names, "--ignore-not-found")


@pytest.fixture
def nodes(cluster: LocalCluster) -> Iterator[SimulatedNodes]:
    apply(cluster, *device_classes())
    made = SimulatedNodes(cluster)
    try:
        yield made
    finally:
        made.remove_all()


def _scheduled_condition(cluster: LocalCluster, namespace: str, pod: str) -> dict[str, Any] | None:
    conditions = get(cluster, "pod", pod, "-n", namespace).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


async def test_a_pod_asking_for_nvidia_gpu_gets_a_whole_tessera_gpu_through_a_claim_the_scheduler_makes(
    cluster: LocalCluster, nodes: SimulatedNodes, namespace: str
) -> None:
    nodes.add("ext-node-1", "2xA100-80GB")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy", "namespace": namespace},
        "spec": {
            "nodeSelector": on_node("ext-node-1"),
            "containers": [{"name": "cuda", "image": "registry.invalid/none:0",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    apply(cluster, pod)

    def extended_status() -> dict[str, Any] | None:
        body = get(cluster, "pod", "legacy", "-n", namespace)
        status = body.get("status", {}).get("extendedResourceClaimStatus")
        return body if status and body["spec"].get("nodeName") else None

    body = await wait_for(extended_status, timeout=60, message="the Pod to be bound with an extended-resource claim")
    status = body["status"]["extendedResourceClaimStatus"]
    assert body["spec"]["nodeName"] == "ext-node-1"
    assert [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]] == [("cuda", "nvidia.com/gpu")]
    claim = get(cluster, "resourceclaim", status["resourceClaimName"], "-n", namespace)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, "ext-node-1")
    device = node_devices(cluster, "ext-node-1")[result["device"]]
    assert device["attributes"]["type"]["string"] == "gpu", "a whole GPU, not a share or a partition"
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "whole-gpu.tessera.dev"
    delete_pod_now(cluster, namespace, "legacy")


def _two_gpus_on_one_root(name: str, namespace: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "whole-gpu.tessera.dev",
                                                     "allocationMode": "ExactCount", "count": count}}],
            "constraints": [{"requests": ["gpu"], "matchAttribute": PCIE_ROOT_ATTRIBUTE}],
        }}},
    }


async def test_match_attribute_on_pcie_root_gives_a_pair_behind_one_root_or_leaves_the_claim_pending(
    cluster: LocalCluster, nodes: SimulatedNodes, namespace: str
) -> None:
    nodes.add("hgx-1", "8xH100-80GB")
    devices = node_devices(cluster, "hgx-1")
    root_of = {name: d["attributes"][PCIE_ROOT_ATTRIBUTE]["string"] for name, d in devices.items()}
    numa_of = {name: d["attributes"]["numaNode"]["int"] for name, d in devices.items()}
    assert len(set(root_of.values())) == 4, "the HGX board as published: four PCIe roots"
    assert len(set(numa_of.values())) == 2, "and two NUMA nodes"
    # Take one GPU behind each of the first three roots: a pair behind one root is left only
    # behind the fourth, and the first two free GPUs in name order sit behind different roots.
    taken = ["gpu-0", "gpu-2", "gpu-4"]
    apply(cluster, *(claim_template(f"one-{g}", namespace, "whole-gpu.tessera.dev", f'{ATTR}.index == {g[4:]}')
                     for g in taken))
    apply(cluster, *(pod_with_claim(f"hold-{g}", namespace, f"one-{g}", on_node("hgx-1")) for g in taken))
    for g in taken:
        await wait_for(lambda g=g: allocated_devices(cluster, namespace, f"hold-{g}"), timeout=60,
                       message=f"{g} to be taken")

    apply(cluster, _two_gpus_on_one_root("pair", namespace, 2), pod_with_claim("pair", namespace, "pair",
                                                                                on_node("hgx-1")))
    pair = await wait_for(lambda: allocated_devices(cluster, namespace, "pair"), timeout=60,
                          message="the pair to be allocated")
    got = sorted(r["device"] for r in pair)
    assert got == ["gpu-6", "gpu-7"], f"the only free pair behind one root, got {got}"
    assert root_of["gpu-6"] == root_of["gpu-7"]

    # Three GPUs never sit behind one root: the claim stays pending, and the scheduler says why.
    apply(cluster, _two_gpus_on_one_root("triple", namespace, 3),
          pod_with_claim("triple", namespace, "triple", on_node("hgx-1")))
    await wait_for(lambda: unschedulable(cluster, namespace, "triple"), timeout=60,
                   message="the scheduler to give up on three GPUs behind one root")
    reason = _scheduled_condition(cluster, namespace, "triple")
    assert reason is not None
    assert "cannot allocate all claims" in reason["message"], reason
    assert allocated_devices(cluster, namespace, "triple") == []
    for pod in ("pair", "triple", *(f"hold-{g}" for g in taken)):
        delete_pod_now(cluster, namespace, pod)


async def test_first_available_takes_two_40gb_a100s_where_the_80gb_one_is_taken(
    cluster: LocalCluster, nodes: SimulatedNodes, namespace: str
) -> None:
    nodes.add("fa-big", "1xA100-80GB")
    nodes.add("fa-small", "2xA100-40GB")

    def model_is(model: str) -> list[dict[str, Any]]:
        return [{"cel": {"expression": f'{ATTR}.model == "{model}"'}}]

    prioritized = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "big-or-two-small", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "one-80gb", "deviceClassName": "whole-gpu.tessera.dev", "selectors": model_is("A100-80GB")},
            {"name": "two-40gb", "deviceClassName": "whole-gpu.tessera.dev", "selectors": model_is("A100-40GB"),
             "allocationMode": "ExactCount", "count": 2},
        ]}]}}},
    }
    fa_nodes = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                      "values": ["fa-big", "fa-small"]}]}

    def pod(name: str) -> dict[str, Any]:
        body = pod_with_claim(name, namespace, "big-or-two-small")
        body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [fa_nodes]}}}
        return body

    apply(cluster, prioritized, pod("first"))
    first = await wait_for(lambda: allocated_devices(cluster, namespace, "first"), timeout=60,
                           message="the first claim to be allocated")
    assert [(r["request"], r["pool"]) for r in first] == [("gpu/one-80gb", "fa-big")], "the first choice, while free"

    apply(cluster, pod("second"))
    second = await wait_for(lambda: allocated_devices(cluster, namespace, "second"), timeout=60,
                            message="the second claim to be allocated")
    assert sorted((r["request"], r["pool"], r["device"]) for r in second) == [
        ("gpu/two-40gb", "fa-small", "gpu-0"), ("gpu/two-40gb", "fa-small", "gpu-1")], "the alternative"

    apply(cluster, pod("third"))
    await wait_for(lambda: unschedulable(cluster, namespace, "third"), timeout=60,
                   message="no alternative left for a third claim")
    assert get_or_none(cluster, "pod", "third", "-n", namespace) is not None
    for name in ("first", "second", "third"):
        delete_pod_now(cluster, namespace, name)
