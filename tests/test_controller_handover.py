"""The handover's clock (tessera.controller.handover): a GPU is ready for the fresh claims read
only once its changing devices have been published tainted for the whole grace, and after an
apiserver outage only once kube-scheduler's informers can be back; nodes whose grace ends
together come back together, once one claim list started at that end is read; a GPU that
grows its set of changing devices starts afresh."""

from __future__ import annotations

import asyncio
import math
import random
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tessera.controller.decide import NodeDecision
from tessera.controller.freshclaims import FreshClaims
from tessera.controller.handover import Handover, watchers_back_by
from tessera.controller.state import DrainState
from tessera.kube.outages import Outages
from tessera.localcluster.cluster import wait_for
from tessera.models.layout import GpuLayout
from tests.controller_fleet import NODE, claim_body
from tests.fakeclock import FakeClock

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


class Enqueued:
    def __init__(self) -> None:
        self.nodes: list[str] = []

    def __call__(self, *nodes: str) -> None:
        self.nodes.extend(nodes)


async def no_claims() -> list[dict[str, Any]]:
    return []


def handover(come_back: Callbacks, outages: Outages | None = None) -> Handover:
    return Handover(FreshClaims(no_claims), GRACE, come_back, Enqueued(), outages)


def spells(clock: FakeClock, *periods: tuple[float, float]) -> Outages:
    """Outages seen by a client that had been answered, and whose calls then failed over each
    (began, ended) period."""
    outages = Outages(clock)
    outages.answered()  # the process was up and calling before the first spell
    for began, ended in periods:
        clock.now = began
        outages.failed()
        clock.now = (began + ended) / 2
        outages.answer(503)  # an apiserver starting: still no answer
        clock.now = ended
        outages.answer(404)  # an answer, if not a happy one
    return outages


def test_after_an_outage_the_wait_is_client_gos_longest_next_retry_and_its_catch_up() -> None:
    clock = FakeClock(0.0)
    assert watchers_back_by(Outages(clock)) == -math.inf, "no outage, no wait"
    # 3 s without an answer: an informer's current wait is at most 3.8 s, stretched to 7.6 s by jitter.
    assert watchers_back_by(spells(clock, (100.0, 103.0))) == 103.0 + 7.6 + 5.0
    # Spells less than 2 min apart add up (client-go's backoff is not reset in between) ...
    assert watchers_back_by(spells(clock, (100.0, 103.0), (200.0, 204.0))) == 204.0 + 2 * 7.8 + 5.0
    # ... a spell after 2 min without one starts afresh, and no wait is longer than 60 s.
    assert watchers_back_by(spells(clock, (100.0, 103.0), (224.0, 225.0))) == 225.0 + 3.6 + 5.0
    assert watchers_back_by(spells(clock, (0.0, 600.0))) == 600.0 + 60.0 + 5.0

    under_way = spells(clock, (0.0, 3.0))
    clock.now = 50.0
    under_way.failed()
    assert watchers_back_by(under_way) == math.inf, "while the apiserver does not answer, nothing is handed over"


def test_an_outage_the_process_started_into_is_taken_as_long_whatever_it_saw_of_it() -> None:
    """An operator restarted during an outage sees only its tail: the scheduler's informers may
    have been failing for minutes and wait up to 60 s for their next try."""
    clock = FakeClock(0.0)
    started_into = Outages(clock)
    clock.now = 100.0
    started_into.failed()  # the first call of this process finds no apiserver
    clock.now = 102.0
    started_into.answer(200)
    assert started_into.spells[-1].blind
    assert watchers_back_by(started_into) == 102.0 + 60.0 + 5.0, "not 102 + 2 * 2.8 + 5"

    starting = Outages(clock)  # the apiserver was still starting when this process first called
    clock.now = 200.0
    starting.answer(503)
    assert starting.since == 200.0, "a 5xx before any answer begins a blind spell"
    clock.now = 201.0
    starting.answer(429)
    clock.now = 203.0
    starting.answer(404)
    assert list(starting.spells) == [(200.0, 203.0, True)]
    assert watchers_back_by(starting) == 203.0 + 65.0
    clock.now = 204.0
    starting.answer(503)
    assert starting.since is None, "once answered, a 5xx neither begins nor ends a spell"

    seen = spells(clock, (300.0, 302.0))  # the same tail, for a process that was up before it
    assert not seen.spells[-1].blind
    assert watchers_back_by(seen) == 302.0 + 2 * 2.8 + 5.0


