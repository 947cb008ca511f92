"""The publisher's slices on a real apiserver and kube-scheduler: admitted as built, a no-op
publish plans nothing against what the server stored, and Pods asking for a MIG profile, MPS
memory and a high-memory GPU are allocated from them. A structurally bad slice is refused by
the apiserver and by our offline validators alike."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tessera.controller.publisher import SlicePublisher
from tessera.dra.deviceclasses import device_classes
from tessera.dra.devices import build_gpu_devices, with_drain_taints
from tessera.dra.diff import plan_slice_writes
from tessera.dra.slices import COUNTER_SETS_PER_SLICE, DEVICES_PER_SLICE, NodeRef, build_node_slices
from tessera.kube.http import ApiError, KubeClient
from tessera.kube.objects import Api
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim
from tessera.models.layout import Health
from tessera.models.quantity import quantity_value
from tests.dra_gpus import dynamic_gpu, every_strategy
from tests.dra_limits import validate_slice
from tests.integration.kube_helpers import apply, get, unschedulable

pytestmark = pytest.mark.integration

D = "gpu.tessera.dev"


def _result(cluster: LocalCluster, namespace: str, pod: str) -> dict[str, Any] | None:
    """The allocation result of the Pod's generated claim, once the scheduler made it."""
    status = get(cluster, "pod", pod, "-n", namespace).get("status", {})
    names = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses", [])]
    if not names or not names[0]:
        return None
    allocation = get(cluster, "resourceclaim", names[0], "-n", namespace).get("status", {}).get("allocation")
    if not allocation:
        return None
    result: dict[str, Any] = allocation["devices"]["results"][0]
    return result


def _stored_slices(cluster: LocalCluster, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        cluster, "resourceslices", f"--field-selector=spec.driver={D},spec.nodeName={node}"
    )["items"]
    return items


async def test_built_slices_are_admitted_and_allocated_by_the_scheduler(cluster: LocalCluster, namespace: str) -> None:
    name = "publisher-node-1"
    node = cluster.add_node(name, labels={"tessera.dev/test": "publisher"})
    gpus = every_strategy()
    gpus[1] = gpus[1].model_copy(update={"health": Health.HEALTHY})
    ref = NodeRef(name, node["metadata"]["uid"])
    desired = build_node_slices(ref, gpus, draining={"gpu-2-mig-1g-10gb-6"})
    apply(cluster, *device_classes())

    plan = plan_slice_writes(name, desired, _stored_slices(cluster, name))
    assert plan.updates == ()
    assert plan.deletes == ()
    cluster.kubectl(
        "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(plan.creates)})
    )
    stored = _stored_slices(cluster, name)
    assert len(stored) == len(desired) == 2, "one slice of devices, one of counters"

    # What the server stored (uids, timeAdded on taints, its quantity spelling) plans no write.
    assert plan_slice_writes(name, desired, stored).empty
    tainted = [d for s in stored for d in s["spec"].get("devices", []) if d.get("taints")]
    assert tainted
    assert all(t.get("timeAdded") for d in tainted for t in d["taints"])

    # A structurally bad slice: refused by the apiserver, and by our validators.
    bad = copy.deepcopy(next(s for s in plan.creates if s["spec"].get("devices")))
    bad["metadata"]["name"] = f"{name}-bad"
    device = bad["spec"]["devices"][0]
    device["capacity"]["memory"]["requestPolicy"] = {"default": "1Gi", "validRange": {"min": "1Gi"}}
    device.pop("allowMultipleAllocations", None)
    assert validate_slice(bad)
    refused = cluster.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0
    assert "allowMultipleAllocations" in refused.stderr

    devices = {d["name"]: d for s in stored for d in s["spec"].get("devices", [])}
    mps_uuid, static_mig_uuid, dynamic_uuid = gpus[5].uuid, gpus[1].uuid, gpus[6].uuid
    apply(
        cluster,
        claim_template(
            "mig-3g",
            namespace,
            "mig.tessera.dev",
            f'device.attributes["{D}"].migProfile.startsWith("3g") && '
            f'device.attributes["{D}"].parentUUID == "{static_mig_uuid}"',
        ),
        claim_template(
            "dyn-4g",
            namespace,
            "mig.tessera.dev",
            f'device.attributes["{D}"].migProfile.startsWith("4g") && '
            f'device.attributes["{D}"].parentUUID == "{dynamic_uuid}"',
        ),
        claim_template(
            "mps-30gi",
            namespace,
            "shared-gpu.tessera.dev",
            f'device.attributes["{D}"].uuid == "{mps_uuid}"',
            {"memory": "30Gi"},
        ),
        claim_template("big", namespace, "high-memory-gpu", "true"),
        pod_with_claim("mig", namespace, "mig-3g", on_node(name)),
        pod_with_claim("dyn", namespace, "dyn-4g", on_node(name)),
        pod_with_claim("mps-a", namespace, "mps-30gi", on_node(name)),
        pod_with_claim("mps-b", namespace, "mps-30gi", on_node(name)),
        pod_with_claim("big", namespace, "big", on_node(name)),
    )
    results = {}
    for pod in ("mig", "dyn", "mps-a", "mps-b", "big"):
        results[pod] = await wait_for(
            lambda p=pod: _result(cluster, namespace, p), timeout=60, message=f"{pod}'s claim to be allocated"
        )
        assert results[pod]["driver"] == D
        assert results[pod]["pool"] == name
    assert results["mig"]["device"] == "gpu-1-mig-3g-40gb-0"
    assert results["dyn"]["device"] == "gpu-6-dyn-4g-40gb-0"
    for pod in ("mps-a", "mps-b"):
        assert results[pod]["device"] == "gpu-5"
        assert results[pod]["consumedCapacity"]["memory"] == "30Gi"
        assert quantity_value(results[pod]["consumedCapacity"]["compute"]) == 25
    big = devices[results["big"]["device"]]
    assert quantity_value(big["capacity"]["memory"]["value"]) > 40 * 1024**3
    assert big["attributes"]["type"]["string"] in ("gpu", "mig")
    assert not big.get("taints")

    # 79Gi of MPS memory holds two 30Gi shares, not three.
    apply(cluster, pod_with_claim("mps-c", namespace, "mps-30gi", on_node(name)))
    await wait_for(lambda: unschedulable(cluster, namespace, "mps-c"), timeout=60, message="mps-c to be unschedulable")
    assert _result(cluster, namespace, "mps-c") is None


