"""Fresh claims: every ResourceClaim's hold read directly from the API, no older than a moment
the caller names — what the handover checks a tainted GPU against, since the watch may lag.

Many nodes waiting at once share one read: a caller gets the result of a list started at or
after its moment, joining one in flight when that one qualifies. A caller that must not wait
(a worker of the operator's queue: a list of every claim of a large cluster takes a while, and
a worker waiting for it is a worker doing nothing) takes ``ready`` if it has an answer, and else
asks ``prefetch`` to call it back once one is read. The operator's read leaves out the agents'
fence claims (``tessera.kube.claims.NOT_FENCE_CLAIMS``): they request no device (the admission
policy holds any claim with their label to that), and at one a node they were most of each read
(1,000 of them cost the apiserver 14.5 ms and the operator 17.3 ms of CPU a read, against 2.5 ms
and 0.8 ms without them).
Not for: the watch's view of claims (``state.Fleet``) or deciding what a hold means (``decide``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from tessera.controller.state import Holds, claim_hold

CLAIM_READS = Counter("tessera_operator_claim_reads_total", "Direct reads of every ResourceClaim for a handover")


class FreshClaims:
    """Every ResourceClaim's hold, read directly from the API, no older than a given moment."""

    def __init__(self, read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> None:
        self._read = read
        self._last: tuple[float, Holds] | None = None
        self._inflight: tuple[float, asyncio.Task[Holds]] | None = None
        self.seconds: float | None = None  # how long the last list that answered took

    def ready(self, moment: float) -> Holds | None:
        """The holds from the last list if it started at or after ``moment``; else None."""
        if self._last is not None and self._last[0] >= moment:
            return self._last[1]
        return None

    def prefetch(self, moment: float, then: Callable[[], None], retry_after: float = 1.0) -> None:
        """Read (or join the reading of) a list started at or after ``moment`` in the background,
        and call ``then`` once it is read; after a failed list, ``retry_after`` seconds later."""
        task = asyncio.ensure_future(self.since(moment))

        def done(finished: asyncio.Future[Holds]) -> None:
            if finished.cancelled():
                return
            if finished.exception() is not None:
                asyncio.get_running_loop().call_later(retry_after, then)
            else:
                then()

        task.add_done_callback(done)

    async def since(self, moment: float) -> Holds:
        while True:
            if self._last is not None and self._last[0] >= moment:
                return self._last[1]
            if self._inflight is not None:
                started, task = self._inflight
                holds = await asyncio.shield(task)
                if started >= moment:
                    return holds
                continue
            started = time.monotonic()
            task = asyncio.create_task(self._list(started))
            self._inflight = (started, task)

    async def _list(self, started: float) -> Holds:
        try:
            CLAIM_READS.inc()
            holds = Holds(h for body in await self._read() if (h := claim_hold(body)) is not None)
            self._last = (started, holds)
            self.seconds = time.monotonic() - started
            return holds
        finally:
            self._inflight = None
