"""The one door for the operator's writes (tessera.controller.writes): counted per kind while
the gate is open; with the gate shut (the seam leader election closes on a standby) a write is
refused before anything is sent, and a reconcile that needs one fails and is tried again."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from tessera.controller.workqueue import WorkQueue
from tessera.controller.writes import ApiWrites, NotLeading
from tests.conditions import until


def written(what: str) -> float:
    return REGISTRY.get_sample_value("tessera_operator_api_writes_total", {"what": what}) or 0.0


async def test_an_open_gate_sends_the_write_and_counts_it() -> None:
    sent: list[str] = []

    async def call() -> str:
        sent.append("spec")
        return "answer"

    writes = ApiWrites()
    before = written("test/open")
    assert await writes("test/open", call()) == "answer"
    assert sent == ["spec"]
    assert written("test/open") == before + 1


async def test_a_shut_gate_refuses_before_anything_is_sent_and_opens_again() -> None:
    sent: list[str] = []

    async def call() -> None:
        sent.append("spec")

    leading = False
    writes = ApiWrites(gate=lambda: leading)
    before = written("test/shut")
    with pytest.raises(NotLeading, match="test/shut"):
        await writes("test/shut", call())  # the coroutine is closed: no "never awaited" warning either
    assert sent == []
    assert written("test/shut") == before

    leading = True
    await writes("test/shut", call())
    assert sent == ["spec"]


async def test_a_reconcile_refused_by_the_gate_is_tried_again_until_the_gate_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leading = False
    writes = ApiWrites(gate=lambda: leading)
    sent: list[str] = []
    wrote = asyncio.Event()

    async def send(node: str) -> None:
        sent.append(node)
        wrote.set()

    async def reconcile(node: str) -> None:
        await writes("nodelayout/spec", send(node))

    queue = WorkQueue(reconcile, workers=1)
    attempts: list[float] = []
    later = queue.later

    def come_back_soon(node: str, delay: float) -> None:
        attempts.append(delay)
        later(node, 0.001)

    monkeypatch.setattr(queue, "later", come_back_soon)
    queue.start()
    try:
        queue.enqueue("node-a")
        await until(lambda: len(attempts) >= 3, "three refused attempts")
        assert sent == []
        leading = True
        await asyncio.wait_for(wrote.wait(), 5)
    finally:
        await queue.stop()
    assert sent == ["node-a"]
