"""The SlicePublisher (tessera.controller.publisher): built devices in, the fewest slice writes
out, against a fake apiserver; its cache follows the watch, telling our own writes' echoes
from someone else's changes."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Awaitable
from typing import Any, cast

import pytest

from tessera.controller.publisher import SlicePublisher, slice_stub
from tessera.dra.devices import DRAIN_TAINT_KEY, GpuDevices, build_gpu_devices, with_drain_taints
from tessera.kube.http import ApiError
from tessera.kube.objects import Api
from tests.dra_gpus import NODE_UID, dynamic_gpu, mig_gpu

NODE = "gpu-node-1"
COUNTERS = f"{NODE}-tessera-counters"
GPUS = f"{NODE}-tessera-gpus"
GPUS_01 = f"{NODE}-tessera-gpus-01"
_versions = itertools.count(100)


class FakeSliceApi:
    """The slice calls of :class:`Api`, storing what it is sent the way the apiserver does
    (uid and resourceVersion added); ``conflict_on_create`` answers the next create 409."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.conflict_on_create = False
        self.fail_replace: set[str] = set()  # slice names whose next replace fails with a 500
        self.deleted: list[str] = []

    def _store(self, body: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
        stored = copy.deepcopy(body)
        stored["metadata"]["uid"] = uid or f"uid-{next(_versions)}"
        stored["metadata"]["resourceVersion"] = str(next(_versions))
        self.stored[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    async def list_slices(self, label_selector: str, node: str | None = None) -> list[dict[str, Any]]:
        assert label_selector == "app.kubernetes.io/managed-by=tessera"
        return [copy.deepcopy(s) for _, s in sorted(self.stored.items())
                if node is None or s["spec"]["nodeName"] == node]

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.conflict_on_create or body["metadata"]["name"] in self.stored:
            self.conflict_on_create = False
            raise ApiError(409, "AlreadyExists", body["metadata"]["name"])
        return self._store(body)

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        if body["metadata"]["name"] in self.fail_replace:
            self.fail_replace.discard(body["metadata"]["name"])
            raise ApiError(500, "InternalError", body["metadata"]["name"])
        old = self.stored.get(body["metadata"]["name"])
        if old is None:
            raise ApiError(404, "NotFound", body["metadata"]["name"])
        if old["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise ApiError(409, "Conflict", body["metadata"]["name"])
        return self._store(body, old["metadata"]["uid"])

    async def delete_slice(self, name: str, uid: str | None = None) -> None:
        if name in self.stored and (uid is None or self.stored[name]["metadata"]["uid"] == uid):
            del self.stored[name]
            self.deleted.append(name)

    def put(self, name: str, pool: str, driver: str = "gpu.tessera.dev") -> dict[str, Any]:
        """A slice with our label written behind the publisher's back (an earlier operator's)."""
        return self._store({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "tessera"}},
            "spec": {"driver": driver, "nodeName": pool, "pool": {"name": pool, "generation": 1,
                                                                  "resourceSliceCount": 1}},
        })


class Writes:
    """The injected writer: records each write's metric label."""

    def __init__(self) -> None:
        self.made: list[str] = []

    async def __call__(self, what: str, call: Awaitable[Any]) -> Any:
        self.made.append(what)
        return await call


def publisher(api: FakeSliceApi) -> tuple[SlicePublisher, Writes]:
    writes = Writes()
    return SlicePublisher(cast(Api, api), writes), writes


async def fill_as_the_watch_does(pub: SlicePublisher, api: FakeSliceApi) -> None:
    """The slice watch's first list, passed to the publisher as ADDED events."""
    for item in await api.list_slices("app.kubernetes.io/managed-by=tessera"):
        pub.seen("ADDED", item)


def three_gpus() -> list[GpuDevices]:
    """Three DynamicMIG GPUs of 25 devices: GPUs 0 and 1 fill the slice ``GPUS``, GPU 2 starts
    ``GPUS_01`` (50 + 25 > 64), and their counter sets share ``COUNTERS``: a pool of three slices."""
    return [build_gpu_devices(dynamic_gpu(i)) for i in range(3)]


def drained(gpus: list[GpuDevices], *indexes: int) -> list[GpuDevices]:
    """``gpus`` with the drain taint on every device of the GPUs ``indexes``."""
    return [with_drain_taints(g, {g.gpu_uuid}) if g.gpu_index in indexes else g for g in gpus]


async def test_first_publish_creates_every_slice_of_the_pool_and_publishing_again_writes_nothing() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)

    await pub.publish(NODE, NODE_UID, three_gpus())
    assert writes.made == ["resourceslice/create"] * 3
    assert sorted(api.stored) == [COUNTERS, GPUS, GPUS_01]
    assert [s["metadata"]["resourceVersion"] for s in pub.bodies(NODE)] == [
        api.stored[n]["metadata"]["resourceVersion"] for n in sorted(api.stored)
    ], "the cache holds the slices as the API returned them"

    await pub.publish(NODE, NODE_UID, three_gpus())
    assert len(writes.made) == 3


