"""Fresh claims: every ResourceClaim's hold read directly from the API, no older than a moment
the caller names — what the handover checks a tainted GPU against, since the watch may lag.

Many nodes waiting at once share one read: a caller gets the result of a list started at or
after its moment, joining one in flight when that one qualifies.
Not for: the watch's view of claims (``state.Fleet``) or deciding what a hold means (``decide``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from tessera.controller.state import ClaimHold, claim_hold

CLAIM_READS = Counter("tessera_operator_claim_reads_total", "Direct reads of every ResourceClaim for a handover")


class FreshClaims:
    """Every ResourceClaim's hold, read directly from the API, no older than a given moment."""

    def __init__(self, read: Callable[[], Awaitable[list[dict[str, Any]]]]) -> None:
        self._read = read
        self._last: tuple[float, list[ClaimHold]] | None = None
        self._inflight: tuple[float, asyncio.Task[list[ClaimHold]]] | None = None

    async def since(self, moment: float) -> list[ClaimHold]:
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

    async def _list(self, started: float) -> list[ClaimHold]:
        try:
            CLAIM_READS.inc()
            holds = [h for body in await self._read() if (h := claim_hold(body)) is not None]
            self._last = (started, holds)
            return holds
        finally:
            self._inflight = None
