"""Minimal writes and pool generations (tessera.dra.diff), against slices as the API returns them."""

from __future__ import annotations

import contextlib
import copy
import itertools
import random
from typing import Any

from tessera.dra.diff import SlicePlan, SliceRef, carry_taint_times, plan_slice_writes, slice_differs
from tessera.dra.slices import NodeRef, build_node_slices
from tessera.models.layout import GpuStatus, Health
from tessera.models.quantity import quantity_value
from tests.dra_gpus import NODE_UID, dynamic_gpu, every_strategy, gpu, mig_gpu, mps_gpu
from tests.dra_limits import validate_pool

NODE = NodeRef("gpu-node-1", NODE_UID)
POOL = NODE.name
GPUS = "gpu-node-1-tessera-gpus"
COUNTERS = "gpu-node-1-tessera-counters"


def dynamic_node() -> list[GpuStatus]:
    """Eight DynamicMIG GPUs: a pool of five slices (counters; GPUs 0-1, 2-3, 4-5, 6-7)."""
    return [dynamic_gpu(i) for i in range(8)]
_counter = itertools.count(100)


class FakeApiserver:
    """Stores slices the way kube-apiserver does: server fields added, taint times stamped,
    quantities in another (equal) spelling, spec changes bump metadata.generation."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes = 0

    def _store(self, body: dict[str, Any], old: dict[str, Any] | None) -> None:
        stored = copy.deepcopy(body)
        meta = stored["metadata"]
        meta["uid"] = old["metadata"]["uid"] if old else f"uid-{next(_counter)}"
        meta["resourceVersion"] = str(next(_counter))
        meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
        meta["managedFields"] = [{"manager": "tessera", "operation": "Update"}]
        changed = old is None or old["spec"] != stored["spec"]
        meta["generation"] = 1 if old is None else old["metadata"]["generation"] + int(changed)
        for device in stored["spec"].get("devices", []):
            for taint in device.get("taints", []):
                taint.setdefault("timeAdded", f"2026-01-01T00:00:{next(_counter) % 60:02d}Z")
            for capacity in device.get("capacity", {}).values():
                if capacity["value"].endswith("Mi"):  # same value, another spelling
                    capacity["value"] = str(int(capacity["value"][:-2]) * 1024 * 1024)
        self.slices[meta["name"]] = stored

    def apply(self, plan: SlicePlan) -> None:
        for ref in plan.deletes:
            assert self.slices[ref.name]["metadata"]["uid"] == ref.uid
            del self.slices[ref.name]
        for body in plan.updates:
            old = self.slices[body["metadata"]["name"]]
            assert body["metadata"]["resourceVersion"] == old["metadata"]["resourceVersion"]
            self._store(body, old)
        for body in plan.creates:
            assert body["metadata"]["name"] not in self.slices
            self._store(body, None)
        self.writes += plan.writes

    def stored(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for _, s in sorted(self.slices.items())]

    def publish(self, gpus: list[GpuStatus], draining: set[str] | None = None) -> SlicePlan:
        plan = plan_slice_writes(POOL, build_node_slices(NODE, gpus, draining or set()), self.stored())
        self.apply(plan)
        assert validate_pool(self.stored()) == []
        return plan


def test_first_publish_creates_every_slice_at_generation_one() -> None:
    api = FakeApiserver()
    plan = api.publish(dynamic_node())
    assert plan.generation == 1
    assert len(plan.creates) == 5
    assert plan.updates == ()
    assert plan.deletes == ()
    assert {s["spec"]["pool"]["generation"] for s in api.stored()} == {1}


def test_publishing_again_with_nothing_new_writes_nothing() -> None:
    api = FakeApiserver()
    gpus = every_strategy()
    api.publish(gpus, {gpus[2].uuid})
    plan = api.publish(gpus, {gpus[2].uuid})
    assert plan.empty
    assert plan.writes == 0


def test_one_gpu_changed_writes_one_slice_and_keeps_the_generation() -> None:
    api = FakeApiserver()
    gpus = every_strategy()
    api.publish(gpus)
    gpus[3] = gpus[3].model_copy(update={"health": Health.UNHEALTHY})
    plan = api.publish(gpus)
    assert plan.generation == 1
    assert [u["metadata"]["name"] for u in plan.updates] == [GPUS]
    assert plan.creates == ()
    assert plan.deletes == ()
    assert {s["spec"]["pool"]["generation"] for s in api.stored()} == {1}


def test_one_gpu_changed_in_a_pool_of_several_slices_writes_only_its_slice() -> None:
    api = FakeApiserver()
    gpus = dynamic_node()
    api.publish(gpus)
    plan = api.publish(gpus, {gpus[3].uuid})
    assert plan.generation == 1
    assert [u["metadata"]["name"] for u in plan.updates] == [f"{GPUS}-01"]
    assert plan.writes == 1


def test_two_gpus_changed_in_one_slice_write_it_once_and_keep_the_generation() -> None:
    api = FakeApiserver()
    gpus = dynamic_node()
    api.publish(gpus)
    plan = api.publish(gpus, {gpus[2].uuid, gpus[3].uuid})
    assert plan.generation == 1
    assert [u["metadata"]["name"] for u in plan.updates] == [f"{GPUS}-01"]


def test_two_slices_changed_bump_the_generation_and_rewrite_the_whole_pool() -> None:
    api = FakeApiserver()
    gpus = dynamic_node()
    api.publish(gpus)
    gpus[0] = gpus[0].model_copy(update={"health": Health.LOST})
    gpus[7] = gpus[7].model_copy(update={"health": Health.LOST})
    plan = api.publish(gpus)
    assert plan.generation == 2
    assert len(plan.updates) == 5
    assert {s["spec"]["pool"]["generation"] for s in api.stored()} == {2}


def test_a_new_gpu_that_fits_the_slice_rewrites_it_alone() -> None:
    api = FakeApiserver()
    api.publish([gpu(0), gpu(1)])
    plan = api.publish([gpu(0), gpu(1), gpu(2)])
    assert plan.generation == 1
    assert [u["metadata"]["name"] for u in plan.updates] == [GPUS]
    assert plan.writes == 1


def test_a_new_slice_bumps_the_generation_and_is_counted_in_every_slice() -> None:
    api = FakeApiserver()
    api.publish([gpu(0), gpu(1)])
    plan = api.publish([gpu(0), gpu(1), dynamic_gpu(2)])
    assert plan.generation == 2
    assert [c["metadata"]["name"] for c in plan.creates] == [COUNTERS]
    assert [u["metadata"]["name"] for u in plan.updates] == [GPUS]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.stored()} == {2}


def test_a_gpu_gone_deletes_its_slices_and_recounts_the_rest() -> None:
    api = FakeApiserver()
    api.publish([gpu(0), dynamic_gpu(1), gpu(2)])
    stored = {s["metadata"]["name"]: s for s in api.stored()}
    plan = api.publish([gpu(0), gpu(2)])
    assert plan.deletes == (SliceRef.of(stored[COUNTERS]),)
    assert plan.deletes[0].uid is not None
    assert plan.deletes[0].resource_version is not None
    assert plan.generation == 2
    assert [s["metadata"]["name"] for s in api.stored()] == [GPUS]
    assert [d["name"] for d in api.stored()[0]["spec"]["devices"]] == ["gpu-0", "gpu-2"]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.stored()} == {1}


def test_a_pool_of_one_slice_per_gpu_is_replaced_by_shared_slices_at_a_new_generation() -> None:
    """An operator from before shared slices left ``<node>-tessera-gpu-<i>``: the first publish
    deletes them and writes the shared slices one generation up, so the scheduler never mixes them."""
    api = FakeApiserver()
    gpus = [gpu(i) for i in range(4)]
    for i, g in enumerate(gpus):
        (old,) = build_node_slices(NODE, [g])
        old["metadata"]["name"] = f"gpu-node-1-tessera-gpu-{i}"
        old["spec"]["pool"].update(generation=3, resourceSliceCount=4)
        api.apply(SlicePlan(3, creates=(old,)))
    plan = api.publish(gpus)
    assert sorted(d.name for d in plan.deletes) == [f"gpu-node-1-tessera-gpu-{i}" for i in range(4)]
    assert [c["metadata"]["name"] for c in plan.creates] == [GPUS]
    assert plan.generation == 4
    assert [d["name"] for d in api.stored()[0]["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_a_strategy_change_within_one_gpu_rewrites_only_that_slice() -> None:
    api = FakeApiserver()
    api.publish([gpu(0), gpu(1)])
    plan = api.publish([gpu(0), mig_gpu(1)])
    assert plan.writes == 1
    assert plan.generation == 1


def test_taint_time_added_by_the_server_is_kept_on_later_writes() -> None:
    api = FakeApiserver()
    gpus = [mig_gpu(0, health=Health.UNHEALTHY), gpu(1)]
    api.publish(gpus)
    stamped = api.stored()[0]["spec"]["devices"][0]["taints"][0]["timeAdded"]
    # Another change to the same slice: the taint keeps its time.
    plan = api.publish(gpus, {gpus[0].mig_instances[0].uuid})
    (update,) = plan.updates
    taints = next(d for d in update["spec"]["devices"] if d["name"] == "gpu-0-mig-1g-10gb-6")["taints"]
    assert taints == [
        {"key": "gpu.tessera.dev/unhealthy", "value": "Unhealthy", "effect": "NoSchedule", "timeAdded": stamped}
    ]
    assert api.publish(gpus, {gpus[0].mig_instances[0].uuid}).empty


def test_a_taint_is_cleared_when_its_cause_goes() -> None:
    api = FakeApiserver()
    g = mig_gpu(0)
    api.publish([g], {g.uuid})
    assert all("taints" in d for d in api.stored()[0]["spec"]["devices"])
    plan = api.publish([g])
    assert plan.writes == 1
    assert all("taints" not in d for d in api.stored()[0]["spec"]["devices"])


def test_server_fields_and_quantity_spelling_do_not_count_as_changes() -> None:
    desired = build_node_slices(NODE, [gpu(0)])[0]
    desired["spec"]["pool"]["generation"] = 4
    stored = copy.deepcopy(desired)
    stored["metadata"].update(uid="u", resourceVersion="9", generation=3, creationTimestamp="2026-01-01T00:00:00Z")
    stored["metadata"]["labels"]["someone-else/label"] = "x"
    stored["spec"]["devices"][0]["capacity"]["memory"]["value"] = str(81559 * 1024 * 1024)
    assert not slice_differs(stored, desired)
    stored["spec"]["devices"][0]["attributes"]["index"] = {"int": 9}
    assert slice_differs(stored, desired)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [path]


def _reference_normal(value: Any, key: str | None = None, in_values: bool = False) -> Any:
    """The comparable form, computed whole: the plain definition the walk in ``slice_differs``
    must agree with (quantities by value, empty and None entries dropped)."""
    if isinstance(value, dict):
        out = {k: _reference_normal(v, k) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_reference_normal(v, key, key == "validValues") for v in value]
    if (key in {"value", "default", "min", "max", "step"} or in_values) and not isinstance(value, bool):
        with contextlib.suppress(ValueError, TypeError):
            return quantity_value(value)
    return value


def _reference_differs(have: dict[str, Any], want: dict[str, Any]) -> bool:
    have = _reference_normal(have)
    wanted = {(str(d["name"]), str(t.get("key"))): t for d in want.get("devices") or [] for t in d.get("taints") or []}
    for device in have.get("devices") or []:
        for taint in device.get("taints") or []:
            if "timeAdded" not in wanted.get((str(device.get("name")), str(taint.get("key"))), {}):
                taint.pop("timeAdded", None)
    return bool(have != _reference_normal(want))


def _respelled(value: Any, rng: random.Random, key: str | None = None) -> Any:
    """``value`` as a server or another writer may give it back: the same quantities spelled
    otherwise, empty entries added, taint times stamped."""
    if isinstance(value, dict):
        out = {k: _respelled(v, rng, k) for k, v in value.items()}
        if rng.random() < 0.05:
            out[rng.choice(["extra", "note"])] = rng.choice([None, {}, []])
        if key == "taints" and rng.random() < 0.7:
            out["timeAdded"] = "2026-12-06T12:00:00Z"
        return out
    if isinstance(value, list):
        return [_respelled(v, rng, key) for v in value]
    if isinstance(value, str) and (key in {"value", "default", "min", "max", "step"} or key == "validValues"):
        with contextlib.suppress(ValueError):  # a taint's value is no quantity
            exact = quantity_value(value)
            if exact.denominator == 1 and rng.random() < 0.5:
                value = rng.choice([str(int(exact)), f"{int(exact) * 1000}m"])
    return value


def _one_changed(spec: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``spec`` with one leaf, chosen at random, replaced by something else."""
    changed = copy.deepcopy(spec)
    path = rng.choice(_leaves(changed))
    parent = changed
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = rng.choice([None, "9", 9, True, {"x": 1}, [], f"9{parent[path[-1]]}"])
    return changed


