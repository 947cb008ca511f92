"""The operator's event-loop watchdog: how long the loop went without running anything else, and
where it was meanwhile.

Everything of the operator shares one asyncio loop, the Lease's renewals among it: a stretch of
work that never awaits for longer than the renew deadline (10 s) costs the leadership, since
the renewal cannot even be sent. A coroutine on the loop beats every ``tick_s``; a thread
looks at the beat. When the beat is ``threshold_s`` late, the thread logs the loop thread's
Python stack once (``event loop stalled``: what is running instead); when the loop beats again,
the stall's length goes to ``tessera_operator_event_loop_stall_seconds`` and the log. The thread
only reads a float and, during a stall, the loop thread's frames: it costs the loop nothing.
Not for: the agent (its loop runs only small per-node work), or timing individual handlers.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback

import structlog
from prometheus_client import Histogram

from tessera.tasks import cancel

log = structlog.get_logger("tessera.operator")

STALL_SECONDS = Histogram(
    "tessera_operator_event_loop_stall_seconds",
    "How long the operator's event loop ran one stretch without yielding, when over the watch's threshold",
    buckets=(0.5, 1, 2, 5, 10, 20, 60),
)
STACK_LINES = 30  # of the innermost frames: enough to name the loop and the work


class StallWatch:
    """``start()`` on the loop to watch, ``stop()`` when done. ``stalls``: the lengths seen."""

    def __init__(self, threshold_s: float = 1.0, tick_s: float = 0.1) -> None:
        self.threshold_s = threshold_s
        self.tick_s = tick_s
        self.stalls: list[float] = []
        self._beat = time.monotonic()
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._beats(), name="tessera-stall-watch")
        self._thread = threading.Thread(target=self._watch, name="tessera-stall-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopped.set()
        await cancel(self._task)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def _beats(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            stalled = now - self._beat - self.tick_s
            self._beat = now
            if stalled >= self.threshold_s:
                self.stalls.append(stalled)
                STALL_SECONDS.observe(stalled)
                log.warning("event loop stall ended", seconds=round(stalled, 2))

    def _watch(self) -> None:
        reported = 0.0  # the beat whose stall was reported
        while not self._stopped.wait(self.tick_s):
            beat = self._beat
            if beat != reported and time.monotonic() - beat >= self.threshold_s:
                reported = beat
                frame = sys._current_frames().get(self._loop_thread)
                stack = traceback.format_stack(frame)[-STACK_LINES:] if frame is not None else []
                log.warning("event loop stalled", seconds=round(time.monotonic() - beat, 2),
                            stack="".join(stack))
