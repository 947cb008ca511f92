"""Stopping asyncio tasks: cancel them, then wait until each has finished unwinding.

Every room that runs a task of its own (watches, periodic passes, the work queue, the status
writer, the stall watch, the plugin's status writes) stops it this way.
Not for: tasks whose other failures matter to the caller (await those yourself).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task (None: nothing to stop), then wait for each to end; the cancellation
    is not raised here."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError):
            await task