def test_the_comparison_agrees_with_normalising_everything() -> None:
    """Seeded: every strategy's slices, drained and not, against respelled, stamped and now and
    then changed copies of themselves, either way round: ``slice_differs`` says what comparing
    the whole normal forms says."""
    rng = random.Random(2212)
    gpus = [*every_strategy(), mps_gpu(8, values=[10, 25, 50, 100])]
    built = build_node_slices(NODE, gpus) + build_node_slices(NODE, gpus, {gpus[1].uuid, gpus[3].uuid})
    seen = {True: 0, False: 0}
    for _ in range(300):
        want = rng.choice(built)
        have = {**want, "spec": _respelled(want["spec"], rng)}
        if rng.random() < 0.5:
            have["spec"] = _one_changed(have["spec"], rng)
        if rng.random() < 0.2:  # the built side with times too (a taint we carry over)
            want = {**want, "spec": _respelled(want["spec"], random.Random(rng.random()))}
        expected = _reference_differs(have["spec"], want["spec"])
        assert slice_differs(have, want) is expected
        seen[expected] += 1
    assert min(seen.values()) > 30, seen  # both answers were put to the test


def test_a_lost_owner_reference_or_label_is_written_back() -> None:
    desired = build_node_slices(NODE, [gpu(0)])[0]
    no_owner = copy.deepcopy(desired)
    no_owner["metadata"]["ownerReferences"] = []
    assert slice_differs(no_owner, desired)
    no_label = copy.deepcopy(desired)
    no_label["metadata"]["labels"] = {}
    assert slice_differs(no_label, desired)