async def test_drain_taints_laid_on_built_devices_rewrite_only_the_slice_that_holds_the_gpu() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    built = three_gpus()
    await pub.publish(NODE, NODE_UID, built)

    await pub.publish(NODE, NODE_UID, drained(built, 2))

    assert writes.made[3:] == ["resourceslice/update"]
    assert all(d["taints"] == [{"key": DRAIN_TAINT_KEY, "effect": "NoSchedule"}]
               for d in api.stored[GPUS_01]["spec"]["devices"])
    assert all("taints" not in d for d in api.stored[GPUS]["spec"]["devices"])
    assert "taints" not in built[2].devices[0], "the built devices are left as they were"


async def test_publishing_no_devices_deletes_every_slice_of_the_node() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())

    await pub.publish(NODE, NODE_UID, ())

    assert api.stored == {}
    assert writes.made[3:] == ["resourceslice/delete"] * 3
    assert pub.slices[NODE] == {}


async def test_a_conflicting_create_reads_the_pool_again_and_raises_so_the_next_publish_plans_from_the_truth() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    theirs = api.put(GPUS, NODE)  # written while the cache did not know it

    with pytest.raises(ApiError):
        await pub.publish(NODE, NODE_UID, three_gpus())
    assert GPUS in pub.slices[NODE]

    await pub.publish(NODE, NODE_UID, three_gpus())
    assert api.stored[GPUS]["metadata"]["uid"] == theirs["metadata"]["uid"], "replaced, not re-made"
    assert api.stored[GPUS]["spec"]["devices"][0]["name"].startswith("gpu-0-dyn-")
    assert GPUS_01 in api.stored


async def test_a_stale_update_reads_the_pool_again_and_raises() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())
    api.stored[GPUS]["metadata"]["resourceVersion"] = "999"  # someone else wrote

    with pytest.raises(ApiError):
        await pub.publish(NODE, NODE_UID, drained(three_gpus(), 0))

    assert pub.slices[NODE][GPUS].resource_version == "999"


async def test_a_first_list_then_removing_orphans_deletes_only_slices_whose_node_is_gone() -> None:
    api = FakeSliceApi()
    api.put(GPUS, NODE)
    api.put("gone-node-tessera-gpus", "gone-node")
    api.put("gone-node-other-driver", "gone-node", driver="other.example.com")  # labelled ours, but not
    pub, writes = publisher(api)

    await fill_as_the_watch_does(pub, api)
    assert set(pub.slices) == {NODE, "gone-node"}
    assert list(pub.slices["gone-node"]) == ["gone-node-tessera-gpus"], "another driver's slice is not ours"
    await pub.remove_orphans({NODE})

    assert api.deleted == ["gone-node-tessera-gpus"]
    assert writes.made == ["resourceslice/delete"]
    assert set(pub.slices) == {NODE}


