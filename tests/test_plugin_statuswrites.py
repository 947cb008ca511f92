"""Claim device status written after the kubelet's answer (tessera.agent.plugin.statuswrites),
and what the answer still waits for (tessera.agent.plugin.prepare): the checkpoint is on disk
before a prepare returns, while the status write may still be failing; the status, retried
until it lands, ends as the claim's last wish, never overtaken by an older one; and under
concurrent prepares and unprepares with random timing and injected faults, no device is ever
given to two claims. Seeded: a failure prints its seed, and TESSERA_STATUS_SEED replays it."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.plugin.checkpoint import ClaimState, load_checkpoint
from tessera.agent.plugin.claims import ClaimError, ClaimRef
from tessera.agent.plugin.statuswrites import ClaimStatusWrites
from tessera.agent.plugin.steps import PluginMetrics
from tessera.kube.http import ApiError
from tests.plugin_helpers import (
    WHOLE,
    FakeClaimReader,
    PluginDirs,
    claim,
    dynamic,
    make_backend,
    preparer,
    result,
)

SEEDS = [int(os.environ["TESSERA_STATUS_SEED"])] if "TESSERA_STATUS_SEED" in os.environ else list(range(6))


def ref_of(body: dict[str, Any]) -> ClaimRef:
    meta = body["metadata"]
    return ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


class FlakyWriter:
    """An API that answers late and sometimes not at all; records what landed, in order."""

    def __init__(self, rng: random.Random, failure_rate: float = 0.3) -> None:
        self.rng = rng
        self.failure_rate = failure_rate
        self.landed: list[tuple[str, list[dict[str, Any]]]] = []
        self.blocked: asyncio.Event | None = None
        self.attempts = 0

    async def write_device_status(self, ref: ClaimRef, devices: Sequence[dict[str, Any]]) -> None:
        self.attempts += 1
        if self.blocked is not None:
            await self.blocked.wait()
        await asyncio.sleep(self.rng.uniform(0, 0.003))
        if self.rng.random() < self.failure_rate:
            raise ConnectionResetError("the apiserver went away mid-request")
        self.landed.append((ref.uid, list(devices)))


def last_landed(writer: FlakyWriter) -> dict[str, list[dict[str, Any]]]:
    return dict(writer.landed)  # the last write of each claim wins


@pytest.mark.parametrize("seed", SEEDS)
async def test_each_claim_ends_with_its_last_wish_and_no_older_wish_lands_after_a_newer(seed: int) -> None:
    print(f"TESSERA_STATUS_SEED={seed}")
    rng = random.Random(seed)
    writer = FlakyWriter(rng)
    writes = ClaimStatusWrites(writer, PluginMetrics(), delay=lambda attempt: 0.001)
    refs = [ClaimRef("ns", f"c{i}", f"uid-{i}") for i in range(8)]
    wished: dict[str, list[dict[str, Any]]] = {}
    for n in range(200):
        ref = rng.choice(refs)
        entries = [] if rng.random() < 0.4 else [{"device": f"gpu-{n}", "n": n}]
        writes.submit(ref, entries)
        wished[ref.uid] = entries
        if rng.random() < 0.5:
            await asyncio.sleep(rng.uniform(0, 0.002))
    await asyncio.wait_for(writes.flush(), 30)

    assert writes.pending == 0
    assert last_landed(writer) == wished
    for ref in refs:
        numbers = [e[0]["n"] if e else None for uid, e in writer.landed if uid == ref.uid]
        written = [n for n in numbers if n is not None]
        assert written == sorted(written), f"an older status landed after a newer one for {ref.uid}"


async def test_a_request_the_api_refuses_as_invalid_is_not_tried_again() -> None:
    class Refusing:
        calls = 0

        async def write_device_status(self, ref: ClaimRef, devices: Sequence[dict[str, Any]]) -> None:
            self.calls += 1
            raise ApiError(422, "Invalid", "status.devices[0].data: too long")

    writer = Refusing()
    writes = ClaimStatusWrites(writer, PluginMetrics(), delay=lambda attempt: 0.001)
    writes.submit(ClaimRef("ns", "c", "uid-c"), [{"device": "gpu-0"}])
    await asyncio.wait_for(writes.flush(), 5)
    assert writer.calls == 1
    assert writes.pending == 0


async def test_closing_stops_a_write_that_cannot_land() -> None:
    writer = FlakyWriter(random.Random(1), failure_rate=1.0)
    writes = ClaimStatusWrites(writer, PluginMetrics(), delay=lambda attempt: 0.001)
    writes.submit(ClaimRef("ns", "c", "uid-c"), [{"device": "gpu-0"}])
    await asyncio.sleep(0.05)
    await writes.close(grace=0.01)
    attempts = writer.attempts
    assert attempts >= 2, "it was tried again while the API failed"
    await asyncio.sleep(0.02)
    assert writer.attempts == attempts, "nothing is tried after close"
    assert writes.pending == 1


async def test_the_answer_waits_for_the_checkpoint_not_for_the_status_write(tmp_path: Path) -> None:
    backend = make_backend()
    reader = FakeClaimReader()
    writer = FlakyWriter(random.Random(2), failure_rate=0.0)
    writer.blocked = asyncio.Event()  # the API does not answer until told
    dirs = PluginDirs(tmp_path)
    plugin = preparer(backend, reader, dirs, writer)
    await plugin.restore()
    body = claim("whole", result(WHOLE))
    reader.add(body)
    try:
        prepared = await asyncio.wait_for(plugin.prepare(ref_of(body)), 5)

        on_disk = load_checkpoint(dirs.checkpoint)
        assert on_disk is not None
        assert on_disk.claims[prepared.uid].state is ClaimState.PREPARED, "on disk before the kubelet hears"
        assert writer.landed == [], "the status is still on its way"
        writer.blocked.set()
        await asyncio.wait_for(plugin.flush_status(), 5)
        assert [uid for uid, _ in writer.landed] == [prepared.uid]
        steps = plugin.metrics.registry.get_sample_value(
            "tessera_agent_plugin_step_seconds_count", {"operation": "prepare", "step": "checkpoint"})
        assert steps == 1
        assert plugin.metrics.registry.get_sample_value(
            "tessera_agent_plugin_step_seconds_count", {"operation": "prepare", "step": "status"}) is None, (
            "the status write is no step of the answer")
    finally:
        await plugin.close(grace=0.0)
        backend.close()


@pytest.mark.parametrize("seed", SEEDS)
async def test_concurrent_prepares_and_unprepares_with_faults_never_give_a_device_to_two_claims(
    seed: int, tmp_path: Path
) -> None:
    """Claims contend for DynamicMIG placements on one GPU (the same placement, and placements
    that overlap) while others come and go; reads are slow at random, the API drops status
    writes, creating an instance fails now and then. At every answer, no instance is any two
    claims', and a prepared claim is in the checkpoint on disk; at the end each claim's status
    says what the plugin did."""
    print(f"TESSERA_STATUS_SEED={seed}")
    rng = random.Random(seed)
    backend: SimulatedBackend = make_backend()
    reader = FakeClaimReader()
    writer = FlakyWriter(rng)
    dirs = PluginDirs(tmp_path)
    plugin = preparer(backend, reader, dirs, writer)
    await plugin.restore()
    placements = [dynamic("1g.10gb", 0), dynamic("1g.10gb", 0), dynamic("2g.20gb", 0), dynamic("1g.10gb", 1),
                  dynamic("3g.40gb", 4), dynamic("3g.40gb", 4), WHOLE]
    bodies = [claim(f"c{i}", result(device)) for i, device in enumerate(placements)]
    reader.add(*bodies)
    real_read = reader.read_claim

    async def slow_read(namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(rng.uniform(0, 0.004))
        return await real_read(namespace, name)

    reader.read_claim = slow_read  # type: ignore[method-assign]
    prepared: set[str] = set()
    violations: list[str] = []

    def check(after: str) -> None:
        owners: dict[str, str] = {}
        for claim_ in plugin.claims.values():
            if claim_.state is not ClaimState.PREPARED:
                continue
            for device in claim_.devices:
                if device.dynamic is not None and device.device_uuid:
                    if device.device_uuid in owners:
                        violations.append(f"{after}: {device.device_uuid} is {owners[device.device_uuid]}'s "
                                          f"and {claim_.uid}'s")
                    owners[device.device_uuid] = claim_.uid

    async def actor(body: dict[str, Any]) -> None:
        ref = ref_of(body)
        for _ in range(6):
            await asyncio.sleep(rng.uniform(0, 0.004))
            if rng.random() < 0.15:
                backend.hardware.fail_next("create_gpu_instance", "InsufficientResources")
            if ref.uid in prepared and rng.random() < 0.6:
                try:
                    await plugin.unprepare(ref)
                except ClaimError:
                    continue
                prepared.discard(ref.uid)
                check(f"unprepare {ref}")
                continue
            try:
                await plugin.prepare(ref)
            except ClaimError:
                check(f"refused {ref}")
                continue
            prepared.add(ref.uid)
            on_disk = load_checkpoint(dirs.checkpoint)
            if on_disk is None or on_disk.claims.get(ref.uid) is None:
                violations.append(f"{ref} answered before it was in the checkpoint on disk")
            check(f"prepare {ref}")

    try:
        await asyncio.wait_for(asyncio.gather(*(actor(b) for b in bodies)), 60)
        backend.hardware.clear_faults()
        writer.failure_rate = 0.0
        await asyncio.wait_for(plugin.flush_status(), 30)
    finally:
        await plugin.close(grace=0.0)
        backend.close()
    assert violations == []
    final = last_landed(writer)
    for body in bodies:
        uid = body["metadata"]["uid"]
        if uid in prepared:
            assert final.get(uid), f"{uid} is prepared: its status says so"
        else:
            assert not final.get(uid), f"{uid} is not prepared: no status of ours is left on it"
