"""Waiting, in unit tests, for a condition that the code under test does not signal (a queue
going idle, a count reaching a number): checked each millisecond, with a deadline. Not a test
module itself; not for anything that offers an Event to await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():  # noqa: ASYNC110 - the state polled has no Event to await
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None
