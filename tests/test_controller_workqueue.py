"""The operator's work queue (tessera.controller.workqueue): never two reconciles of one node at
once, an event during a reconcile brings the node back once, failures come back with backoff,
and the fleet counts as swept only once every node known at start has been reconciled."""

from __future__ import annotations

import asyncio
import random

import pytest

from tessera.controller.workqueue import WorkQueue, failure_backoff
from tessera.kube.http import RETRY_BACKOFF, ApiError
from tests.conditions import until


class Recorder:
    """A reconcile that records overlaps and can be held open or made to fail."""

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)
        self.calls: list[str] = []
        self.running: set[str] = set()
        self.overlaps: list[str] = []
        self.fail: dict[str, Exception] = {}
        self.done = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def __call__(self, node: str) -> None:
        if node in self.running:
            self.overlaps.append(node)
        self.running.add(node)
        self.calls.append(node)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.random.uniform(0, 0.003))
            if node in self.fail:
                raise self.fail.pop(node)
        finally:
            self.running.discard(node)
            self.done.set()


@pytest.mark.parametrize("seed", range(5))
async def test_many_events_at_random_times_never_reconcile_one_node_twice_at_once(seed: int) -> None:
    reconcile = Recorder(seed)
    queue = WorkQueue(reconcile, workers=4)
    queue.start()
    rng = random.Random(seed)
    nodes = [f"node-{i}" for i in range(6)]
    try:
        for _ in range(300):
            queue.enqueue(rng.choice(nodes))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.002))
        await until(lambda: not reconcile.running and queue.idle, "the queue to go idle")
    finally:
        await queue.stop()
    assert reconcile.overlaps == []
    assert set(reconcile.calls) <= set(nodes)
    assert len(reconcile.calls) < 300, "a node already waiting is not queued twice"


async def test_a_node_enqueued_during_its_reconcile_runs_once_more_afterwards_not_twice() -> None:
    reconcile = Recorder()
    reconcile.gate = asyncio.Event()
    queue = WorkQueue(reconcile, workers=2)
    queue.start()
    try:
        queue.enqueue("a")
        await until(lambda: "a" in reconcile.running, "a to start")
        queue.enqueue("a")
        queue.enqueue("a")
        reconcile.gate.set()
        await until(lambda: len(reconcile.calls) == 2 and not reconcile.running, "two runs")
        await asyncio.sleep(0.02)  # nothing more is due: give a wrong third run the chance to show
    finally:
        await queue.stop()
    assert reconcile.calls == ["a", "a"]


async def test_a_failed_reconcile_is_tried_again_after_a_backoff_and_a_success_resets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reconcile = Recorder()
    reconcile.fail["a"] = ApiError(503, "unavailable", "")
    queue = WorkQueue(reconcile, workers=1)
    delays: list[float] = []
    later = queue.later

    def record_and_come_back_now(node: str, delay: float) -> None:
        delays.append(delay)
        later(node, 0.0)

    monkeypatch.setattr(queue, "later", record_and_come_back_now)
    queue.start()
    try:
        queue.enqueue("a")
        await until(lambda: len(reconcile.calls) == 2 and not reconcile.running, "two runs")
        reconcile.fail["a"] = RuntimeError("a bug")
        queue.enqueue("a")
        await until(lambda: len(reconcile.calls) == 4 and not reconcile.running, "four runs")
    finally:
        await queue.stop()
    assert delays == [failure_backoff(1), failure_backoff(1)], "the success between reset the count"


def test_backoff_is_tesseras_one_retry_schedule() -> None:
    assert [failure_backoff(n) for n in range(1, 5)] == list(RETRY_BACKOFF) == [1.0, 2.0, 5.0, 10.0]
    assert failure_backoff(30) == RETRY_BACKOFF[-1]


async def test_later_keeps_the_earliest_of_several_requests() -> None:
    reconcile = Recorder()
    queue = WorkQueue(reconcile, workers=1)
    queue.start()
    try:
        queue.later("a", 0.01)
        queue.later("a", 30.0)  # later than the one pending: ignored
        await until(lambda: reconcile.calls == ["a"], "a to come back")
        queue.later("b", 30.0)
        queue.later("b", 0.01)  # sooner: replaces it
        await until(lambda: reconcile.calls == ["a", "b"], "b to come back")
    finally:
        await queue.stop()


async def test_the_fleet_is_swept_once_every_node_known_at_start_was_reconciled_even_if_it_failed() -> None:
    reconcile = Recorder()
    reconcile.gate = asyncio.Event()
    reconcile.fail["b"] = RuntimeError("boom")
    queue = WorkQueue(reconcile, workers=2)
    queue.sweep(["a", "b"])
    queue.enqueue("a", "b")
    queue.start()
    try:
        await until(lambda: reconcile.running == {"a", "b"}, "both to start")
        assert not queue.swept.is_set()
        reconcile.gate.set()
        await asyncio.wait_for(queue.swept.wait(), 5)
    finally:
        await queue.stop()