async def test_after_a_restart_the_same_devices_are_compared_once_and_then_known_to_match() -> None:
    api = FakeSliceApi()
    first, _ = publisher(api)
    await first.publish(NODE, NODE_UID, three_gpus())
    restarted, writes = publisher(api)
    await fill_as_the_watch_does(restarted, api)
    assert all(entry.matches is None for entry in restarted.slices[NODE].values()), "loaded: nothing known yet"

    await restarted.publish(NODE, NODE_UID, three_gpus())

    assert writes.made == [], "what the API holds is what would be written"
    assert all(entry.matches is not None for entry in restarted.slices[NODE].values())
    await restarted.publish(NODE, NODE_UID, drained(three_gpus(), 0))
    assert writes.made == ["resourceslice/update"], "a remembered match does not hide a change"


async def test_someone_elses_change_is_compared_in_full_again() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())
    theirs = copy.deepcopy(api.stored[GPUS_01])
    theirs["spec"]["devices"] = theirs["spec"]["devices"][:1]  # a device removed behind our back
    api.stored[theirs["metadata"]["name"]] = api._store(theirs, theirs["metadata"]["uid"])
    assert pub.seen("MODIFIED", api.stored[theirs["metadata"]["name"]])

    await pub.publish(NODE, NODE_UID, three_gpus())

    assert writes.made[3:] == ["resourceslice/update"]
    assert len(api.stored[GPUS_01]["spec"]["devices"]) == len(three_gpus()[2].devices)


async def test_a_pool_left_with_mixed_generations_is_written_again_though_every_slice_matches() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    three = three_gpus()
    await pub.publish(NODE, NODE_UID, three)
    changed = drained(three, 0, 2)  # two slices change: a new generation for the whole pool
    api.fail_replace = {COUNTERS}  # the new generation's write of the unchanged counter slice fails

    with pytest.raises(ApiError):
        await pub.publish(NODE, NODE_UID, changed)
    generations = {s["spec"]["pool"]["generation"] for s in api.stored.values()}
    assert len(generations) == 2, "the counter slice holds what it should, but at the old generation"
    made = len(writes.made)

    await pub.publish(NODE, NODE_UID, changed)

    assert writes.made[made:] == ["resourceslice/update"]
    assert {s["spec"]["pool"]["generation"] for s in api.stored.values()} == {2}


async def test_forgetting_a_pool_deletes_its_slices_and_its_cache() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())

    await pub.forget(NODE)

    assert api.stored == {}
    assert writes.made[3:] == ["resourceslice/delete"] * 3
    assert NODE not in pub.slices


async def test_the_echo_of_our_own_write_is_no_change_and_someone_elses_is() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())
    ours = copy.deepcopy(api.stored[GPUS])

    assert not pub.seen("MODIFIED", ours), "the same resourceVersion: our own write coming back"

    theirs = copy.deepcopy(ours)
    theirs["metadata"]["resourceVersion"] = "5000"
    theirs["spec"]["devices"] = []
    assert pub.seen("MODIFIED", theirs)
    assert pub.slices[NODE][GPUS].body()["spec"]["devices"] == []


async def test_a_deletion_counts_once_and_only_for_a_slice_the_cache_holds() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())
    body = api.stored[GPUS_01]

    assert pub.seen("DELETED", slice_stub(body))  # all a relist keeps of a slice that went
    assert sorted(pub.slices[NODE]) == [COUNTERS, GPUS]
    assert not pub.seen("DELETED", slice_stub(body)), "already gone from the cache"


