"""The handover's fresh read of claims: every caller gets a list started no earlier than the
moment it names, and callers waiting together share one list instead of one each."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tessera.controller.freshclaims import FreshClaims
from tests.conditions import until
from tests.controller_fleet import claim_body


class CountingReader:
    """Stands in for the API's list of ResourceClaims: counts calls, answers after a pause."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.claims = [claim_body("held", ["gpu-0"]), claim_body("pending")]
        self.started = asyncio.Event()  # a list is under way

    async def __call__(self) -> list[dict[str, Any]]:
        self.calls.append(time.monotonic())
        self.started.set()
        await asyncio.sleep(0.05)  # the apiserver's answer takes a moment: callers pile up meanwhile
        return list(self.claims)


async def test_callers_waiting_together_share_one_list() -> None:
    reader = CountingReader()
    fresh = FreshClaims(reader)
    now = time.monotonic()

    results = await asyncio.gather(*(fresh.since(now) for _ in range(20)))

    assert len(reader.calls) == 1
    assert all(r == results[0] for r in results)
    assert [h.key for h in results[0]] == ["default/held"], "only claims that hold a device of ours"


async def test_a_list_started_before_the_moment_is_never_used() -> None:
    reader = CountingReader()
    fresh = FreshClaims(reader)
    early = asyncio.create_task(fresh.since(time.monotonic()))
    await reader.started.wait()  # that list is under way
    reader.claims.append(claim_body("allocated-since", ["gpu-1"]))
    later = time.monotonic()

    holds = await fresh.since(later)

    await early
    assert len(reader.calls) == 2, "the list in flight began too early: a second one was made"
    assert reader.calls[1] >= later
    assert "default/allocated-since" in [h.key for h in holds]


async def test_a_failed_list_raises_for_its_callers_and_the_next_one_lists_again() -> None:
    calls = 0

    async def failing_once() -> list[dict[str, Any]]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("apiserver went away")
        return [claim_body("held", ["gpu-0"])]

    fresh = FreshClaims(failing_once)
    with pytest.raises(ConnectionError):  # a failed read never passes for a fresh one
        await fresh.since(time.monotonic())

    holds = await fresh.since(time.monotonic())
    assert [h.key for h in holds] == ["default/held"]


async def test_prefetch_calls_back_once_a_list_after_the_moment_is_read_and_ready_then_serves_it() -> None:
    reader = CountingReader()
    fresh = FreshClaims(reader)
    moment = time.monotonic()
    assert fresh.ready(moment) is None
    called: list[str] = []
    for node in ("a", "b", "c"):
        fresh.prefetch(moment, lambda n=node: called.append(n))  # type: ignore[misc]
    assert called == [], "nobody waits: the callers are told later"
    await until(lambda: len(called) == 3, "the three callbacks")
    assert len(reader.calls) == 1, "the three share one list"
    holds = fresh.ready(moment)
    assert holds is not None
    assert [h.key for h in holds] == ["default/held"]
    assert fresh.ready(time.monotonic()) is None, "a later moment needs a later list"


async def test_after_a_failed_list_prefetch_calls_back_only_after_the_retry_delay() -> None:
    async def failing() -> list[dict[str, Any]]:
        raise OSError("apiserver away")

    fresh = FreshClaims(failing)
    called: list[float] = []
    started = time.monotonic()
    fresh.prefetch(started, lambda: called.append(time.monotonic()), retry_after=0.2)
    await until(lambda: len(called) == 1, "the callback after the retry delay")
    assert called[0] - started >= 0.2
    assert fresh.ready(started) is None