async def test_a_conflict_rereads_only_its_nodes_slices_and_the_next_publish_builds_on_them(
    cluster: LocalCluster,
) -> None:
    """The SlicePublisher on the real apiserver: someone else's write makes our update
    conflict; the publisher re-reads that node's slices alone (the ``spec.nodeName`` field
    selector), raises, and its next publish writes over the new version."""
    names = ("publisher-conflict-a", "publisher-conflict-b")
    refs = [NodeRef(n, cluster.add_node(n, labels={"tessera.dev/test": "publisher"})["metadata"]["uid"]) for n in names]
    async with KubeClient.from_environment(str(cluster.kubeconfig)) as client:
        publisher = SlicePublisher(Api(client))
        devices = [build_gpu_devices(g) for g in every_strategy()[:2]]
        for ref in refs:
            await publisher.publish(ref.name, ref.uid, devices)
        theirs = _stored_slices(cluster, names[0])[0]
        theirs["metadata"]["labels"]["someone"] = "else"  # a write the publisher's cache does not know
        await client.replace(f"/apis/resource.k8s.io/v1/resourceslices/{theirs['metadata']['name']}", theirs)
        b_before = {n: e.resource_version for n, e in publisher.slices[names[1]].items()}

        tainted = [with_drain_taints(g, {d["name"] for d in g.devices}) for g in devices]
        with pytest.raises(ApiError) as conflict:
            await publisher.publish(names[0], refs[0].uid, tainted)
        assert conflict.value.status == 409
        assert {s["metadata"]["name"] for s in _stored_slices(cluster, names[0])} == set(publisher.slices[names[0]])
        assert publisher.slices[names[0]][theirs["metadata"]["name"]].body()["metadata"]["labels"]["someone"] == "else"
        assert {n: e.resource_version for n, e in publisher.slices[names[1]].items()} == b_before

        await publisher.publish(names[0], refs[0].uid, tainted)
        stored = _stored_slices(cluster, names[0])
        assert all(t["key"] == "tessera.dev/repartition" for s in stored for d in s["spec"]["devices"]
                   for t in d["taints"])
        assert stored[0]["metadata"]["labels"]["someone"] == "else", "their label is kept"


def _dry_run(cluster: LocalCluster, *slices: dict[str, Any]) -> str:
    """Server-side dry run of creating ``slices``: "" when the apiserver takes them, else its refusal."""
    done = cluster.kubectl("create", "--dry-run=server", "-f", "-", check=False,
                           input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(slices)}))
    return "" if done.returncode == 0 else done.stderr


async def test_the_apiserver_takes_slices_filled_to_the_builders_limits_and_refuses_one_more(
    cluster: LocalCluster,
) -> None:
    """The limits the builder fills shared slices to, held to the real apiserver: 64 devices that
    consume counters (or carry taints) and 8 counter sets to a slice are taken; a 65th device or
    a 9th counter set is refused. Nine DynamicMIG GPUs, as built, are taken whole."""
    name = "publisher-limits"
    node = cluster.add_node(name, labels={"tessera.dev/test": "publisher"})
    gpus = [dynamic_gpu(i) for i in range(9)]
    built = build_node_slices(NodeRef(name, node["metadata"]["uid"]), gpus, draining={gpus[0].uuid})
    assert [len(s["spec"].get("devices") or s["spec"]["sharedCounters"]) for s in built] == [8, 1, 50, 50, 50, 50, 25]
    assert _dry_run(cluster, *built) == ""

    devices = [d for s in built for d in s["spec"].get("devices") or []]
    full = copy.deepcopy(built[2])
    full["spec"]["devices"] = devices[:DEVICES_PER_SLICE]
    assert DEVICES_PER_SLICE == 64
    assert _dry_run(cluster, full) == ""
    full["spec"]["devices"] = devices[:DEVICES_PER_SLICE + 1]
    assert "must have at most 64 items" in _dry_run(cluster, full)
    assert validate_slice(full)

    counters = copy.deepcopy(built[0])
    counter_sets = [c for s in built for c in s["spec"].get("sharedCounters") or []]
    assert len(counters["spec"]["sharedCounters"]) == COUNTER_SETS_PER_SLICE == 8
    counters["spec"]["sharedCounters"] = counter_sets
    assert "must have at most 8 items" in _dry_run(cluster, counters)
    assert validate_slice(counters)
