"""Taking a claim's devices for this node out of its allocation (pure)."""

from __future__ import annotations

import pytest

from tessera.agent.plugin.claims import AllocatedDevice, ClaimError, ClaimRef, allocated_devices
from tessera.models.devices import DeviceKind
from tests.plugin_helpers import NAMESPACE, NODE, claim, result

DRIVER = "gpu.tessera.dev"


def test_only_our_drivers_results_are_taken_in_allocation_order_with_their_share_and_capacity() -> None:
    body = claim(
        "mixed",
        result("gpu-1", "mps/small", share_id="s-9", consumed={"memory": "4Gi", "compute": "10"}),
        result("nic-3", "net", driver="net.example.com", pool="rack-1"),
        result("gpu-0-mig-3g-40gb-4", "mig"),
    )
    ref = ClaimRef(NAMESPACE, "mixed", body["metadata"]["uid"])

    devices = allocated_devices(body, ref, DRIVER, NODE)

    assert [d.device for d in devices] == ["gpu-1", "gpu-0-mig-3g-40gb-4"]
    first: AllocatedDevice = devices[0]
    assert (first.request, first.request_name, first.share_id) == ("mps/small", "mps", "s-9")
    assert first.consumed_capacity == {"memory": "4Gi", "compute": "10"}
    assert devices[1].ref.kind is DeviceKind.MIG
    assert devices[1].ref.placement == ("3g.40gb", 4)
    assert devices[1].share_id is None


def test_a_claim_split_across_nodes_is_refused() -> None:
    body = claim("split", result("gpu-0"), result("gpu-1", pool="gpu-node-9"))
    with pytest.raises(ClaimError, match="node gpu-node-9"):
        allocated_devices(body, ClaimRef(NAMESPACE, "split", body["metadata"]["uid"]), DRIVER, NODE)


def test_an_allocation_without_results_is_not_ours() -> None:
    body = claim("empty", allocated=True)
    with pytest.raises(ClaimError, match="not Tessera's to prepare"):
        allocated_devices(body, ClaimRef(NAMESPACE, "empty", body["metadata"]["uid"]), DRIVER, NODE)