def test_the_hold_is_unknown_until_the_start_has_read_what_the_process_did_not_see() -> None:
    """The gauge an admin (and test_watch_recovery) reads: +Inf until the operator's start has
    added the apiserver starts it learned of, then the wait they make; never 0 in between."""
    clock, started = FakeClock(0.0), [False]
    outages = Outages(clock)
    rooms = Handover(FreshClaims(no_claims), GRACE, Callbacks(), Enqueued(), outages, known=lambda: started[0])
    assert rooms.held_s(now=10.0) == math.inf, "before the start has read the Leases"
    outages.learned(12.0)  # an apiserver started 3 s before (its Lease written as it began: + 5 s)
    started[0] = True
    assert rooms.held_s(now=10.0) == 12.0 + 65.0 - 10.0
    assert rooms.held_s(now=100.0) == 0.0


async def test_a_taint_published_just_after_an_outage_waits_for_the_schedulers_informers() -> None:
    """The fault campaign's case: the apiserver was killed, the operator tainted a GPU's devices
    as it came back, and a 1 s grace later recut the GPU the scheduler went on to allocate from
    the slices it had before the outage."""
    clock, come_back = FakeClock(0.0), Callbacks()
    outages = spells(clock, (10.0, 13.0))  # back by 13 + 7.6 + 5 = 25.6
    rooms = handover(come_back, outages)
    decision = deciding(drain("GPU-a", {"gpu-0"}))

    assert rooms.handed_over(NODE, decision, now=13.1) == {}
    assert rooms.handed_over(NODE, decision, now=20.0) == {}, "the grace is over, the outage's wait is not"
    assert rooms.waves() == {26.0: {NODE}}, "back at the wave boundary after 25.6"
    assert come_back.calls == []
    assert rooms.handed_over(NODE, decision, now=25.6) == {"GPU-a": (frozenset({"gpu-0"}), 25.6)}

    clock.now = 30.0
    outages.failed()  # the apiserver goes again: a GPU cleared before waits once more
    assert rooms.handed_over(NODE, decision, now=30.5) == {}
    assert come_back.calls[-1] == (NODE, 1.0), "looked at again while the apiserver is away"
    clock.now = 31.0
    outages.answered()
    assert rooms.handed_over(NODE, decision, now=31.0) == {}, "the second spell's wait"
    rooms.stop()


async def test_a_gpu_is_ready_only_after_the_grace_since_its_taint_was_published() -> None:
    come_back = Callbacks()
    rooms = handover(come_back)
    decision = deciding(drain("GPU-a", {"gpu-0"}))

    assert rooms.handed_over(NODE, decision, now=10.0) == {}
    assert rooms.waves() == {10.0 + GRACE: {NODE}}, "back when the grace ends"
    assert rooms.handed_over(NODE, decision, now=10.5) == {}
    assert rooms.waves() == {10.0 + GRACE: {NODE}}, "the same wave: no second timer"
    assert rooms.handed_over(NODE, decision, now=11.0) == {"GPU-a": (frozenset({"gpu-0"}), 11.0)}
    assert come_back.calls == []
    rooms.stop()
    assert rooms.waves() == {}


async def test_more_changing_devices_start_the_grace_again_fewer_do_not() -> None:
    rooms = handover(Callbacks())
    rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0", "gpu-0-mig-1"})), now=0.0)

    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=1.0) == {
        "GPU-a": (frozenset({"gpu-0", "gpu-0-mig-1"}), 1.0)
    }, "a subset was tainted at 0: its grace is over"
    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0", "gpu-0-mig-2"})), now=1.5) == {}
    assert rooms.tracking(NODE) == {"GPU-a": frozenset({"gpu-0", "gpu-0-mig-2"})}
    assert "GPU-a" in rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0-mig-2"})), now=2.5)
    rooms.stop()


async def test_a_gpu_whose_devices_a_claim_holds_drains_and_is_not_handed_over() -> None:
    come_back = Callbacks()
    rooms = handover(come_back)
    held = deciding(drain("GPU-a", {"gpu-0"}, claims=("default/c",)))

    assert rooms.handed_over(NODE, held, now=0.0) == {}
    assert rooms.handed_over(NODE, held, now=100.0) == {}
    assert come_back.calls == [], "a drain waits on claim events, not on the clock"
    assert rooms.waves() == {}


