"""What is deleted while Kopf's watches must start over is forgotten all the same. Kopf lists
again after 410 Gone and passes on what exists, but says nothing of what went: the operator
would go on applying a deleted SharingPolicy (a fault campaign's restarted operator found one
undoing the layouts written for it) or holding on to a deleted ResourceClaim.

Each case deletes the object from etcd with the apiserver down and compacts etcd's history past
it (as the apiserver compacts every 5 minutes): a deletion made while the watches were away,
older than what a resuming watch may ask for. (Made through the API instead, it reaches an open
watch first; without the compaction the new apiserver replays it.) Policies: the operator
lists them again (``tessera.controller.policysweep``), and the policy's GPU falls unmanaged (its
layout kept, without the policy). Claims: the operator's ordered claim watch relists and tells
the view of the deletion (``ClaimChecks``'s ``gone``), and the claim stops counting as pending."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from typing import Any

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tests.integration.kube_helpers import apply, get, gpu_node, policy, wait_policy

pytestmark = pytest.mark.integration

NODE = "policy-sweep"
LABEL = "policy-sweep"


def _key(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _etcd(cluster: LocalCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{cluster.etcd_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _delete_from_etcd_while_the_apiserver_is_down(cluster: LocalCluster, key: str) -> None:
    """With the apiserver down, delete ``key``, write something after it and compact etcd's
    history up to that write, then start the apiserver again."""
    cluster.kill_apiserver()
    try:
        deleted = _etcd(cluster, "/v3/kv/deleterange", {"key": _key(key)})
        assert deleted.get("deleted") == "1", (key, deleted)
        # A write after the deletion, so that compacting up to now takes the deletion's revision too.
        _etcd(cluster, "/v3/kv/put", {"key": _key(f"/registry/tessera-test/{NODE}"), "value": _key("after")})
        cluster.compact_etcd()
    finally:
        cluster.start_apiserver()


def _spec_policies(cluster: LocalCluster) -> list[Any]:
    return [g.get("policy") for g in get(cluster, "nodelayout", NODE)["spec"].get("gpus", [])]


async def test_a_policy_deleted_while_the_watch_starts_over_is_forgotten(
        cluster: LocalCluster, tessera: TesseraProcesses) -> None:
    gpu_node(cluster, tessera, NODE, LABEL, "1xH100-80GB")
    apply(cluster, policy(LABEL, LABEL, {"strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}}))
    await wait_policy(cluster, LABEL, "Ready", "True", gpus=1)
    assert _spec_policies(cluster) == [LABEL]
    operators = tessera.operators()
    found_before = sum(op.metrics().get("tessera_operator_policies_found_deleted_total", 0.0) for op in operators)

    await asyncio.to_thread(_delete_from_etcd_while_the_apiserver_is_down, cluster,
                            f"/registry/tessera.dev/sharingpolicies/{LABEL}")

    await wait_for(lambda: _spec_policies(cluster) == [None], timeout=90,
                   message="the deleted policy's GPU to fall unmanaged (its layout kept, without the policy)")
    found = sum(op.metrics().get("tessera_operator_policies_found_deleted_total", 0.0) for op in operators)
    assert found > found_before, "found by reading the policies again: no watch event said so"
    assert get(cluster, "nodelayout", NODE)["spec"]["gpus"][0]["strategy"] == "MIG", "nothing was undone"


async def test_a_claim_deleted_while_the_watches_start_over_is_forgotten(
        cluster: LocalCluster, tessera: TesseraProcesses, namespace: str) -> None:
    operator = tessera.operators()[0]
    await wait_for(lambda: operator.metrics().get("tessera_operator_pending_claims") is not None, timeout=60,
                   message="the operator's metrics")
    before = operator.metrics()["tessera_operator_pending_claims"]
    huge = 'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("500Gi")) >= 0'
    apply(cluster, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": "never-allocated", "namespace": namespace},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": "gpu.tessera.dev", "selectors": [{"cel": {"expression": huge}}]}}]}}})
    await wait_for(lambda: operator.metrics().get("tessera_operator_pending_claims") == before + 1, timeout=30,
                   message="the claim counted as pending")

    await asyncio.to_thread(_delete_from_etcd_while_the_apiserver_is_down, cluster,
                            f"/registry/resourceclaims/{namespace}/never-allocated")

    await wait_for(lambda: operator.metrics().get("tessera_operator_pending_claims") == before, timeout=60,
                   message="the deleted claim to stop counting as pending")
