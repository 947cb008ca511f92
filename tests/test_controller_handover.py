"""The handover's clock (tessera.controller.handover): a GPU is ready for the fresh claims read
only once its changing devices have been published tainted for the whole grace; the node is
called back when a grace ends; a GPU that grows its set of changing devices starts afresh."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from tessera.controller.decide import NodeDecision
from tessera.controller.freshclaims import FreshClaims
from tessera.controller.handover import Handover
from tessera.controller.state import DrainState
from tessera.models.layout import GpuLayout
from tests.controller_fleet import NODE, claim_body

GRACE = 1.0


def drain(uuid: str, devices: set[str], claims: tuple[str, ...] = ()) -> DrainState:
    return DrainState(node=NODE, gpu_uuid=uuid, gpu_index=0, policy="p", target=cast(GpuLayout, None),
                      devices=frozenset(devices), claims=claims, since=0.0)


def deciding(*drains: DrainState) -> NodeDecision:
    return cast(NodeDecision, SimpleNamespace(drains={d.gpu_uuid: d for d in drains}))


class Callbacks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def __call__(self, node: str, delay: float) -> None:
        self.calls.append((node, delay))


async def no_claims() -> list[dict[str, Any]]:
    return []


def handover(come_back: Callbacks) -> Handover:
    return Handover(FreshClaims(no_claims), GRACE, come_back)


def test_a_gpu_is_ready_only_after_the_grace_since_its_taint_was_published() -> None:
    come_back = Callbacks()
    rooms = handover(come_back)
    decision = deciding(drain("GPU-a", {"gpu-0"}))

    assert rooms.handed_over(NODE, decision, now=10.0) == {}
    assert come_back.calls == [(NODE, GRACE)], "called back when the grace ends"
    assert rooms.handed_over(NODE, decision, now=10.5) == {}
    assert come_back.calls[-1] == (NODE, 0.5)
    assert rooms.handed_over(NODE, decision, now=11.0) == {"GPU-a": (frozenset({"gpu-0"}), 11.0)}


def test_more_changing_devices_start_the_grace_again_fewer_do_not() -> None:
    rooms = handover(Callbacks())
    rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0", "gpu-0-mig-1"})), now=0.0)

    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=1.0) == {
        "GPU-a": (frozenset({"gpu-0", "gpu-0-mig-1"}), 1.0)
    }, "a subset was tainted at 0: its grace is over"
    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0", "gpu-0-mig-2"})), now=1.5) == {}
    assert rooms.tracking(NODE) == {"GPU-a": frozenset({"gpu-0", "gpu-0-mig-2"})}
    assert "GPU-a" in rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0-mig-2"})), now=2.5)


def test_a_gpu_whose_devices_a_claim_holds_drains_and_is_not_handed_over() -> None:
    come_back = Callbacks()
    rooms = handover(come_back)
    held = deciding(drain("GPU-a", {"gpu-0"}, claims=("default/c",)))

    assert rooms.handed_over(NODE, held, now=0.0) == {}
    assert rooms.handed_over(NODE, held, now=100.0) == {}
    assert come_back.calls == [], "a drain waits on claim events, not on the clock"


def test_a_settled_gpu_is_forgotten_so_its_next_handover_waits_the_whole_grace() -> None:
    rooms = handover(Callbacks())
    rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=0.0)
    rooms.handed_over(NODE, deciding(), now=5.0)  # settled: no drain any more
    assert rooms.tracking(NODE) == {}

    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=6.0) == {}
    rooms.forget(NODE)
    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=7.5) == {}, "forgotten: afresh"


async def test_the_fresh_read_is_the_shared_one_no_older_than_asked() -> None:
    reads: list[int] = []

    async def claims() -> list[dict[str, Any]]:
        reads.append(1)
        return [claim_body("held", ["gpu-0"]), claim_body("pending")]

    rooms = Handover(FreshClaims(claims), GRACE, Callbacks())
    holds = await rooms.claims_since(0.0)
    assert [h.key for h in holds] == ["default/held"]
    assert await rooms.claims_since(0.0) is holds, "a read after the moment asked serves again"
    assert len(reads) == 1