def test_update_keeps_labels_of_others_and_sets_the_resource_version() -> None:
    api = FakeApiserver()
    api.publish([gpu(0)])
    api.slices[GPUS]["metadata"]["labels"]["team"] = "ml"
    plan = api.publish([gpu(0, health=Health.UNHEALTHY)])
    (update,) = plan.updates
    assert update["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "tessera", "team": "ml"}
    assert update["metadata"]["resourceVersion"]


def test_a_slice_left_at_an_older_generation_is_brought_up_alone() -> None:
    api = FakeApiserver()
    gpus = dynamic_node()
    api.publish(gpus)
    api.publish(gpus, {gpus[0].uuid, gpus[7].uuid})  # generation 2
    api.slices[f"{GPUS}-01"]["spec"]["pool"]["generation"] = 1  # a write that never landed
    plan = api.publish(gpus, {gpus[0].uuid, gpus[7].uuid})
    assert plan.generation == 2
    assert [u["metadata"]["name"] for u in plan.updates] == [f"{GPUS}-01"]


def test_slices_of_other_pools_and_drivers_are_left_alone() -> None:
    other_node = build_node_slices(NodeRef("other", NODE_UID), [gpu(0)])
    other_driver = copy.deepcopy(build_node_slices(NODE, [gpu(5)]))
    other_driver[0]["spec"]["driver"] = "gpu.nvidia.com"
    plan = plan_slice_writes(POOL, [], other_node + other_driver)
    assert plan.empty


def test_unknown_slices_of_our_pool_are_deleted() -> None:
    api = FakeApiserver()
    api.publish([gpu(0)])
    stray = copy.deepcopy(api.stored()[0])
    stray["metadata"]["name"] = "gpu-node-1-old-naming"
    api.slices["gpu-node-1-old-naming"] = stray
    plan = api.publish([gpu(0)])
    assert [d.name for d in plan.deletes] == ["gpu-node-1-old-naming"]


def test_no_gpus_left_deletes_the_whole_pool() -> None:
    api = FakeApiserver()
    api.publish([gpu(0), dynamic_gpu(1)])
    plan = api.publish([])
    assert len(plan.deletes) == 2
    assert api.stored() == []


def test_carry_taint_times_without_an_existing_slice_changes_nothing() -> None:
    desired = build_node_slices(NODE, [gpu(0, health=Health.LOST)])[0]
    assert carry_taint_times(desired, None) == desired


def test_a_long_series_of_changes_never_leaves_a_mixed_or_miscounted_pool() -> None:
    api = FakeApiserver()
    layouts: list[list[GpuStatus]] = [
        every_strategy(),
        every_strategy()[:5],
        [gpu(0), mig_gpu(1), dynamic_gpu(2)],
        [gpu(0, health=Health.LOST), mig_gpu(1), dynamic_gpu(2)],
        [gpu(0), mig_gpu(1), gpu(2)],
        [gpu(0), mig_gpu(1), gpu(2)],
        every_strategy(),
    ]
    for gpus in layouts:
        api.publish(gpus)
        stored = api.stored()
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {len(stored)}
        assert len({s["spec"]["pool"]["generation"] for s in stored}) == 1
        assert plan_slice_writes(POOL, build_node_slices(NODE, gpus), stored).empty
