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
from tests.dra_gpus import NODE_UID, gpu, mig_gpu

NODE = "gpu-node-1"
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


def two_gpus() -> list[GpuDevices]:
    return [build_gpu_devices(gpu(0)), build_gpu_devices(mig_gpu(1))]


async def test_first_publish_creates_each_gpus_slice_and_publishing_again_writes_nothing() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)

    await pub.publish(NODE, NODE_UID, two_gpus())
    assert writes.made == ["resourceslice/create", "resourceslice/create"]
    assert sorted(api.stored) == [f"{NODE}-tessera-gpu-0", f"{NODE}-tessera-gpu-1"]
    assert [s["metadata"]["resourceVersion"] for s in pub.bodies(NODE)] == [
        api.stored[n]["metadata"]["resourceVersion"] for n in sorted(api.stored)
    ], "the cache holds the slices as the API returned them"

    await pub.publish(NODE, NODE_UID, two_gpus())
    assert len(writes.made) == 2


async def test_drain_taints_laid_on_built_devices_rewrite_only_that_gpus_slice() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    built = two_gpus()
    await pub.publish(NODE, NODE_UID, built)

    await pub.publish(NODE, NODE_UID, [with_drain_taints(g, {"gpu-0"}) for g in built])

    assert writes.made[2:] == ["resourceslice/update"]
    (device,) = api.stored[f"{NODE}-tessera-gpu-0"]["spec"]["devices"]
    assert device["taints"] == [{"key": DRAIN_TAINT_KEY, "effect": "NoSchedule"}]
    assert all("taints" not in d for d in api.stored[f"{NODE}-tessera-gpu-1"]["spec"]["devices"])
    assert "taints" not in built[0].devices[0], "the built devices are left as they were"


async def test_publishing_no_devices_deletes_every_slice_of_the_node() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())

    await pub.publish(NODE, NODE_UID, ())

    assert api.stored == {}
    assert writes.made[2:] == ["resourceslice/delete", "resourceslice/delete"]
    assert pub.slices[NODE] == {}


async def test_a_conflicting_create_reads_the_pool_again_and_raises_so_the_next_publish_plans_from_the_truth() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    theirs = api.put(f"{NODE}-tessera-gpu-0", NODE)  # written while the cache did not know it

    with pytest.raises(ApiError):
        await pub.publish(NODE, NODE_UID, two_gpus())
    assert f"{NODE}-tessera-gpu-0" in pub.slices[NODE]

    await pub.publish(NODE, NODE_UID, two_gpus())
    assert api.stored[f"{NODE}-tessera-gpu-0"]["metadata"]["uid"] == theirs["metadata"]["uid"], "replaced, not re-made"
    assert api.stored[f"{NODE}-tessera-gpu-0"]["spec"]["devices"][0]["name"] == "gpu-0"
    assert f"{NODE}-tessera-gpu-1" in api.stored


async def test_a_stale_update_reads_the_pool_again_and_raises() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())
    api.stored[f"{NODE}-tessera-gpu-0"]["metadata"]["resourceVersion"] = "999"  # someone else wrote

    with pytest.raises(ApiError):
        await pub.publish(NODE, NODE_UID, [with_drain_taints(g, {"gpu-0"}) for g in two_gpus()])

    assert pub.slices[NODE][f"{NODE}-tessera-gpu-0"].resource_version == "999"


async def test_a_first_list_then_removing_orphans_deletes_only_slices_whose_node_is_gone() -> None:
    api = FakeSliceApi()
    api.put(f"{NODE}-tessera-gpu-0", NODE)
    api.put("gone-node-tessera-gpu-0", "gone-node")
    api.put("gone-node-other-driver", "gone-node", driver="other.example.com")  # labelled ours, but not
    pub, writes = publisher(api)

    await fill_as_the_watch_does(pub, api)
    assert set(pub.slices) == {NODE, "gone-node"}
    assert list(pub.slices["gone-node"]) == ["gone-node-tessera-gpu-0"], "another driver's slice is not ours"
    await pub.remove_orphans({NODE})

    assert api.deleted == ["gone-node-tessera-gpu-0"]
    assert writes.made == ["resourceslice/delete"]
    assert set(pub.slices) == {NODE}


async def test_after_a_restart_the_same_devices_are_compared_once_and_then_known_to_match() -> None:
    api = FakeSliceApi()
    first, _ = publisher(api)
    await first.publish(NODE, NODE_UID, two_gpus())
    restarted, writes = publisher(api)
    await fill_as_the_watch_does(restarted, api)
    assert all(entry.matches is None for entry in restarted.slices[NODE].values()), "loaded: nothing known yet"

    await restarted.publish(NODE, NODE_UID, two_gpus())

    assert writes.made == [], "what the API holds is what would be written"
    assert all(entry.matches is not None for entry in restarted.slices[NODE].values())
    await restarted.publish(NODE, NODE_UID, [with_drain_taints(g, {"gpu-0"}) for g in two_gpus()])
    assert writes.made == ["resourceslice/update"], "a remembered match does not hide a change"


async def test_someone_elses_change_is_compared_in_full_again() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())
    theirs = copy.deepcopy(api.stored[f"{NODE}-tessera-gpu-1"])
    theirs["spec"]["devices"] = theirs["spec"]["devices"][:1]  # a device removed behind our back
    api.stored[theirs["metadata"]["name"]] = api._store(theirs, theirs["metadata"]["uid"])
    assert pub.seen("MODIFIED", api.stored[theirs["metadata"]["name"]])

    await pub.publish(NODE, NODE_UID, two_gpus())

    assert writes.made[2:] == ["resourceslice/update"]
    assert len(api.stored[f"{NODE}-tessera-gpu-1"]["spec"]["devices"]) == len(two_gpus()[1].devices)


