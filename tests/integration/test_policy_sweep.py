"""A SharingPolicy deleted while Kopf's watch of policies must start over is forgotten all the
same (``tessera.controller.policysweep``). With the apiserver down, the policy is deleted from
etcd and etcd's history compacted past it (as the apiserver compacts every 5 minutes): that is a
deletion made while the operators' watches were away, older than what a resuming watch may ask
for. When the apiserver is back, the watches resume from a resourceVersion no longer served
(410 Gone), and Kopf lists the policies again and says nothing of the one that went. (Made
through the API instead, the deletion reaches an open watch first; without the compaction the
new apiserver replays it.) Found by a fault campaign, whose restarted operator undid layouts an
older one had written for a policy deleted that way. The policy's GPUs must fall unmanaged: the
NodeLayout keeps their layout, without the policy."""

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

    await asyncio.to_thread(cluster.kill_apiserver)
    try:
        deleted = _etcd(cluster, "/v3/kv/deleterange", {"key": _key(f"/registry/tessera.dev/sharingpolicies/{LABEL}")})
        assert deleted.get("deleted") == "1", deleted
        # A write after the deletion, so that compacting up to now takes the deletion's revision too.
        _etcd(cluster, "/v3/kv/put", {"key": _key(f"/registry/tessera-test/{NODE}"), "value": _key("after")})
        cluster.compact_etcd()
    finally:
        await asyncio.to_thread(cluster.start_apiserver)

    await wait_for(lambda: _spec_policies(cluster) == [None], timeout=90,
                   message="the deleted policy's GPU to fall unmanaged (its layout kept, without the policy)")
    found = sum(op.metrics().get("tessera_operator_policies_found_deleted_total", 0.0) for op in operators)
    assert found > found_before, "found by reading the policies again: no watch event said so"
    assert get(cluster, "nodelayout", NODE)["spec"]["gpus"][0]["strategy"] == "MIG", "nothing was undone"
