"""The fault campaign's device invariant (``tests/integration/campaign.py``) on hand-made looks:
a device missing under a claim is a violation, unless every look since the claim was last
unallocated already lacked it (the scheduler allocated it from a stale view afterwards)."""

from __future__ import annotations

from typing import Any

from tessera.models.layout import GpuStatus
from tests.controller_fleet import NODE, claim_body, layout_body
from tests.dra_gpus import gpu
from tests.integration.campaign import DRIVER, DeviceHistory, check_invariants


def look(rv: int, gpus: list[GpuStatus]) -> list[dict[str, Any]]:
    body = layout_body(gpus)
    body["metadata"]["resourceVersion"] = str(rv)
    return [body]


def claim(name: str, rv: int, devices: list[str]) -> dict[str, Any]:
    body = claim_body(name, devices, namespace="campaign")
    body["metadata"].update({"uid": f"uid-{name}", "resourceVersion": str(rv)})
    for r in (body["status"].get("allocation") or {}).get("devices", {}).get("results", []):
        r["driver"] = DRIVER
    return body


NOTHING = [gpu(1)]  # the node's status without gpu-0
BOTH = [gpu(0), gpu(1)]


def test_a_device_removed_before_the_claim_was_allocated_is_a_stale_allocation_not_a_violation() -> None:
    history = DeviceHistory()
    assert check_invariants(look(10, NOTHING), [claim("c", 11, [])], [], {NODE}, history) == ([], [])
    problems, stale = check_invariants(look(20, NOTHING), [claim("c", 12, ["gpu-0"])], [], {NODE}, history)
    assert problems == []
    assert stale == [f"claim campaign/c was allocated {NODE}/gpu-0 after its agent had removed it (a stale "
                     "scheduler view)"]


def test_a_device_listed_since_the_claim_was_unallocated_and_then_removed_is_a_violation() -> None:
    history = DeviceHistory()
    check_invariants(look(10, BOTH), [claim("c", 11, [])], [], {NODE}, history)
    check_invariants(look(12, BOTH), [claim("c", 13, ["gpu-0"])], [], {NODE}, history)
    problems, stale = check_invariants(look(20, NOTHING), [claim("c", 13, ["gpu-0"])], [], {NODE}, history)
    assert problems == [f"claim campaign/c holds {NODE}/gpu-0, which its agent's status (rv 20) no longer has"]
    assert stale == []


def test_a_claim_never_seen_unallocated_gets_no_benefit_of_the_doubt() -> None:
    history = DeviceHistory()
    problems, _ = check_invariants(look(20, NOTHING), [claim("c", 12, ["gpu-0"])], [], {NODE}, history)
    assert len(problems) == 1
    problems, _ = check_invariants(look(20, NOTHING), [claim("c", 12, ["gpu-0"])], [], {NODE})
    assert len(problems) == 1, "without a history every missing device counts"