async def test_a_pool_left_with_mixed_generations_is_written_again_though_every_slice_matches() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    three = [*two_gpus(), build_gpu_devices(gpu(2))]
    await pub.publish(NODE, NODE_UID, three)
    changed = [with_drain_taints(g, {d["name"] for d in g.devices}) if g.gpu_index < 2 else g for g in three]
    api.fail_replace = {f"{NODE}-tessera-gpu-2"}  # the new generation's last write fails

    with pytest.raises(ApiError):
        await pub.publish(NODE, NODE_UID, changed)
    generations = {s["spec"]["pool"]["generation"] for s in api.stored.values()}
    assert len(generations) == 2, "gpu-2 holds what it should, but at the old generation"

    await pub.publish(NODE, NODE_UID, changed)

    assert writes.made[-3:] == ["resourceslice/update"] * 3
    assert len({s["spec"]["pool"]["generation"] for s in api.stored.values()}) == 1


async def test_forgetting_a_pool_deletes_its_slices_and_its_cache() -> None:
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())

    await pub.forget(NODE)

    assert api.stored == {}
    assert writes.made[2:] == ["resourceslice/delete", "resourceslice/delete"]
    assert NODE not in pub.slices


async def test_the_echo_of_our_own_write_is_no_change_and_someone_elses_is() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())
    ours = copy.deepcopy(api.stored[f"{NODE}-tessera-gpu-0"])

    assert not pub.seen("MODIFIED", ours), "the same resourceVersion: our own write coming back"

    theirs = copy.deepcopy(ours)
    theirs["metadata"]["resourceVersion"] = "5000"
    theirs["spec"]["devices"] = []
    assert pub.seen("MODIFIED", theirs)
    assert pub.slices[NODE][f"{NODE}-tessera-gpu-0"].body()["spec"]["devices"] == []


async def test_a_deletion_counts_once_and_only_for_a_slice_the_cache_holds() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())
    body = api.stored[f"{NODE}-tessera-gpu-1"]

    assert pub.seen("DELETED", slice_stub(body))  # all a relist keeps of a slice that went
    assert list(pub.slices[NODE]) == [f"{NODE}-tessera-gpu-0"]
    assert not pub.seen("DELETED", slice_stub(body)), "already gone from the cache"


async def test_a_deletion_the_watch_brings_while_we_write_is_not_undone_by_our_answer() -> None:
    """The kubelet wipes a driver's slices when its plugin goes: if that deletion reaches the
    cache while our update is in flight, our (older) answer must not bring the slice back, or
    the next publish would find nothing to write."""
    api = FakeSliceApi()
    pub, writes = publisher(api)
    await pub.publish(NODE, NODE_UID, two_gpus())
    name = f"{NODE}-tessera-gpu-0"
    replace = api.replace_slice

    async def replace_then_wiped(body: dict[str, Any]) -> dict[str, Any]:
        answer = await replace(body)
        pub.seen("MODIFIED", copy.deepcopy(api.stored[name]))  # our echo
        pub.seen("DELETED", slice_stub(api.stored.pop(name)))  # the kubelet's deletion, before our answer
        return answer

    api.replace_slice = replace_then_wiped  # type: ignore[method-assign]
    await pub.publish(NODE, NODE_UID, [with_drain_taints(g, {"gpu-0"}) for g in two_gpus()])
    assert name not in pub.slices[NODE]

    api.replace_slice = replace  # type: ignore[method-assign]
    await pub.publish(NODE, NODE_UID, [with_drain_taints(g, {"gpu-0"}) for g in two_gpus()])
    assert writes.made[-1] == "resourceslice/create", "the next publish puts the slice back"
    assert name in api.stored


async def test_the_cache_holds_each_slice_packed_and_gives_back_what_the_api_sent_without_managed_fields() -> None:
    api = FakeSliceApi()
    pub, _ = publisher(api)
    await pub.publish(NODE, NODE_UID, [build_gpu_devices(mig_gpu(0))])
    stored = api.stored[f"{NODE}-tessera-gpu-0"]
    seen = copy.deepcopy(stored)
    seen["metadata"]["resourceVersion"] = "9999"  # someone else's version, as the watch brings it
    seen["metadata"]["managedFields"] = [{"manager": "someone", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    assert pub.seen("MODIFIED", seen)

    entry = pub.slices[NODE][f"{NODE}-tessera-gpu-0"]
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
    await pub.publish(NODE, NODE_UID, two_gpus())
    replace = api.replace_slice
    told: list[bool] = []

    async def replace_echo_first(body: dict[str, Any]) -> dict[str, Any]:
        answer = await replace(body)
        told.append(pub.seen("MODIFIED", copy.deepcopy(api.stored[body["metadata"]["name"]])))
        return answer

    api.replace_slice = replace_echo_first  # type: ignore[method-assign]
    tainted = [with_drain_taints(g, {"gpu-0"}) for g in two_gpus()]
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
    await pub.publish(NODE, NODE_UID, two_gpus())
    name = f"{NODE}-tessera-gpu-0"
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
    await pub.publish(NODE, NODE_UID, [with_drain_taints(g, {"gpu-0"}) for g in two_gpus()])
    assert replans == [NODE]
    assert pub.slices[NODE][name].resource_version == "9000", "the cache keeps the newest version"
    assert pub.slices[NODE][name].matches is None, "and does not take it for ours"