async def test_a_settled_gpu_is_forgotten_so_its_next_handover_waits_the_whole_grace() -> None:
    rooms = handover(Callbacks())
    rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=0.0)
    rooms.handed_over(NODE, deciding(), now=5.0)  # settled: no drain any more
    assert rooms.tracking(NODE) == {}

    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=6.0) == {}
    rooms.forget(NODE)
    assert rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=7.5) == {}, "forgotten: afresh"
    rooms.stop()


async def test_nodes_handed_over_in_one_wave_share_one_grace_end_and_one_fresh_list() -> None:
    """Taints acknowledged within half a grace end their grace at one wave boundary (never before
    their own due): one timer there starts one claim list, nobody comes back while it is read,
    the wave's nodes come back once it is, and each finds it ready for its handover. A later
    wave gets its own list, started after its end."""
    lists: list[float] = []
    answer = asyncio.Event()

    async def listing() -> list[dict[str, Any]]:
        lists.append(time.monotonic())
        await answer.wait()
        return [claim_body("held", ["gpu-0"])]

    async def until(done: Any) -> None:
        await wait_for(done, timeout=5, interval=0.005)

    come_back, enqueued = Callbacks(), Enqueued()
    rooms = Handover(FreshClaims(listing), GRACE, come_back, enqueued)
    boundary = math.ceil(time.monotonic() / 0.5) * 0.5 + 0.5
    taints = {"node-b": boundary - 1.49, "node-a": boundary - 1.25, "node-c": boundary - 1.0}  # within 0.5 s
    for node, tainted in taints.items():
        assert rooms.handed_over(node, deciding(drain("GPU-a", {"gpu-0"})), now=tainted) == {}
    rooms.handed_over("node-d", deciding(drain("GPU-a", {"gpu-0"})), now=boundary - 0.6)
    assert rooms.waves() == {boundary: set(taints), boundary + 0.5: {"node-d"}}, (
        "one grace end for the wave, never before a node's own; the next half-grace is the next wave")

    await until(lambda: lists)
    assert lists[0] >= boundary, "listed at the wave's end, not before"
    await asyncio.sleep(0.02)
    assert enqueued.nodes == [], "while the list is read, nobody comes back"
    answer.set()
    await until(lambda: enqueued.nodes)
    assert enqueued.nodes == ["node-a", "node-b", "node-c"], "the wave comes back once its list is read"
    for node in taints:
        cleared = rooms.handed_over(node, deciding(drain("GPU-a", {"gpu-0"})))
        assert all(due <= lists[0] for _, due in cleared.values()), "the list started after each node's grace"
        holds = rooms.fresh_for(node, cleared)
        assert holds is not None, "the wave's list is the one the node asked for"
        assert [h.key for h in holds] == ["default/held"]
    assert len(lists) == 1, "one fresh list for the wave"

    await until(lambda: "node-d" in enqueued.nodes)
    assert len(lists) == 2, "the later wave lists again"
    assert lists[1] >= boundary + 0.5, "after its own end"
    assert rooms.waves() == {}
    assert come_back.calls == []


async def test_a_node_that_asks_for_a_list_comes_back_once_it_is_read_and_a_later_reconcile_reads_again() -> None:
    """A node cleared outside a wave (its grace ended while it was away) starts a list and comes
    back once it is read; the list it came back for serves it even if the reconcile comes a
    while later, but a reconcile more than a grace after an answer it did not ask for reads anew."""
    lists: list[float] = []

    async def listing() -> list[dict[str, Any]]:
        lists.append(time.monotonic())
        return [claim_body("held", ["gpu-0"]), claim_body("pending")]

    enqueued, grace = Enqueued(), 0.1
    rooms = Handover(FreshClaims(listing), grace, Callbacks(), enqueued)
    cleared = {"GPU-a": (frozenset({"gpu-0"}), time.monotonic() - 60.0)}
    assert rooms.fresh_for(NODE, cleared) is None, "nothing read yet: a list starts"
    await wait_for(lambda: enqueued.nodes, timeout=5, interval=0.005)
    assert enqueued.nodes == [NODE]
    assert len(lists) == 1

    await asyncio.sleep(2 * grace)  # the reconcile comes more than a grace after the list started
    holds = rooms.fresh_for(NODE, cleared)
    assert holds is not None, "the list it came back for"
    assert [h.key for h in holds] == ["default/held"]
    assert rooms.fresh_for(NODE, cleared) is None, "not asked for, and more than a grace old: read anew"
    await wait_for(lambda: len(enqueued.nodes) == 2, timeout=5, interval=0.005)
    assert len(lists) == 2


