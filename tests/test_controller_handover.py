"""The handover's clock (tessera.controller.handover): a GPU is ready for the fresh claims read
only once its changing devices have been published tainted for the whole grace; the node is
called back when a grace ends; a GPU that grows its set of changing devices starts afresh."""

from __future__ import annotations

import asyncio
import math
import time
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


async def test_nodes_handed_over_in_one_wave_share_one_grace_end_and_one_fresh_list() -> None:
    """Taints acknowledged within half a grace end their grace at one wave boundary (never before
    their own due), and the nodes coming back at it share one fresh list started after it."""
    lists: list[float] = []

    async def listing() -> list[dict[str, Any]]:
        lists.append(time.monotonic())
        await asyncio.sleep(0.05)  # the answer takes a moment: the wave's nodes join the list meanwhile
        return [claim_body("held", ["gpu-0"])]

    come_back = Callbacks()
    rooms = Handover(FreshClaims(listing), GRACE, come_back)
    boundary = math.ceil(time.monotonic() / 0.5) * 0.5 + 0.5
    taints = {"node-a": boundary - 1.49, "node-b": boundary - 1.25, "node-c": boundary - 1.0}  # within 0.5 s
    for node, tainted in taints.items():
        assert rooms.handed_over(node, deciding(drain("GPU-a", {"gpu-0"})), now=tainted) == {}
    ends = {node: round(tainted + delay, 6)
            for (node, delay), tainted in zip(come_back.calls, taints.values(), strict=True)}
    assert ends == dict.fromkeys(taints, boundary), "one grace end for the wave, never before a node's own"
    assert rooms.wave_end(boundary + 0.01) == boundary + 0.5, "the next half-grace is the next wave"

    await asyncio.sleep(max(0.0, boundary - time.monotonic()))  # the wave's end comes
    cleared = [rooms.handed_over(node, deciding(drain("GPU-a", {"gpu-0"}))) for node in taints]
    moments = [rooms.read_after(c) for c in cleared]
    await asyncio.gather(*(rooms.claims_since(m) for m in moments))

    assert all(c["GPU-a"][1] <= m for c, m in zip(cleared, moments, strict=True)), "each after its own grace"
    assert len(lists) == 1, "one fresh list for the wave"
    assert lists[0] >= boundary
    assert rooms.read_after({"GPU-a": (frozenset({"gpu-0"}), boundary - 60)}, now=boundary + 5) == boundary + 4, (
        "a later reconcile reads claims again, not a minute-old list")
