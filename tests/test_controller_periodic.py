"""Periodic: runs every interval, a run that raises is logged and the next goes on, stop ends it."""

from __future__ import annotations

import asyncio

from tessera.controller.periodic import Periodic


async def test_a_failed_run_does_not_end_the_passes_and_stop_does() -> None:
    runs: list[int] = []
    five = asyncio.Event()

    async def run() -> None:
        runs.append(len(runs))
        if len(runs) == 5:
            five.set()
        if len(runs) == 2:
            raise RuntimeError("one bad pass")

    passes = Periodic(run, lambda: 0.01, "test-periodic")
    passes.start()
    passes.start()  # a second start changes nothing
    await asyncio.wait_for(five.wait(), timeout=10)
    await passes.stop()
    stopped_at = len(runs)
    await asyncio.sleep(0.05)
    assert len(runs) == stopped_at, "no run after stop"
    assert runs[:5] == [0, 1, 2, 3, 4]
    await passes.stop()  # a second stop changes nothing
