"""A prepare that starts from the agent's claim watch: the watch's copy is used only once a read
of the claim alongside agrees with it; a copy that is behind (the claim re-allocated under the
same UID) is rolled back and the work redone from the read's copy, so no device is ever handed
out, held or recorded from a stale allocation. CDI specs, written without a sync, are rewritten
when lost. The last test runs many claims at once with seeded races and faults."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tessera import DRIVER_NAME
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.plugin.cdi import spec_file_name
from tessera.agent.plugin.checkpoint import ClaimState, load_checkpoint
from tessera.agent.plugin.claims import ClaimError, ClaimRef
from tessera.agent.plugin.prepare import ClaimPreparer
from tessera.agent.plugin.watched import same_claim
from tessera.models.devices import mig_device_name
from tests import plugin_helpers as helpers
from tests.plugin_helpers import (
    MPS,
    NODE,
    STATIC,
    STATIC_MIG,
    WHOLE,
    FakeClaimReader,
    PluginDirs,
    claim,
    dynamic,
    gpu,
    make_backend,
    result,
)


@dataclass
class FakeView:
    """The agent's claim watch as the preparer sees it: copies by namespace/name, maybe behind."""

    copies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def put(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self.copies[(meta["namespace"], meta["name"])] = copy.deepcopy(body)

    def claim_copy(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.copies.get((namespace, name))


@dataclass
class RacingReader(FakeClaimReader):
    """The API: serves claims like FakeClaimReader; a read may be slow or fail, by name."""

    failing: set[str] = field(default_factory=set)
    delays: dict[str, float] = field(default_factory=dict)

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        await asyncio.sleep(self.delays.get(name, 0.0))
        if name in self.failing:
            raise ClaimError(f"reading ResourceClaim {namespace}/{name} failed: 503 the API is away")
        found = self.claims.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None


@pytest.fixture
def dirs(tmp_path: Path) -> PluginDirs:
    return PluginDirs(tmp_path)


@pytest.fixture
def backend() -> Iterator[SimulatedBackend]:
    b = make_backend()
    yield b
    b.close()


def preparer(backend: SimulatedBackend, reader: FakeClaimReader, view: FakeView, dirs: PluginDirs) -> ClaimPreparer:
    return helpers.preparer(backend, reader, dirs, view=view)


def ref(body: dict[str, Any]) -> ClaimRef:
    meta = body["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def versioned(body: dict[str, Any], version: str) -> dict[str, Any]:
    body["metadata"]["resourceVersion"] = version
    return body


def reallocated(body: dict[str, Any], *results: dict[str, Any], version: str) -> dict[str, Any]:
    """The same claim (same UID) after its allocation was cleared and made again."""
    again = copy.deepcopy(body)
    again["status"]["allocation"] = {"devices": {"results": list(results)}}
    return versioned(again, version)


def reads(plugin: ClaimPreparer, source: str) -> float:
    return plugin.metrics.registry.get_sample_value("tessera_agent_plugin_claim_reads_total", {"source": source}) or 0


def all_holders(backend: SimulatedBackend) -> dict[str, list[str]]:
    with backend.hardware.transaction(write=False) as state:
        return {uuid: list(holders) for uuid, holders in state.holds.items() if holders}


# --- agreement ----------------------------------------------------------------------------------


def test_copies_agree_on_uid_and_version_or_else_on_the_allocation() -> None:
    body = versioned(claim("c", result(WHOLE)), "7")
    assert same_claim(body, copy.deepcopy(body))
    status_written = versioned(copy.deepcopy(body), "8")
    status_written["status"]["devices"] = [{"driver": DRIVER_NAME, "pool": NODE, "device": WHOLE}]
    assert same_claim(body, status_written), "a status write changes the version, not what to prepare"
    assert not same_claim(body, reallocated(body, result(MPS), version="9"))
    other_uid = versioned(copy.deepcopy(body), "7")
    other_uid["metadata"]["uid"] = "another"
    assert not same_claim(body, other_uid)


async def test_a_claim_the_watch_has_is_prepared_from_it_and_still_read(
    backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = versioned(claim("watched", result(WHOLE)), "5")
    reader, view = RacingReader(), FakeView()
    reader.add(body)
    view.put(body)
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    reader.delays["watched"] = 0.02  # the read finishes after the holds and the CDI spec

    prepared = await plugin.prepare(ref(body))

    assert [d.device for d in prepared.devices] == [WHOLE]
    assert reader.reads == 1, "the claim is read even though the watch had it"
    assert (reads(plugin, "view"), reads(plugin, "get"), reads(plugin, "view_stale")) == (1, 0, 0)
    steps = plugin.metrics.registry.get_sample_value(
        "tessera_agent_plugin_step_seconds_count", {"operation": "prepare", "step": "claim_read_alongside"})
    assert steps == 1


async def test_without_a_copy_in_the_watch_the_claim_is_read_first(
    backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("unseen", result(WHOLE))
    recreated = claim("recreated", result(MPS, share_id="a"))
    reader, view = RacingReader(), FakeView()
    reader.add(body, recreated)
    old = copy.deepcopy(recreated)
    old["metadata"]["uid"] = "the-claim-deleted-before"
    view.put(old)
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    await plugin.prepare(ref(body))
    await plugin.prepare(ref(recreated))
    assert reads(plugin, "get") == 2, "no copy, or a copy of another claim by that name: read first"


# --- the watch behind ---------------------------------------------------------------------------


async def test_a_claim_reallocated_under_the_same_uid_is_prepared_from_the_apis_allocation(
    backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    before = versioned(claim("moved", result(WHOLE)), "10")
    now = reallocated(before, result(STATIC), version="12")
    reader, view = RacingReader(), FakeView()
    reader.add(now)
    view.put(before)  # the watch has not seen the new allocation yet
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    reader.delays["moved"] = 0.02

    prepared = await plugin.prepare(ref(now))

    uid = now["metadata"]["uid"]
    assert [d.device for d in prepared.devices] == [STATIC]
    static_uuid = gpu(backend, 0).instances[0].uuid
    assert all_holders(backend) == {static_uuid: [uid]}, "the stale whole GPU is not held"
    spec = json.loads((dirs.cdi / spec_file_name(uid)).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{STATIC}"]
    saved = load_checkpoint(dirs.checkpoint)
    assert saved is not None
    assert [d.device for d in saved.claims[uid].devices] == [STATIC]
    assert (reads(plugin, "view"), reads(plugin, "view_stale")) == (0, 1)


async def test_a_stale_dynamic_mig_placement_is_never_made(backend: SimulatedBackend, dirs: PluginDirs) -> None:
    before = versioned(claim("dyn", result(dynamic("1g.10gb", 0))), "3")
    now = reallocated(before, result(dynamic("2g.20gb", 2)), version="4")
    reader, view = RacingReader(), FakeView()
    reader.add(now)
    view.put(before)
    made: list[tuple[str, int]] = []
    create = backend.create_instance

    def recording_create(gpu_uuid: str, profile: str, start: int, hold: str | None = None) -> Any:
        made.append((profile, start))
        return create(gpu_uuid, profile, start, hold)

    backend.create_instance = recording_create  # type: ignore[method-assign]  # records every instance made
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()

    prepared = await plugin.prepare(ref(now))

    assert made == [("2g.20gb", 2)], "only the API's placement was ever made"
    assert [(i.profile, i.start) for i in gpu(backend, 2).instances] == [("2g.20gb", 2)]
    assert [d.device for d in prepared.devices] == [dynamic("2g.20gb", 2)]


async def test_a_claim_gone_from_the_api_is_refused_and_the_watchs_work_undone(
    backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("gone", result(WHOLE), result(MPS, "share", share_id="s", consumed={"compute": "10"}))
    reader, view = RacingReader(), FakeView()
    view.put(body)  # deleted; the watch has not heard yet
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    reader.delays["gone"] = 0.02

    with pytest.raises(ClaimError, match="does not exist"):
        await plugin.prepare(ref(body))

    assert all_holders(backend) == {}
    assert not (dirs.cdi / spec_file_name(body["metadata"]["uid"])).exists()
    assert plugin.claims == {}


async def test_a_failed_read_fails_the_prepare_even_with_the_watchs_copy(
    backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    body = claim("unread", result(WHOLE))
    reader, view = RacingReader(), FakeView()
    reader.add(body)
    view.put(body)
    reader.failing.add("unread")
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    with pytest.raises(ClaimError, match="the API is away"):
        await plugin.prepare(ref(body))
    assert all_holders(backend) == {}
    assert plugin.claims == {}
    reader.failing.clear()
    await plugin.prepare(ref(body))
    assert list(plugin.claims) == [body["metadata"]["uid"]]


async def test_a_refusal_from_a_stale_copy_waits_for_the_apis_copy(
    backend: SimulatedBackend, dirs: PluginDirs
) -> None:
    before = versioned(claim("was-elsewhere", result(WHOLE, pool="gpu-node-2")), "1")
    now = reallocated(before, result(WHOLE), version="2")
    reader, view = RacingReader(), FakeView()
    reader.add(now)
    view.put(before)
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    prepared = await plugin.prepare(ref(now))
    assert [d.device for d in prepared.devices] == [WHOLE]


# --- CDI specs without a sync ---------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["missing", "empty", "truncated"])
async def test_a_cdi_spec_lost_by_a_crash_is_written_again_by_the_next_prepare(
    backend: SimulatedBackend, dirs: PluginDirs, loss: str
) -> None:
    body = claim("lost-spec", result(STATIC), result(MPS, "share", share_id="m", consumed={"memory": "1Gi"}))
    reader, view = RacingReader(), FakeView()
    reader.add(body)
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    first = await plugin.prepare(ref(body))
    path = dirs.cdi / spec_file_name(body["metadata"]["uid"])
    written = path.read_bytes()
    if loss == "missing":
        path.unlink()
    else:
        path.write_bytes(b"" if loss == "empty" else written[: len(written) // 2])

    again = await plugin.prepare(ref(body))

    assert again == first
    assert path.read_bytes() == written
    saved = load_checkpoint(dirs.checkpoint)
    assert saved is not None
    assert saved.claims[first.uid].state is ClaimState.PREPARED


async def test_an_intact_spec_is_not_rewritten(backend: SimulatedBackend, dirs: PluginDirs) -> None:
    body = claim("intact", result(WHOLE))
    reader, view = RacingReader(), FakeView()
    reader.add(body)
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    await plugin.prepare(ref(body))
    path = dirs.cdi / spec_file_name(body["metadata"]["uid"])
    stamp = path.stat().st_mtime_ns
    await plugin.prepare(ref(body))
    assert reader.reads == 1
    assert path.stat().st_mtime_ns == stamp


# --- many claims, seeded races and faults -------------------------------------------------------

EXCLUSIVE = [WHOLE, *(mig_device_name(0, profile, start) for profile, start in STATIC_MIG)]
PLACEMENTS = [dynamic("1g.10gb", s) for s in range(7)]


@pytest.mark.parametrize("seed", range(12))
async def test_seeded_watch_races_never_hand_a_device_to_two_claims(
    backend: SimulatedBackend, dirs: PluginDirs, seed: int
) -> None:
    """Rounds of claims prepared at once, as a scheduler allocates them (an exclusive device or
    a DynamicMIG placement to one claim, MPS shares to many). Per claim, by the seed: the watch
    has a current copy, a copy from before the claim was re-allocated under the same UID (its
    device now another claim's), a copy that differs only by version, or none; the read is slow,
    fails, or finds the claim deleted. Whatever happens: an answer names exactly the API's
    allocation, and its checkpoint record is on disk when the answer comes; no device is held
    by a claim that did not get it; no exclusive device or placement goes to two claims; no
    stale placement is made; and a failed claim leaves nothing behind."""
    rng = random.Random(seed)
    reader, view = RacingReader(), FakeView()
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    for round_ in range(4):
        # The scheduler: each exclusive device and placement to at most one claim.
        singles = rng.sample(EXCLUSIVE + PLACEMENTS, 6)
        bodies = []
        for n, device in enumerate([*singles, MPS, MPS]):
            share = {"share_id": f"r{round_}-{n}", "consumed": {"compute": "10"}} if device == MPS else {}
            bodies.append(versioned(claim(f"c{round_}-{n}", result(device, **share)), "20"))  # type: ignore[arg-type]
        for n, body in enumerate(bodies):
            fate = rng.choice(["current", "behind", "behind", "version", "none"])
            if fate == "current":
                view.put(body)
            elif fate == "version":
                view.put(versioned(copy.deepcopy(body), "19"))
            elif fate == "behind":  # before: another claim's device now
                view.put(reallocated(body, result(bodies[(n + 1) % 6]["status"]["allocation"]["devices"]["results"]
                                                  [0]["device"]), version="18"))
            read = rng.choice(["ok", "ok", "ok", "fail", "deleted"])
            if read != "deleted":
                reader.add(body)
            if read == "fail":
                reader.failing.add(body["metadata"]["name"])
            reader.delays[body["metadata"]["name"]] = rng.uniform(0, 0.004)

        async def prepare(body: dict[str, Any]) -> Any:
            try:
                answer = await plugin.prepare(ref(body))
            except ClaimError as error:
                return error
            saved = load_checkpoint(dirs.checkpoint)  # no await since the answer: this is what it saw
            assert saved is not None
            assert saved.claims[answer.uid].state is ClaimState.PREPARED
            return answer

        outcomes = await asyncio.gather(*(prepare(b) for b in bodies))

        answered = {}
        for body, outcome in zip(bodies, outcomes, strict=True):
            uid, name = body["metadata"]["uid"], body["metadata"]["name"]
            should_fail = name in reader.failing or (body["metadata"]["namespace"], name) not in reader.claims
            assert isinstance(outcome, ClaimError) == should_fail, (name, outcome)
            if not should_fail:
                wanted = [r["device"] for r in body["status"]["allocation"]["devices"]["results"]]
                assert [d.device for d in outcome.devices] == wanted
                answered[uid] = outcome
            else:
                assert uid not in plugin.claims
                assert not (dirs.cdi / spec_file_name(uid)).exists()
        held_by = all_holders(backend)
        for uuid, holders in held_by.items():
            for holder in holders:
                assert holder in answered, (uuid, holder)
                assert uuid in answered[holder].device_uuids, (uuid, holder)
        given = [d.device for a in answered.values() for d in a.devices if d.device != MPS]
        assert len(given) == len(set(given)), "an exclusive device or placement went to two claims"
        made = sorted(dynamic(i.profile, i.start) for i in gpu(backend, 2).instances)
        assert made == sorted(d for d in given if d in PLACEMENTS), "only answered placements exist"

        for uid, answer in answered.items():
            await plugin.unprepare(ClaimRef(answer.namespace, answer.name, uid))
        assert all_holders(backend) == {}
        assert not gpu(backend, 2).instances
        view.copies.clear()
        reader.claims.clear()
        reader.failing.clear()


async def test_the_checkpoint_is_synced_before_the_answer_and_the_cdi_spec_is_not(
    backend: SimulatedBackend, dirs: PluginDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = claim("synced", result(WHOLE))
    reader, view = RacingReader(), FakeView()
    reader.add(body)
    plugin = preparer(backend, reader, view, dirs)
    await plugin.restore()
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    await plugin.prepare(ref(body))
    assert any(Path(p).name.startswith(f".{dirs.checkpoint.name}.") for p in synced), "the checkpoint's data"
    assert str(dirs.checkpoint.parent) in synced, "the checkpoint's rename"
    assert not any(str(dirs.cdi) in p for p in synced), synced
