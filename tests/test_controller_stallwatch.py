"""The event-loop watchdog on a real loop and thread: a stretch of work that does not yield is
seen while it runs (with the stack that shows what runs) and measured when it ends; a loop that
keeps yielding reports nothing."""

from __future__ import annotations

import asyncio
import time

from structlog.testing import capture_logs

from tessera.controller.stallwatch import StallWatch


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what CPU-bound work does to the loop


async def test_a_stall_is_logged_with_its_stack_while_it_lasts_and_measured_when_it_ends() -> None:
    watch = StallWatch(threshold_s=0.2, tick_s=0.02)
    with capture_logs() as logs:
        watch.start()
        await asyncio.sleep(0.1)
        hold_the_loop(0.6)
        await asyncio.sleep(0.1)
        await watch.stop()
    assert len(watch.stalls) == 1
    assert 0.5 <= watch.stalls[0] <= 1.0
    stalled = [entry for entry in logs if entry["event"] == "event loop stalled"]
    assert len(stalled) == 1, logs  # once per stall, not once per tick
    assert "hold_the_loop" in stalled[0]["stack"]
    assert [entry["seconds"] for entry in logs if entry["event"] == "event loop stall ended"] == [
        round(watch.stalls[0], 2)]


async def test_a_loop_that_keeps_yielding_reports_no_stall() -> None:
    watch = StallWatch(threshold_s=0.2, tick_s=0.02)
    with capture_logs() as logs:
        watch.start()
        for _ in range(40):
            hold_the_loop(0.01)
            await asyncio.sleep(0)
        await watch.stop()
    assert watch.stalls == []
    assert not [entry for entry in logs if "stall" in entry["event"]]
