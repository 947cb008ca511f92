"""Adaptive layouts against the real kube-scheduler, operator and simulated agent: an idle GPU
is recut for a claim whose Pod is Unschedulable, and the scheduler then really allocates the
new device; a claim no menu can satisfy gets one Warning and no recut; a GPU free again goes
back to whole once the claims like its own are older than the lead time and its cooldown is over."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tests.integration.kube_helpers import (
    DRIVER,
    allocated_devices,
    apply,
    claim_of,
    claim_template,
    delete_pod_now,
    get,
    get_or_none,
    gpu_node,
    node_devices,
    on_node,
    pod_with_claim,
    policy,
    wait_devices,
)

pytestmark = pytest.mark.integration

ADAPTIVE: dict[str, Any] = {
    "strategy": "Adaptive",
    "adaptive": {
        "layouts": [
            {"name": "whole"},
            {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}},
        ],
        "idle": "whole",
        "cooldown": "3s",
        "maxRecuts": 1,
        "pendingAfter": "1s",
    },
}
THREE_G = f'device.attributes["{DRIVER}"].migProfile == "3g.40gb"'
HUGE = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("500Gi")) >= 0'


def claim_events(cluster: LocalCluster, namespace: str, claim: str, reason: str) -> list[dict[str, Any]]:
    items = get(cluster, "events", "-n", namespace, "--field-selector",
                f"involvedObject.name={claim},reason={reason}")["items"]
    return list(items)


def whole_gpus(devices: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(n for n, d in devices.items() if d["attributes"]["type"]["string"] == "gpu")


async def test_an_idle_gpu_is_recut_for_a_waiting_claim_and_the_scheduler_allocates_it(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    node = "adaptive-a"
    gpu_node(cluster, tessera, node, "adaptive", "2xH100-80GB")
    apply(cluster, policy("adaptive", "adaptive", ADAPTIVE))
    await wait_devices(cluster, node, lambda d: whole_gpus(d) == ["gpu-0", "gpu-1"], "two whole GPUs (idle layout)")

    # A claim for a 3g slice: nothing published fits it, so its Pod is Unschedulable until a
    # GPU is recut; then the scheduler itself allocates the new partition.
    apply(cluster, claim_template("three-g", namespace, "mig.tessera.dev", THREE_G),
          pod_with_claim("slice", namespace, "three-g", on_node(node)))
    results = await wait_for(lambda: allocated_devices(cluster, namespace, "slice"), timeout=90,
                             message="the 3g claim allocated after a recut")
    device = str(results[0]["device"])
    assert device.startswith("gpu-")
    assert "-mig-3g-40gb-" in device
    assert device in node_devices(cluster, node)
    claim = claim_of(cluster, namespace, "slice")
    assert claim is not None
    name = claim["metadata"]["name"]
    recut_events = claim_events(cluster, namespace, name, "AdaptiveRecut")
    assert len(recut_events) == 1
    assert "halves" in recut_events[0]["message"]
    devices = node_devices(cluster, node)
    assert len(whole_gpus(devices)) == 1, "the cap: one GPU recut, the other left whole"

    def status_names_the_claim() -> dict[str, Any] | None:
        body = get_or_none(cluster, "sharingpolicy", "adaptive")
        rows = (body or {}).get("status", {}).get("adaptive", [])
        return body if any(r["layout"] == "halves" and name in r["reason"] for r in rows) else None

    body = await wait_for(status_names_the_claim, timeout=30, message="the policy status to name the recut")
    assert body["status"]["gpusRecut"] == 1

    # A claim that no layout of the menu could ever satisfy: one Warning, and no recut loop.
    apply(cluster, claim_template("huge", namespace, "whole-gpu.tessera.dev", HUGE),
          pod_with_claim("huge", namespace, "huge", on_node(node)))
    huge = await wait_for(lambda: claim_of(cluster, namespace, "huge"), timeout=30, message="the huge claim")
    huge_name = huge["metadata"]["name"]
    warnings = await wait_for(lambda: claim_events(cluster, namespace, huge_name, "NoAdaptiveLayoutFits"),
                              timeout=60, message="a Warning that nothing can satisfy the claim")
    assert warnings[0]["type"] == "Warning"
    assert "request 'gpu'" in warnings[0]["message"]
    assert "menus of adaptive" in warnings[0]["message"]
    before = node_devices(cluster, node)
    await asyncio.sleep(6)  # six passes of the demand loop
    assert len(claim_events(cluster, namespace, huge_name, "NoAdaptiveLayoutFits")) == 1
    assert node_devices(cluster, node).keys() == before.keys(), "nothing recut for a claim that cannot fit"
    delete_pod_now(cluster, namespace, "huge")

    # The slice's Pod goes. Its GPU is kept cut only while claims like it came within the lead
    # time (they forecast the next ones); past that and the cooldown, it is back to whole, and
    # two Pods that want a whole GPU each get one.
    delete_pod_now(cluster, namespace, "slice")
    await wait_for(lambda: claim_of_gone(cluster, namespace, name), timeout=60, message="the slice's claim gone")
    await wait_for(lambda: whole_gpus(node_devices(cluster, node)) == ["gpu-0", "gpu-1"], timeout=120,
                   message="the free GPU back to whole")
    apply(cluster, claim_template("whole", namespace, "whole-gpu.tessera.dev"),
          pod_with_claim("whole-1", namespace, "whole", on_node(node)),
          pod_with_claim("whole-2", namespace, "whole", on_node(node)))
    for pod in ("whole-1", "whole-2"):
        await wait_for(lambda pod=pod: allocated_devices(cluster, namespace, pod), timeout=90,
                       message=f"{pod} allocated a whole GPU")
    got = sorted(str(allocated_devices(cluster, namespace, p)[0]["device"]) for p in ("whole-1", "whole-2"))
    assert got == ["gpu-0", "gpu-1"]
    assert whole_gpus(node_devices(cluster, node)) == ["gpu-0", "gpu-1"]


def claim_of_gone(cluster: LocalCluster, namespace: str, claim: str) -> bool:
    return get_or_none(cluster, "resourceclaim", claim, "-n", namespace) is None


async def test_a_node_is_kept_for_a_claim_of_two_gpus_and_the_scheduler_places_others_elsewhere(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    """Two nodes of two GPUs, one GPU in use on each: a claim for two whole GPUs fits neither.
    The operator keeps one node for it (its devices tainted), so the real scheduler puts the
    next one-GPU claim on the other node; when the kept node's Pod goes, the taint comes off
    and the scheduler gives the two-GPU claim both of its GPUs."""
    label = "adaptive-gang"
    nodes = ["gang-a", "gang-b"]
    for node in nodes:
        gpu_node(cluster, tessera, node, label, "2xH100-80GB")
    apply(cluster, policy("gang", label, ADAPTIVE))
    for node in nodes:
        await wait_devices(cluster, node, lambda d: whole_gpus(d) == ["gpu-0", "gpu-1"], f"{node}: two whole GPUs")
    on_label = {"tessera.dev/test": label}
    pair = claim_template("pair", namespace, "whole-gpu.tessera.dev")
    pair["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    apply(cluster, claim_template("one", namespace, "whole-gpu.tessera.dev"),
          pod_with_claim("first-a", namespace, "one", on_node("gang-a")),
          pod_with_claim("first-b", namespace, "one", on_node("gang-b")))
    for pod in ("first-a", "first-b"):
        await wait_for(lambda pod=pod: allocated_devices(cluster, namespace, pod), timeout=60,
                       message=f"{pod} allocated")

    def reserved(node: str) -> bool:
        devices = node_devices(cluster, node)
        return bool(devices) and all(
            any(t["key"] == "tessera.dev/reserved" for t in d.get("taints", [])) for d in devices.values())

    apply(cluster, pair, pod_with_claim("gang", namespace, "pair", on_label))
    kept = await wait_for(lambda: next((n for n in nodes if reserved(n)), None), timeout=60,
                          message="a node kept for the two-GPU claim")
    other = next(n for n in nodes if n != kept)
    assert not reserved(other)
    gang_claim = await wait_for(lambda: claim_of(cluster, namespace, "gang"), timeout=30, message="the gang's claim")
    events = claim_events(cluster, namespace, gang_claim["metadata"]["name"], "AdaptiveReserve")
    assert len(events) == 1
    assert kept in events[0]["message"]

    # A new one-GPU claim on either node: the scheduler finds the kept node's free GPU tainted.
    apply(cluster, pod_with_claim("late", namespace, "one", on_label))
    late = await wait_for(lambda: allocated_devices(cluster, namespace, "late"), timeout=60, message="late allocated")
    assert late[0]["pool"] == other, "the kept node's free GPU went to no new claim"
    assert allocated_devices(cluster, namespace, "gang") == []

    # The kept node's Pod ends: its GPUs are both free, the taint comes off, the gang is placed.
    delete_pod_now(cluster, namespace, "first-a" if kept == "gang-a" else "first-b")
    got = await wait_for(lambda: allocated_devices(cluster, namespace, "gang"), timeout=90,
                         message="the two-GPU claim allocated on the kept node")
    assert sorted((str(r["pool"]), str(r["device"])) for r in got) == [(kept, "gpu-0"), (kept, "gpu-1")]
    await wait_for(lambda: not reserved(kept), timeout=30, message="the taint off the kept node")
