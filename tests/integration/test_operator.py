"""The operator end to end: real control plane, real kube-scheduler, the operator and node
agents (simulated backend) as real processes. Policies become NodeLayouts, agents make the
layouts, the operator publishes ResourceSlices, and the scheduler allocates from them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tessera.models.quantity import parse_quantity
from tests.integration.kube_helpers import (
    DRIVER,
    allocated_devices,
    allocation,
    apply,
    claim_template,
    condition,
    decided,
    delete_pod_now,
    get,
    get_or_none,
    gpu_node,
    mig_profiles,
    node_devices,
    node_slices,
    on_node,
    pod_with_claim,
    policy,
    unschedulable,
    wait_devices,
    wait_policy,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def test_static_mig_policy_publishes_partitions_and_a_3g_claim_is_scheduled(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    for node in ("mig-a", "mig-b"):
        gpu_node(cluster, tessera, node, "static-mig", "1xH100-80GB")
    apply(
        cluster,
        policy(
            "static-mig",
            "static-mig",
            {
                "strategy": "MIG",
                "mig": {"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
            },
        ),
    )
    want = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    for node in ("mig-a", "mig-b"):
        await wait_devices(cluster, node, lambda d: mig_profiles(d) == want, f"{node} to publish {want}")

    body = await wait_policy(cluster, "static-mig", "Ready", "True", gpus=2)
    assert body["status"]["nodes"] == 2
    assert body["status"]["gpus"] == 2
    assert body["status"]["gpusApplied"] == 2
    assert body["status"]["devicesPublished"] == 8
    memory = {
        d["attributes"]["migProfile"]["string"]: d["capacity"]["memory"]["value"]
        for d in node_devices(cluster, "mig-a").values()
    }
    assert parse_quantity(memory["3g.40gb"]) == 40448 * 2**20, "capacity is the profile's real memory"

    apply(
        cluster,
        claim_template(
            "three-g", namespace, "mig.tessera.dev", cel=f'device.attributes["{DRIVER}"].migProfile == "3g.40gb"'
        ),
        pod_with_claim("uses-3g", namespace, "three-g"),
    )
    results = await wait_for(
        lambda: allocated_devices(cluster, namespace, "uses-3g"), timeout=60, message="the 3g claim to be allocated"
    )
    assert results[0]["driver"] == DRIVER
    assert results[0]["pool"] in {"mig-a", "mig-b"}
    devices = node_devices(cluster, results[0]["pool"])
    assert devices[results[0]["device"]]["attributes"]["migProfile"]["string"] == "3g.40gb"
    assert get(cluster, "pod", "uses-3g", "-n", namespace)["spec"]["nodeName"] == results[0]["pool"]


async def test_mps_shares_one_gpu_between_claims_until_memory_runs_out(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    gpu_node(cluster, tessera, "mps-a", "mps", "1xH100-80GB")
    apply(
        cluster,
        policy(
            "mps",
            "mps",
            {
                "strategy": "MPS",
                "mps": {"memory": {"default": "10Gi", "min": "1Gi", "step": "1Gi"}},
            },
        ),
    )
    await wait_devices(
        cluster, "mps-a", lambda d: d.get("gpu-0", {}).get("allowMultipleAllocations"), "the shared GPU to be published"
    )
    # 81559 MiB is 79.6Gi: seven claims of 10Gi fit, the eighth does not.
    apply(cluster, claim_template("ten-gi", namespace, "shared-gpu.tessera.dev", capacity={"memory": "10Gi"}))
    apply(cluster, *(pod_with_claim(f"share-{i}", namespace, "ten-gi", on_node("mps-a")) for i in range(8)))

    pods = [f"share-{i}" for i in range(8)]

    def allocated_now() -> list[int]:
        return [i for i in range(8) if allocation(cluster, namespace, f"share-{i}") is not None]

    # Seven, not just "each allocated or refused": kube-scheduler 1.36.5 may refuse one of the
    # seven while it counts another's share twice, and tries it again a moment later (the
    # operator wakes it: tessera.controller.schedwake).
    allocated = await wait_for(lambda: len(allocated_now()) == 7 and allocated_now(), timeout=90,
                               message="seven of the eight share Pods to be allocated")
    await wait_for(lambda: decided(cluster, namespace, *pods), timeout=60, message="the eighth to be refused")
    assert allocated_now() == allocated, "the eighth never fits"
    for i in allocated:
        result = allocated_devices(cluster, namespace, f"share-{i}")[0]
        assert result["device"] == "gpu-0"
        assert result["consumedCapacity"]["memory"] == "10Gi"
    share_ids = {allocated_devices(cluster, namespace, f"share-{i}")[0]["shareID"] for i in allocated}
    assert len(share_ids) == 7


async def test_a_pod_refused_as_a_share_is_allocated_gets_the_scheduler_woken_once(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    """tessera.controller.schedwake: a Pod refused right beside another claim's share is a
    suspect of kube-scheduler's double count; a moment later the operator writes an annotation
    on the shared class, the scheduler moves the Pods its DRA plugin refused back to its active
    queue (its metrics count the DeviceClass update) and tries this one again; it still does
    not fit, and it is not woken for a second time."""
    gpu_node(cluster, tessera, "wake-a", "wake", "1xH100-80GB")
    mps = {"strategy": "MPS", "mps": {"memory": {"default": "20Gi", "min": "1Gi", "step": "1Gi"}}}
    apply(cluster, policy("wake", "wake", mps))
    await wait_devices(cluster, "wake-a", lambda d: d.get("gpu-0", {}).get("allowMultipleAllocations"),
                       "the shared GPU to be published")
    apply(cluster, claim_template("twenty-gi", namespace, "shared-gpu.tessera.dev", capacity={"memory": "20Gi"}))
    for pod in ("a", "b"):
        apply(cluster, pod_with_claim(pod, namespace, "twenty-gi", on_node("wake-a")))
        await wait_for(lambda p=pod: allocation(cluster, namespace, p), timeout=60, message=f"share {pod}")

    def woken() -> str | None:
        annotations = get(cluster, "deviceclass", "shared-gpu.tessera.dev")["metadata"].get("annotations") or {}
        return annotations.get("tessera.dev/scheduler-woken-at")

    def moved_by_class_updates() -> float:
        return sum(v for k, v in cluster.scheduler_metrics().items()
                   if k.startswith("scheduler_queue_incoming_pods_total") and "DeviceClassUpdate" in k)

    before, moved_before = woken(), moved_by_class_updates()
    # 79.6Gi: a third 20Gi share fits, a fourth does not, and is refused as the third is allocated.
    apply(cluster, *(pod_with_claim(p, namespace, "twenty-gi", on_node("wake-a")) for p in ("c", "d")))
    await wait_for(lambda: decided(cluster, namespace, "c", "d"), timeout=60,
                   message="one more share allocated and the other refused")
    refused = [p for p in ("c", "d") if allocation(cluster, namespace, p) is None]
    assert len(refused) == 1
    at = await wait_for(lambda: woken() != before and woken(), timeout=30,
                        message="the operator to write the shared class's annotation")
    await wait_for(lambda: moved_by_class_updates() > moved_before, timeout=30,
                   message="the scheduler to move refused Pods back to its queue on the DeviceClass update")
    await wait_for(lambda: unschedulable(cluster, namespace, refused[0]), timeout=30, message="a refusal again")
    assert allocation(cluster, namespace, refused[0]) is None
    await asyncio.sleep(5)
    assert woken() == at, "a suspect wakes the scheduler once"


async def test_dynamic_mig_counters_stop_the_scheduler_from_over_allocating(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    gpu_node(cluster, tessera, "dyn-a", "dynamic", "1xH100-80GB")  # Hopper: MIG mode without a reset
    apply(cluster, policy("dynamic", "dynamic", {"strategy": "DynamicMIG"}))
    await wait_devices(
        cluster,
        "dyn-a",
        lambda d: any(n.startswith("gpu-0-dyn-3g") for n in d),
        "DynamicMIG partitions to be published",
    )
    counter_slices = [s for s in node_slices(cluster, "dyn-a") if s["spec"].get("sharedCounters")]
    assert len(counter_slices) == 1, "counters live in a slice of their own"

    apply(
        cluster,
        claim_template(
            "dyn-3g", namespace, "mig.tessera.dev", cel=f'device.attributes["{DRIVER}"].migProfile == "3g.40gb"'
        ),
    )
    apply(cluster, *(pod_with_claim(f"dyn-{i}", namespace, "dyn-3g", on_node("dyn-a")) for i in range(3)))

    pods = [f"dyn-{i}" for i in range(3)]
    await wait_for(
        lambda: decided(cluster, namespace, *pods), timeout=90, message="the DynamicMIG Pods to be allocated or refused"
    )
    devices = sorted(
        allocated_devices(cluster, namespace, f"dyn-{i}")[0]["device"]
        for i in range(3)
        if allocation(cluster, namespace, f"dyn-{i}") is not None
    )
    assert devices == ["gpu-0-dyn-3g-40gb-0", "gpu-0-dyn-3g-40gb-4"], "two 3g fit an 8-slice GPU, not three"


async def test_a_policy_change_drains_an_allocated_partition_before_replacing_it(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    gpu_node(cluster, tessera, "drain-a", "drain", "1xH100-80GB")
    apply(cluster, policy("drain", "drain", {"strategy": "MIG", "mig": {"preset": "all-1g"}}))
    await wait_devices(cluster, "drain-a", lambda d: mig_profiles(d) == ["1g.10gb"] * 7, "seven 1g partitions")
    apply(
        cluster,
        claim_template("one-g", namespace, "mig.tessera.dev"),
        pod_with_claim("holder", namespace, "one-g", on_node("drain-a")),
    )
    held = (
        await wait_for(
            lambda: allocated_devices(cluster, namespace, "holder"), timeout=60, message="the 1g claim to be allocated"
        )
    )[0]["device"]

    apply(cluster, policy("drain", "drain", {"strategy": "MIG", "mig": {"preset": "whole"}}))

    def draining() -> dict[str, Any] | None:
        c = condition(get(cluster, "sharingpolicy", "drain"), "Progressing")
        return c if c is not None and c["status"] == "True" and c["reason"] == "Draining" else None

    progressing = await wait_for(draining, timeout=60, message="the policy to report the drain")
    assert "1 claim on drain-a GPU 0" in progressing["message"]

    def all_tainted(d: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
        tainted = all(any(t["key"] == "tessera.dev/repartition" for t in x.get("taints", [])) for x in d.values())
        return d if d and tainted else None

    devices = await wait_devices(cluster, "drain-a", all_tainted, "every changing device to be tainted")
    assert held in devices, "the allocated partition is still there while its claim exists"
    layout = get(cluster, "nodelayout", "drain-a")
    assert [i["profile"] for g in layout["spec"]["gpus"] for i in g["migInstances"]] == ["1g.10gb"] * 7
    agent_gpu = layout["status"]["gpus"][0]
    assert len(agent_gpu["migInstances"]) == 7, "the agent has not been asked to destroy anything"

    claim = allocation(cluster, namespace, "holder")
    assert claim is not None
    delete_pod_now(cluster, namespace, "holder")
    await wait_devices(
        cluster, "drain-a", lambda d: mig_profiles(d) == ["7g.80gb"], "the new layout to be published", timeout=90
    )
    devices = node_devices(cluster, "drain-a")
    assert not any(d.get("taints") for d in devices.values()), "the drain taint is gone with the drain"
    await wait_policy(cluster, "drain", "Ready", "True")


async def test_a_drain_completes_while_an_admin_access_claim_looks_at_the_gpu(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    cluster.kubectl("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
    gpu_node(cluster, tessera, "admin-a", "admin", "1xH100-80GB")
    apply(cluster, policy("admin", "admin", {"strategy": "MIG", "mig": {"preset": "all-1g"}}))
    await wait_devices(cluster, "admin-a", lambda d: mig_profiles(d) == ["1g.10gb"] * 7, "seven 1g partitions")
    monitor_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "monitor", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.tessera.dev", "allocationMode": "All", "adminAccess": True}}]}},
    }
    monitor_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "monitor", "namespace": namespace},
        "spec": {"nodeSelector": on_node("admin-a"),
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "monitor"}],
                 "containers": [{"name": "dcgm", "image": "registry.invalid/none:0",
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
    }
    apply(cluster, monitor_claim, monitor_pod, claim_template("one-g", namespace, "mig.tessera.dev"),
          pod_with_claim("worker", namespace, "one-g", on_node("admin-a")))

    def monitor_results() -> list[dict[str, Any]]:
        claim = get(cluster, "resourceclaim", "monitor", "-n", namespace)
        return list(((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []))

    watched = await wait_for(monitor_results, timeout=60, message="the admin claim to be allocated")
    assert len(watched) == 7, "admin access sees every partition"
    assert all(r.get("adminAccess") is True for r in watched)
    worker = (await wait_for(lambda: allocated_devices(cluster, namespace, "worker"), timeout=60,
                             message="the worker's claim"))[0]["device"]
    assert worker in {r["device"] for r in watched}, "the admin claim looks at the worker's partition too"

    apply(cluster, policy("admin", "admin", {"strategy": "MIG", "mig": {"preset": "whole"}}))

    def draining() -> dict[str, Any] | None:
        c = condition(get(cluster, "sharingpolicy", "admin"), "Progressing")
        return c if c is not None and c["status"] == "True" and c["reason"] == "Draining" else None

    progressing = await wait_for(draining, timeout=60, message="the policy to wait for the worker")
    assert "1 claim on admin-a GPU 0" in progressing["message"], "the worker's claim, not the admin claim"

    delete_pod_now(cluster, namespace, "worker")
    await wait_devices(
        cluster, "admin-a", lambda d: mig_profiles(d) == ["7g.80gb"], "the new layout, admin claim or not", timeout=90
    )
    await wait_policy(cluster, "admin", "Ready", "True")
    assert len(monitor_results()) == 7, "the admin claim still exists, still allocated, and held nothing"
    delete_pod_now(cluster, namespace, "monitor")
    cluster.kubectl("delete", "sharingpolicy", "admin", "--wait=false")  # later tests list every policy


async def test_high_memory_device_class_selects_only_devices_above_40gi(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    gpu_node(cluster, tessera, "hm-mig", "hm-mig", "1xH100-80GB")
    gpu_node(cluster, tessera, "hm-whole", "hm-whole", "1xA100-40GB")
    gpu_node(cluster, tessera, "hm-big", "hm-big", "1xH200-141GB")
    apply(cluster, policy("hm-mig", "hm-mig", {"strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}}))
    await wait_devices(cluster, "hm-mig", lambda d: mig_profiles(d) == ["3g.40gb", "3g.40gb"], "two 3g.40gb")
    await wait_devices(cluster, "hm-whole", lambda d: "gpu-0" in d, "the whole A100-40GB")
    await wait_devices(cluster, "hm-big", lambda d: "gpu-0" in d, "the whole H200")

    # 3g.40gb has 40448 MiB (39.5Gi) and the A100-40GB 40960 MiB (exactly 40Gi): neither is above 40Gi.
    apply(cluster, claim_template("big", namespace, "high-memory-gpu"))
    apply(
        cluster,
        *(pod_with_claim(f"big-{n}", namespace, "big", on_node(n)) for n in ("hm-mig", "hm-whole", "hm-big")),
    )
    await wait_for(
        lambda: allocated_devices(cluster, namespace, "big-hm-big"),
        timeout=60,
        message="the H200 to be allocated as a high-memory GPU",
    )
    refused = ("big-hm-mig", "big-hm-whole")
    await wait_for(
        lambda: all(unschedulable(cluster, namespace, p) for p in refused),
        timeout=60,
        message="the 39.5Gi and 40Gi devices to be refused",
    )


async def test_deleting_a_node_removes_its_slices_and_layout(cluster: LocalCluster, tessera: TesseraProcesses) -> None:
    agent = gpu_node(cluster, tessera, "gone-a", "gone", "2xA100-80GB")
    await wait_for(lambda: len(node_slices(cluster, "gone-a")) == 1, timeout=60, message="the node's slice")
    agent.stop()
    cluster.kubectl("delete", "node", "gone-a")
    await wait_for(lambda: not node_slices(cluster, "gone-a"), timeout=60, message="the slices to go")
    await wait_for(
        lambda: get_or_none(cluster, "nodelayout", "gone-a") is None,
        timeout=60,
        message="the NodeLayout to go with its Node",
    )


async def test_an_operator_restart_writes_nothing_when_nothing_changed(
    cluster: LocalCluster, tessera: TesseraProcesses
) -> None:
    gpu_node(cluster, tessera, "restart-a", "restart", "2xH100-80GB")
    apply(cluster, policy("restart", "restart", {"strategy": "MIG", "mig": {"preset": "all-balanced"}}))
    await wait_policy(cluster, "restart", "Ready", "True")

    def versions() -> dict[str, str]:
        out = {}
        for kind in ("resourceslices", "nodelayouts", "sharingpolicies"):
            for item in get(cluster, kind)["items"]:
                out[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
        return out

    before = versions()
    for process in list(tessera.processes):
        if process.name == "operator":
            process.stop()
            tessera.processes.remove(process)
    restarted = tessera.operator("operator-restarted")
    gpu_nodes = len(get(cluster, "nodelayouts")["items"])

    def reconciled() -> dict[str, float] | None:
        metrics = restarted.metrics()
        done = metrics.get('tessera_operator_reconciles_total{result="ok"}', 0)
        statuses = metrics.get("tessera_operator_policy_status_passes_total", 0)
        return metrics if done >= gpu_nodes and statuses >= 1 else None

    metrics = await wait_for(reconciled, timeout=60, message="the restarted operator to reconcile every node")
    writes = {k: v for k, v in metrics.items() if k.startswith("tessera_operator_api_writes_total") and v}
    assert writes == {}, f"a restart with nothing new wrote: {json.dumps(writes)}"
    assert versions() == before


async def test_an_evict_drain_evicts_the_pods_holding_the_partition_after_its_timeout(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    gpu_node(cluster, tessera, "evict-a", "evict", "1xH100-80GB")
    drain = {"mode": "Evict", "timeout": "2s"}
    apply(cluster, policy("evict", "evict", {"strategy": "MIG", "mig": {"preset": "all-1g"}, "drain": drain}))
    await wait_devices(cluster, "evict-a", lambda d: mig_profiles(d) == ["1g.10gb"] * 7, "seven 1g partitions")
    apply(
        cluster,
        claim_template("one-g", namespace, "mig.tessera.dev"),
        pod_with_claim("holder", namespace, "one-g", on_node("evict-a")),
    )
    await wait_for(lambda: allocated_devices(cluster, namespace, "holder"), timeout=60, message="the 1g claim")

    apply(cluster, policy("evict", "evict", {"strategy": "MIG", "mig": {"preset": "whole"}, "drain": drain}))
    # Past the timeout the operator asks for an eviction; with no kubelet the Pod then stays
    # Terminating, which is as far as an eviction goes here.
    evicted = await wait_for(
        lambda: get(cluster, "pod", "holder", "-n", namespace)["metadata"].get("deletionTimestamp"),
        timeout=60,
        message="the Pod holding the partition to be evicted",
    )
    assert evicted
    layout = get(cluster, "nodelayout", "evict-a")
    assert [i["profile"] for g in layout["spec"]["gpus"] for i in g["migInstances"]] == ["1g.10gb"] * 7

    delete_pod_now(cluster, namespace, "holder")
    await wait_devices(cluster, "evict-a", lambda d: mig_profiles(d) == ["7g.80gb"], "the new layout", timeout=90)


async def test_a_slice_someone_else_deletes_is_published_again(
    cluster: LocalCluster, tessera: TesseraProcesses
) -> None:
    # The kubelet wipes a driver's slices when its plugin goes away; when the agent is back,
    # what it reports must be published again, whatever the operator wrote before.
    gpu_node(cluster, tessera, "wiped-a", "wiped", "2xH100-80GB")
    await wait_for(lambda: len(node_slices(cluster, "wiped-a")) == 1, timeout=60, message="the node's slice")
    (first,) = node_slices(cluster, "wiped-a")
    assert first["metadata"]["name"] == "wiped-a-tessera-gpus"
    cluster.kubectl("delete", "resourceslice", "wiped-a-tessera-gpus")
    again = await wait_for(
        lambda: next((s for s in node_slices(cluster, "wiped-a")
                      if s["metadata"]["uid"] != first["metadata"]["uid"]), None),
        timeout=60,
        message="the deleted slice to be published again",
    )
    assert again["metadata"]["name"] == "wiped-a-tessera-gpus"
    assert [d["name"] for d in again["spec"]["devices"]] == ["gpu-0", "gpu-1"]