def test_an_empty_fleet_is_swept_at_once() -> None:
    queue = WorkQueue(Recorder(), workers=1)
    queue.sweep([])
    assert queue.swept.is_set()


async def test_a_gated_queue_reconciles_only_while_leading_and_a_refused_write_is_no_failure() -> None:
    from tessera.kube.fence import NotLeading

    leading = asyncio.Event()
    calls: list[str] = []
    refuse = True

    async def reconcile(node: str) -> None:
        calls.append(node)
        if refuse:
            raise NotLeading("fence shut")

    queue = WorkQueue(reconcile, workers=2, gate=leading)
    queue.start()
    try:
        queue.enqueue("node-a")
        await asyncio.sleep(0.05)
        assert calls == [], "a standby takes no work"
        leading.set()
        await until(lambda: calls == ["node-a"], "the leader's first try")
        leading.clear()  # the elector noticed the lost lease
        assert queue._failures == {}, "a refused write is not a failure"
        await asyncio.sleep(1.2)  # the node came back after NOT_LEADING_RETRY and waits for the next term
        assert calls == ["node-a"]
        refuse = False
        leading.set()
        await until(lambda: calls == ["node-a", "node-a"], "the next term's try")
    finally:
        await queue.stop()


async def test_an_event_goes_before_a_sweep_of_every_node_and_a_swept_node_it_names_moves_up() -> None:
    """A rollout is a pipeline: a node an event or a timer names (its grace over, its agent's
    report) is reconciled before the rest of a sweep; a node of the sweep that an event names
    moves up, and is reconciled once."""
    reconcile = Recorder()
    reconcile.gate = asyncio.Event()
    queue = WorkQueue(reconcile, workers=1)
    queue.start()
    try:
        queue.enqueue("a", "b", "c", "d", bulk=True)
        await until(lambda: reconcile.calls == ["a"], "the first node of the sweep to start")
        queue.enqueue("event")
        queue.enqueue("c")  # in the sweep, and now asked for
        queue.enqueue("b", bulk=True)  # asked for by another sweep: stays where it is
        reconcile.gate.set()
        await until(lambda: not reconcile.running and queue.idle, "the queue to go idle")
    finally:
        await queue.stop()
    assert reconcile.calls == ["a", "event", "c", "b", "d"]


@pytest.mark.parametrize("seed", range(5))
async def test_sweeps_and_events_mixed_at_random_reconcile_every_node_asked_for_and_never_two_at_once(
        seed: int) -> None:
    reconcile = Recorder(seed)
    queue = WorkQueue(reconcile, workers=3)
    queue.start()
    rng = random.Random(seed)
    nodes = [f"node-{i}" for i in range(8)]
    asked_after: dict[str, int] = {}  # node -> how many reconciles had started when last asked for
    try:
        for _ in range(300):
            if rng.random() < 0.05:
                queue.enqueue(*nodes, bulk=True)
                asked_after.update(dict.fromkeys(nodes, len(reconcile.calls)))
            else:
                node = rng.choice(nodes)
                queue.enqueue(node)
                asked_after[node] = len(reconcile.calls)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.002))
        await until(lambda: not reconcile.running and queue.idle, "the queue to go idle")
    finally:
        await queue.stop()
    assert reconcile.overlaps == []
    for node, calls in asked_after.items():
        assert node in reconcile.calls[calls:], f"seed {seed}: {node} asked for and not reconciled after"



async def test_a_sweep_of_reconciles_that_never_await_still_lets_the_loop_run_between_nodes() -> None:
    """Nothing to write means a reconcile that completes without awaiting anything: the workers
    still yield between nodes, so the loop's other work (a Lease renewal, a watch) goes on."""
    done: list[str] = []
    ticks_at: list[int] = []

    async def reconcile(node: str) -> None:
        done.append(node)

    async def other_work() -> None:
        while True:
            ticks_at.append(len(done))
            await asyncio.sleep(0)

    queue = WorkQueue(reconcile, workers=2)
    ticker = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    try:
        queue.enqueue(*[f"node-{i}" for i in range(200)], bulk=True)
        queue.start()
        await until(lambda: len(done) == 200, "every node reconciled")
    finally:
        ticker.cancel()
        await queue.stop()
    between = [n for n in ticks_at if 0 < n < 200]
    assert len(set(between)) >= 50, "the other task ran between the nodes, not only before and after"