async def test_the_wave_step_follows_what_a_fresh_list_costs() -> None:
    """Half a grace before any list and while lists are slow (a large cluster's claims: at most
    one per half-grace); a tenth of a grace once lists are cheap, so a node's grace ends at most
    that late; four times the list's time in between. What a list took is measured."""
    async def listing() -> list[dict[str, Any]]:
        await asyncio.sleep(0.05)
        return []

    fresh = FreshClaims(listing)
    rooms = Handover(fresh, GRACE, Callbacks(), Enqueued())
    assert rooms.wave_step() == GRACE / 2, "no list yet"
    await fresh.since(time.monotonic())
    assert fresh.seconds is not None
    assert fresh.seconds >= 0.05, "the list's time, measured"
    for took, step in ((0.001, GRACE / 10), (0.05, 0.2), (0.2, GRACE / 2), (3.0, GRACE / 2)):
        fresh.seconds = took
        assert rooms.wave_step() == pytest.approx(step), f"a list of {took} s"
    rooms.stop()


def test_a_wave_never_ends_before_the_grace_it_rounds_up() -> None:
    """Whatever the step (lists of any cost) and the due, a wave ends at or after the due, on the
    step's grid, less than a step after it (seeded: a failure replays)."""
    rng = random.Random(22)
    fresh = FreshClaims(no_claims)
    rooms = Handover(fresh, GRACE, Callbacks(), Enqueued())
    for _ in range(20_000):
        fresh.seconds = rng.choice([None, rng.uniform(0.0, 0.3), rng.choice([0.025, 0.0333, 0.07, 0.1])])
        due = rng.choice([rng.uniform(0.0, 1e6), round(rng.uniform(0.0, 1e4), 1), rng.randrange(10**6) / 10])
        step = rooms.wave_step()
        end = rooms.wave_end(due)
        assert end >= due, (due, step, end)
        assert end - due < step + 1e-9, (due, step, end)
        assert end == due or abs(end / step - round(end / step)) < 1e-6, (due, step, end)


async def test_a_waves_list_serves_its_nodes_after_the_step_has_changed() -> None:
    """A node joins its wave on the grid of half a grace; the wave's list is read at the wave's
    end, and then lists turn out cheap (a step whose grid has no point there): the node still
    takes the list its wave read, and asks for no other."""
    lists: list[float] = []

    async def listing() -> list[dict[str, Any]]:
        lists.append(time.monotonic())
        return []

    fresh, enqueued = FreshClaims(listing), Enqueued()
    rooms = Handover(fresh, GRACE, Callbacks(), enqueued)
    boundary = math.ceil(time.monotonic() / 0.5) * 0.5 + 0.5
    rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})), now=boundary - GRACE)  # due at the boundary
    assert rooms.waves() == {boundary: {NODE}}
    await wait_for(lambda: enqueued.nodes, timeout=5, interval=0.005)
    assert len(lists) == 1
    assert lists[0] >= boundary
    # Lists turn cheap: a step (four times their time) on whose grid the wave's end would come
    # after the list it read, however late the wave's timer fired on a busy machine.
    steps = [s / 1000 for s in range(101, 500) if math.ceil(boundary / (s / 1000)) * (s / 1000) > lists[0] + 0.005]
    assert steps, f"no step puts the wave's end after its list (the timer fired {lists[0] - boundary:.3f} s late)"
    fresh.seconds = steps[0] / 4
    cleared = rooms.handed_over(NODE, deciding(drain("GPU-a", {"gpu-0"})))
    assert rooms.fresh_for(NODE, cleared) is not None, "the wave's own list"
    await asyncio.sleep(0.05)
    assert len(lists) == 1, "and no other list"
    rooms.stop()
