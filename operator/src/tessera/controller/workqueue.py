"""The operator's work queue: node names in, a few reconciles at once, never two of the same
node, failures tried again with backoff.

A node enqueued while it is being reconciled is reconciled once more afterwards (the event
may have come after the reconcile read the view); a node already waiting is not queued twice.
``later`` brings a node back after a delay, keeping the earliest of several requests.

Two classes of work: a sweep of every node (``enqueue(..., bulk=True)``: a policy changed, a
term began) waits behind everything else — an event about one node, a node's timer coming due
(a handover's grace over) — which is taken first, in order. So a rollout over many nodes is a
pipeline, as the floor's writes are: a node whose grace has ended gets its new layout (and its
agent starts work) while others are still being tainted, instead of after the last taint of
the fleet; and a node whose agent has reported is published at once. Nothing starves that
has not been asked for again: a node queued in bulk that an event names moves up.
``sweep`` names the nodes known at start; :attr:`swept` is set once each has been reconciled
once, so nothing that summarises the whole fleet runs on half of it.

With a ``gate`` (the Controller's ``leading``), workers take nodes only while it is set, and
a reconcile whose write was refused (``NotLeading``: the lease was lost meanwhile) brings its
node back a second later, without counting a failure (by then the gate is shut, and the node
waits for the next term).

Not for: what a reconcile does (``runtime.Controller.reconcile``) or any API call.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

import structlog
from prometheus_client import Counter, Histogram

from tessera.kube.fence import NotLeading
from tessera.kube.http import ApiError, retry_delay
from tessera.tasks import cancel

log = structlog.get_logger("tessera.operator")

RECONCILES = Counter("tessera_operator_reconciles_total", "Node reconciles", ["result"])
RECONCILE_SECONDS = Histogram("tessera_operator_reconcile_seconds", "Time to reconcile one node")

NOT_LEADING_RETRY = 1.0  # seconds before a node whose write the fence refused is looked at again


def failure_backoff(failures: int) -> float:
    """Seconds before a node that failed ``failures`` times in a row is tried again: Tessera's
    one retry schedule (``tessera.kube.http.retry_delay``)."""
    return retry_delay(failures - 1)


class WorkQueue:
    """Node names waiting for ``reconcile``, run by ``workers`` tasks."""

    def __init__(self, reconcile: Callable[[str], Awaitable[None]], workers: int,
                 gate: asyncio.Event | None = None) -> None:
        self._reconcile = reconcile
        self._gate = gate
        self.workers = workers
        self._first: deque[str] = deque()  # events and timers, in order
        self._bulk: deque[str] = deque()  # sweeps of every node, behind them
        self._waiting = asyncio.Event()  # set while either holds a node
        self._queued: set[str] = set()  # nodes waiting, in one deque or both (then the first entry counts)
        self._moved_up: set[str] = set()  # nodes of _queued with an entry in _first
        self._active: set[str] = set()  # nodes being reconciled now
        self._again: set[str] = set()  # nodes enqueued while being reconciled: once more afterwards
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._unswept: set[str] = set()  # nodes not reconciled since start
        self.swept = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def enqueue(self, *nodes: str, bulk: bool = False) -> None:
        """Reconcile ``nodes``: soon, or with ``bulk`` (a sweep of every node) after all else."""
        for node in nodes:
            if node in self._active:
                self._again.add(node)
            elif node not in self._queued:
                self._queued.add(node)
                if bulk:
                    self._bulk.append(node)
                else:
                    self._first.append(node)
                    self._moved_up.add(node)
                self._waiting.set()
            elif not bulk and node not in self._moved_up:
                self._first.append(node)  # waiting in bulk, and now asked for: it moves up
                self._moved_up.add(node)
                self._waiting.set()

    async def _next(self) -> str:
        """The next node to reconcile: events and timers first, then the bulk."""
        while True:
            while self._first or self._bulk:
                node = self._first.popleft() if self._first else self._bulk.popleft()
                if node in self._queued:  # any entry of a waiting node may take it
                    self._queued.discard(node)
                    self._moved_up.discard(node)
                    return node
                # else an entry left behind by a node that moved up and was taken already
            self._waiting.clear()
            await self._waiting.wait()

    @property
    def idle(self) -> bool:
        """Nothing waiting, running or due again now (timers aside)."""
        return not (self._queued or self._active or self._again)

    def later(self, node: str, delay: float) -> None:
        """Reconcile ``node`` again after ``delay``, unless it is already due back sooner."""
        loop = asyncio.get_running_loop()
        old = self._timers.get(node)
        if old is not None and loop.time() < old.when() <= loop.time() + delay:
            return
        if old is not None:
            old.cancel()
        self._timers[node] = loop.call_later(delay, self.enqueue, node)

    def sweep(self, nodes: Iterable[str]) -> None:
        """The nodes known at start: :attr:`swept` is set once each has been reconciled."""
        self._unswept = set(nodes)
        if self._unswept:
            self.swept.clear()
        else:
            self.swept.set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"tessera-reconcile-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        await cancel(*self._tasks)

    async def _work(self) -> None:
        while True:
            if self._gate is not None:
                await self._gate.wait()
            node = await self._next()
            if self._gate is not None and not self._gate.is_set():  # shut while this worker waited
                self.enqueue(node)  # waits again, in front
                continue
            self._active.add(node)
            started = time.perf_counter()
            try:
                await self._reconcile(node)
            except NotLeading:
                if self._gate is None:
                    self._retry(node, "not leading")
                else:  # the gate shuts within a retry period of the fence; then the next term has it
                    self.later(node, NOT_LEADING_RETRY)
            except ApiError as exc:
                self._retry(node, f"API error {exc.status}: {exc.reason}")
            except Exception as exc:  # a bug must not stop the loop for every other node
                log.exception("reconcile failed", node=node)
                self._retry(node, repr(exc))
            else:
                self._failures.pop(node, None)
                RECONCILES.labels("ok").inc()
            finally:
                RECONCILE_SECONDS.observe(time.perf_counter() - started)
                self._active.discard(node)
                self._unswept.discard(node)
                if not self._unswept:
                    self.swept.set()
                if node in self._again:
                    self._again.discard(node)
                    self.enqueue(node)
            # A reconcile with nothing to write never awaits anything real, and neither does
            # taking the next node from a full queue: without this, a restart's sweep of every
            # node ran as one stretch (6.9 s at 1,000 nodes) and held up the whole loop.
            await asyncio.sleep(0)

    def _retry(self, node: str, why: str) -> None:
        RECONCILES.labels("error").inc()
        count = self._failures[node] = self._failures.get(node, 0) + 1
        delay = failure_backoff(count)
        log.warning("reconcile will be retried", node=node, why=why, retry_in=delay)
        self.later(node, delay)