async def test_a_deletion_the_watch_brings_while_we_write_is_not_undone_by_our_answer() -> None:
    """The kubelet wipes a driver's slices when its plugin goes: if that deletion reaches the
    cache while our update is in flight, our (older) answer must not bring the slice back, or
    the next publish would find nothing to write."""
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, three_gpus())
    name = GPUS
    replace = api.replace_slice

    async def replace_then_wiped(body: dict[str, Any]) -> dict[str, Any]:
        answer = await replace(body)
        pub.seen("MODIFIED", copy.deepcopy(api.stored[name]))  # our echo
        pub.seen("DELETED", slice_stub(api.stored.pop(name)))  # the kubelet's deletion, before our answer
        return answer

    api.replace_slice = replace_then_wiped  # type: ignore[method-assign]
    await pub.publish(NODE, NODE_UID, drained(three_gpus(), 0))
    assert name not in pub.slices[NODE]

    api.replace_slice = replace  # type: ignore[method-assign]
    await pub.publish(NODE, NODE_UID, drained(three_gpus(), 0))
    assert writes.made[-1] == "resourceslice/create", "the next publish puts the slice back"
    assert name in api.stored


async def test_the_cache_holds_each_slice_packed_and_gives_back_what_the_api_sent_without_managed_fields() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, [build_gpu_devices(mig_gpu(0))])
    stored = api.stored[GPUS]
    seen = copy.deepcopy(stored)
    seen["metadata"]["resourceVersion"] = "9999"  # someone else's version, as the watch brings it
    seen["metadata"]["managedFields"] = [{"manager": "someone", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    assert pub.seen("MODIFIED", seen)

    entry = pub.slices[NODE][GPUS]
    del seen["metadata"]["managedFields"]
    assert entry.body() == seen
    as_json = len(json.dumps(seen, separators=(",", ":")))
    assert len(entry.packed) * 3 < as_json, f"{len(entry.packed)} bytes kept for a {as_json}-byte slice"


async def test_an_echo_that_overtakes_our_answer_is_still_our_own_and_asks_for_no_replan() -> None:
    """The watch often brings our write before its answer: that event is no change, the slice is
    known to match what we built, and nobody is asked to plan the pool again."""
    api = FakeSliceApi()
    replans: list[str] = []
    writes = Writes()
    pub = SlicePublisher(cast(Api, api), writes, replans.append)
    await pub.publish(NODE, NODE_UID, three_gpus())
    replace = api.replace_slice
    told: list[bool] = []

    async def replace_echo_first(body: dict[str, Any]) -> dict[str, Any]:
        answer = await replace(body)
        told.append(pub.seen("MODIFIED", copy.deepcopy(api.stored[body["metadata"]["name"]])))
        return answer

    api.replace_slice = replace_echo_first  # type: ignore[method-assign]
    tainted = drained(three_gpus(), 0)
    await pub.publish(NODE, NODE_UID, tainted)
    assert told == [False], "the echo that came before the answer is our own"
    assert replans == []
    assert all(entry.matches is not None for entry in pub.slices[NODE].values()), "known to match what we built"
    made = len(writes.made)
    await pub.publish(NODE, NODE_UID, tainted)
    assert len(writes.made) == made


async def test_someone_elses_version_while_we_write_has_the_pool_planned_again() -> None:
    api = FakeSliceApi()
    replans: list[str] = []
    pub = SlicePublisher(cast(Api, api), Writes(), replans.append)
    await pub.publish(NODE, NODE_UID, three_gpus())
    name = GPUS
    replace = api.replace_slice

    async def replace_then_theirs(body: dict[str, Any]) -> dict[str, Any]:
        answer = await replace(body)
        assert not pub.seen("MODIFIED", copy.deepcopy(api.stored[name])), "our echo"
        theirs = copy.deepcopy(api.stored[name])
        theirs["metadata"]["resourceVersion"] = "9000"
        theirs["spec"]["devices"] = []
        api.stored[name] = theirs
        assert not pub.seen("MODIFIED", copy.deepcopy(theirs)), "judged when our answer comes"
        return answer

    api.replace_slice = replace_then_theirs  # type: ignore[method-assign]
    await pub.publish(NODE, NODE_UID, drained(three_gpus(), 0))
    assert replans == [NODE]
    assert pub.slices[NODE][name].resource_version == "9000", "the cache keeps the newest version"
    assert pub.slices[NODE][name].matches is None, "and does not take it for ours"
