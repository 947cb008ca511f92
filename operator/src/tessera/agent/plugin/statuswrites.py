"""Claims' device status, written after the kubelet has its answer and retried until it lands.

A prepare's ``status.devices`` entries (and an unprepare's clearing of them) tell people what
a claim got; nothing in the kubelet's path depends on them, so the kubelet plugin does not
make the kubelet wait for an API round trip to write them. ``submit`` records what a claim's
status should say now and returns at once; one writer task per claim writes the latest wish,
again and again after a backoff (``tessera.kube.http.retry_delay``) while the API fails, until
it lands — and if a newer wish came meanwhile (an unprepare's clear behind a prepare's
entries), writes that one next, so an older status never lands after a newer one. A claim
that is gone needs no status (the writer says so by returning); a request the API refuses as
invalid or forbidden is not tried again (the same request cannot succeed), and is logged.
Not for: what the entries say (``access.device_status_entries``) or the API call itself
(``claims.KubeClaimStatusWriter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from tessera.agent.plugin.claims import ClaimRef, ClaimStatusWriter
from tessera.agent.plugin.steps import PluginMetrics
from tessera.kube.http import ApiError, retry_delay
from tessera.tasks import cancel

log = structlog.get_logger("tessera.agent.plugin")

HOPELESS = frozenset({400, 403, 422})  # the same request cannot succeed: not tried again


@dataclass(frozen=True, slots=True)
class _Wish:
    ref: ClaimRef
    entries: tuple[dict[str, Any], ...]
    number: int  # goes up with each submit
    submitted: float  # monotonic


class ClaimStatusWrites:
    """Per claim, the status it should have, and the task that writes it."""

    def __init__(self, writer: ClaimStatusWriter, metrics: PluginMetrics,
                 delay: Callable[[int], float] = retry_delay) -> None:
        self._writer = writer
        self._metrics = metrics
        self._delay = delay
        self._wishes: dict[str, _Wish] = {}  # claim UID -> the latest wish not yet written
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._numbers = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def submit(self, ref: ClaimRef, entries: Sequence[dict[str, Any]]) -> None:
        """The claim's status should now say ``entries`` (empty: clear ours); returns at once."""
        self._numbers += 1
        self._wishes[ref.uid] = _Wish(ref, tuple(entries), self._numbers, time.monotonic())
        if ref.uid not in self._tasks:
            self._idle.clear()
            self._tasks[ref.uid] = asyncio.create_task(self._write(ref.uid), name=f"claim-status-{ref.uid}")

    @property
    def pending(self) -> int:
        """Claims whose status is not written yet."""
        return len(self._wishes)

    async def flush(self) -> None:
        """Until every wish so far has landed (or was given up)."""
        await self._idle.wait()

    async def close(self, grace: float) -> None:
        """Give pending writes ``grace`` seconds to land, then stop trying."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), grace)
        await cancel(*self._tasks.values())
        if self._wishes:
            log.warning("claim device status not written before stopping", claims=sorted(self._wishes))

    async def _write(self, uid: str) -> None:
        attempt = 0
        try:
            while (wish := self._wishes.get(uid)) is not None:
                try:
                    await self._writer.write_device_status(wish.ref, list(wish.entries))
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # any API failure: tried again, unless it cannot succeed
                    if isinstance(error, ApiError) and error.status in HOPELESS:
                        self._metrics.status_writes.labels("refused").inc()
                        log.warning("claim device status refused by the API; not tried again", claim=str(wish.ref),
                                    error=str(error)[:300])
                        self._done(uid, wish)
                        continue
                    self._metrics.status_writes.labels("retried").inc()
                    delay = self._delay(attempt)
                    attempt += 1
                    log.warning("claim device status not written; trying again", claim=str(wish.ref),
                                error=str(error)[:300], retry_in=delay)
                    await asyncio.sleep(delay)
                    continue
                attempt = 0
                self._metrics.status_writes.labels("ok").inc()
                self._metrics.steps.labels("status", "clear" if not wish.entries else "write").observe(
                    time.monotonic() - wish.submitted
                )
                self._done(uid, wish)
        finally:
            self._tasks.pop(uid, None)
            if not self._tasks:
                self._idle.set()

    def _done(self, uid: str, wish: _Wish) -> None:
        """Forget ``wish`` unless a newer one came while it was written."""
        if self._wishes.get(uid) is wish:
            del self._wishes[uid]
