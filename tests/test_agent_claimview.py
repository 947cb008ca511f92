"""The agent's ClaimView without a server: of the claim watch's events it keeps only the claims
whose allocation names this node's pool (and forgets them when they no longer do), keeps no stub
of any other claim, and counts only fence tokens of its own boot. The fence against the real
apiserver is tests/integration/test_agent_claimguard.py."""

from __future__ import annotations

from typing import Any, cast

from tessera.agent.claimview import ClaimView, fence_claim_name
from tessera.kube.claims import FENCE_ANNOTATION
from tessera.kube.http import KubeClient

DRIVER = "gpu.tessera.dev"


def claim(name: str, *results: tuple[str, str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "resourceVersion": "1"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": d, "pool": p, "device": dev} for d, p, dev in results]}}}}


def view() -> ClaimView:
    return ClaimView(cast(KubeClient, object()), driver=DRIVER, node="node-a", fence_namespace="tessera-system",
                     own_watch=False)


def test_only_claims_naming_this_nodes_pool_are_kept_and_dropped_when_they_stop() -> None:
    claims = view()
    mine = claim("mine", (DRIVER, "node-a", "gpu-0"))
    claims.feed("ADDED", mine)
    claims.feed("ADDED", claim("elsewhere", (DRIVER, "node-b", "gpu-0")))
    claims.feed("ADDED", claim("other-driver", ("nic.example.com", "node-a", "eth0")))
    claims.feed("ADDED", {"metadata": {"namespace": "ml", "name": "pending"}, "status": {}})
    assert [c["metadata"]["name"] for c in claims.held()] == ["mine"]
    assert claims._stub(mine) is not None
    assert claims._stub(claim("elsewhere", (DRIVER, "node-b", "gpu-0"))) is None, "no stub of other nodes' claims"

    claims.feed("MODIFIED", claim("mine"))  # deallocated
    assert claims.held() == []
    claims.feed("ADDED", mine)
    claims.feed("DELETED", mine)
    assert claims.held() == []


async def test_only_this_boots_fence_tokens_count() -> None:
    claims = view()
    fence = {"metadata": {"namespace": "tessera-system", "name": fence_claim_name("node-a"),
                          "annotations": {FENCE_ANNOTATION: "an-earlier-agent-57"}}}
    claims.feed("ADDED", fence)
    assert claims._seen == 0, "an earlier agent's token proves nothing about this watch"
    fence["metadata"]["annotations"][FENCE_ANNOTATION] = f"{claims._boot}-3"
    claims.feed("MODIFIED", fence)
    assert claims._seen == 3
    assert claims.held() == [], "the fence itself holds nothing"


async def test_a_fence_echoed_in_the_middle_of_a_relist_counts_only_once_the_list_is_in() -> None:
    """A relist passes a list on page by page: an echo on an early page says nothing of the
    claims on later pages (the view still has their state from before the watch broke)."""
    relisting = [True]
    claims = ClaimView(cast(KubeClient, object()), driver=DRIVER, node="node-a", fence_namespace="tessera-system",
                       own_watch=False, relisting=lambda: relisting[0])
    fence = {"metadata": {"namespace": "tessera-system", "name": fence_claim_name("node-a"),
                          "annotations": {FENCE_ANNOTATION: f"{claims._boot}-2"}}}
    claims.feed("MODIFIED", fence)
    claims.feed("ADDED", claim("later-page", (DRIVER, "node-a", "gpu-1")))
    assert claims._seen == 0, "not proved while the list is being passed on"
    relisting[0] = False
    claims.relisted()
    assert claims._seen == 2
    assert [c["metadata"]["name"] for c in claims.held()] == ["later-page"]


def test_a_long_node_name_gives_a_valid_fence_name() -> None:
    assert fence_claim_name("n1") == "tessera-fence-n1"
    long = fence_claim_name("x" * 253)
    assert len(long) <= 253
    assert long != fence_claim_name("x" * 252 + "y")


def test_a_held_claim_keeps_all_but_its_managed_fields() -> None:
    claims = view()
    mine = claim("mine", (DRIVER, "node-a", "gpu-0"))
    mine["metadata"]["managedFields"] = [{"manager": "kubelet", "operation": "Apply", "fieldsV1": {"f:status": {}}}]
    mine["metadata"]["uid"] = "u-1"
    claims.feed("ADDED", mine)
    held = claims.claim_copy("ml", "mine")
    assert held is not None
    assert "managedFields" not in held["metadata"]
    assert held["metadata"] == {"namespace": "ml", "name": "mine", "resourceVersion": "1", "uid": "u-1"}
    assert held["status"] == mine["status"]
    assert "managedFields" in mine["metadata"], "the event's own body is left as it came"
