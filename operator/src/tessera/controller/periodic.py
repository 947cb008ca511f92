"""A coroutine run every few seconds, in a task of its own, until stopped.

One run that raises is logged and the next goes on: a bad pass must not end for good what
the passes do (adaptive layouts, scheduler wakes).
Not for: work queues or watches (``tessera.controller.workqueue``, ``tessera.kube.watch``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from tessera.tasks import cancel

log = structlog.get_logger("tessera.operator")


class Periodic:
    """``run()`` every ``interval()`` seconds (read before each wait) once :meth:`start` is called."""

    def __init__(self, run: Callable[[], Awaitable[Any]], interval: Callable[[], float], name: str) -> None:
        self.run, self.interval, self.name = run, interval, name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval())
            try:
                await self.run()
            except Exception:
                log.exception("a periodic pass failed; trying again next pass", task=self.name)
