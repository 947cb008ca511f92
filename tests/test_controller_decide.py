"""Deciding one node: the NodeLayout.spec to write, which GPUs drain before their layout
changes, for how long, and which Pods an ``Evict`` drain removes. Plain values in, plain
values out: a Fleet as the watch events fill it and a clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tessera.controller import decide as decide_module
from tessera.controller.decide import NodeDecision, affected_devices, decide_node, published_device_names
from tessera.controller.state import Fleet, claim_hold
from tessera.dra.devices import build_gpu_devices
from tessera.models.layout import GpuLayout, GpuStatus, Health, PlacedInstance
from tessera.models.policy import ShareStrategy, Strategy, TimeSlicingSpec
from tessera.planner import PlanErrorReason
from tests.controller_fleet import NODE, applied, claim_body, fleet_of, layout_of, policy_body
from tests.dra_gpus import dynamic_gpu, gpu, instance, mig_gpu, mps_gpu, time_sliced_gpu

H100 = "H100-80GB"
MIG_3G_X2 = {"strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}}
MIG_1G_X7 = {"strategy": "MIG", "mig": {"profiles": {"1g.10gb": 7}}}
TIME_SLICED = {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}}


def _placed(*instances: tuple[str, int]) -> list[PlacedInstance]:
    return [PlacedInstance(profile=p, start=s) for p, s in instances]


def _mig(uuid: str, policy: str, *instances: tuple[str, int]) -> GpuLayout:
    return GpuLayout(uuid=uuid, policy=policy, strategy=Strategy.MIG, mig_instances=_placed(*instances))


def _handed_over(fleet: Fleet) -> dict[str, frozenset[str]]:
    """Every published device of the node, as the runtime reports them once it has tainted
    them and read the claims again (the handover done)."""
    layout = fleet.nodes[NODE].layout
    assert layout is not None
    gpus = layout.status.gpus if layout.status is not None else []
    return {g.uuid: published_device_names(g) for g in gpus}


def _decide(
    fleet: Fleet, now: float = 1000.0, previous: NodeDecision | None = None, handed_over: bool = True
) -> NodeDecision:
    """The decision once the runtime has handed every published device over (or, with
    ``handed_over=False``, before it has)."""
    cleared = _handed_over(fleet) if handed_over else None
    decision = decide_node(fleet, NODE, now, previous.drains if previous is not None else None, cleared)
    assert decision is not None
    return decision


def _current_spec(fleet: Fleet) -> Any:
    layout = fleet.nodes[NODE].layout
    assert layout is not None
    return layout.spec


# -- no agent, no decision ---------------------------------------------------------------


def test_a_node_without_a_layout_gets_no_decision() -> None:
    fleet = Fleet()
    fleet.set_node({"metadata": {"name": NODE, "labels": {}}})

    assert decide_node(fleet, NODE, 0.0) is None
    assert decide_node(fleet, "unknown-node", 0.0) is None


# -- planning ----------------------------------------------------------------------------------


def test_a_new_policy_writes_the_planned_spec() -> None:
    fleet = fleet_of([gpu(1), gpu(0)], policies=[policy_body("mig", **MIG_3G_X2)])

    decision = _decide(fleet)

    want = [_mig(gpu(i).uuid, "mig", ("3g.40gb", 0), ("3g.40gb", 4)) for i in (0, 1)]
    assert decision.spec.gpus == want  # sorted by UUID
    assert [(g.index, g.policy, g.settled) for g in decision.gpus] == [(0, "mig", True), (1, "mig", True)]
    assert decision.drains == {}
    assert decision.evict == ()


def test_a_gpu_no_policy_selects_is_unmanaged_and_left_exactly_as_it_is() -> None:
    # Installed on a node whose GPU was partitioned by hand: nothing is written for it.
    policy = policy_body("pool-a", nodeSelector={"matchLabels": {"pool": "a"}}, **TIME_SLICED)
    fleet = fleet_of([mig_gpu(0)], policies=[policy], labels={"pool": "b"})

    decision = _decide(fleet, handed_over=False)

    assert decision.spec.gpus == [], "no spec entry: the agent leaves the GPU alone"
    assert decision.gpus[0].policy is None
    assert decision.drains == {}
    assert decision.draining_devices == frozenset()
    assert decision.gpus[0].written is None


def test_deleting_a_policy_leaves_its_layout_in_place_without_the_policy() -> None:
    status = mig_gpu(0)
    fleet = fleet_of([status], [layout_of(status, "gone")], claims=[claim_body("c", ["gpu-0-mig-3g-40gb-0"])])

    decision = _decide(fleet, handed_over=False)

    assert decision.spec.gpus == [layout_of(status, None)], "same layout, no policy: nothing on the GPU changes"
    assert decision.drains == {}
    assert decision.draining_devices == frozenset()


def test_a_policy_that_later_selects_an_unmanaged_gpu_takes_it_over_through_the_handover() -> None:
    status = mig_gpu(0)
    fleet = fleet_of([status], policies=[policy_body("take", **MIG_1G_X7)])

    before = _decide(fleet, handed_over=False)

    assert before.spec.gpus == [], "nothing is written before the changing devices are handed over"
    drain = before.gpus[0].drain
    assert drain is not None
    assert drain.claims == ()
    assert "gpu-0-mig-3g-40gb-0" in before.draining_devices, "the 3g the 1g layout replaces is tainted first"
    assert before.draining_devices == drain.devices <= published_device_names(status)
    after = _decide(fleet, previous=before)
    assert after.spec.gpus[0].policy == "take"


def test_the_spec_follows_the_node_labels() -> None:
    policy = policy_body("pool-a", nodeSelector={"matchLabels": {"pool": "a"}}, **TIME_SLICED)
    fleet = fleet_of([gpu(0)], policies=[policy], labels={"pool": "b"})
    fleet.set_node({"metadata": {"name": NODE, "labels": {"pool": "a"}}})

    decision = _decide(fleet)

    assert decision.spec.gpus[0].strategy is Strategy.TIME_SLICING
    assert decision.spec.gpus[0].time_slicing == TimeSlicingSpec(replicas=4)


def test_the_same_input_gives_the_same_decision() -> None:
    gpus = [mig_gpu(0), gpu(1), gpu(2)]
    spec = [layout_of(mig_gpu(0), "old"), layout_of(gpu(1), "old")]
    third_gpu = {"cel": 'device.attributes["gpu.tessera.dev"].index == 2'}
    policies = [
        policy_body("mig", **MIG_1G_X7),
        policy_body("third", priority=1, gpuSelector=third_gpu, **TIME_SLICED),
    ]
    claims = [
        claim_body("a", ["gpu-0-mig-3g-40gb-0"], pods=["p1"]),
        claim_body("b", ["gpu-1"], pods=["p2", "p3"]),
    ]
    one = fleet_of(gpus, spec, policies=policies, claims=claims)
    other = fleet_of(gpus[::-1], spec[::-1], policies=policies[::-1], claims=claims[::-1])

    first, again, reordered = _decide(one, 5000.0), _decide(one, 5000.0), _decide(other, 5000.0)

    for decision in (again, reordered):
        assert decision.spec == first.spec
        assert decision.spec.to_kube() == first.spec.to_kube()
        assert decision.gpus == first.gpus
        assert decision.evict == first.evict
    # the input is not trivial: both held GPUs drain, the third GPU goes to the other policy
    assert len(first.drains) == 2
    assert [g.policy for g in first.gpus] == ["mig", "mig", "third"]
    assert len(first.plan.conflicts) == 1


def test_a_restart_writes_nothing_when_nothing_changed() -> None:
    """The first decision after a restart (no previous drains) of a node whose agent applied
    the spec, with claims on devices the layout keeps and a GPU still draining."""
    policies = [policy_body("mig", **MIG_3G_X2)]
    target = [_mig(gpu(i).uuid, "mig", ("3g.40gb", 0), ("3g.40gb", 4)) for i in (0, 1)]
    draining_spec = layout_of(gpu(1), None)  # written before the policy came
    gpus = [applied(gpu(0, model=H100), target[0]), gpu(1)]
    claims = [
        claim_body("kept", ["gpu-0-mig-3g-40gb-0"], pods=["p1"]),
        claim_body("blocking", ["gpu-1"], pods=["p2"]),
    ]
    fleet = fleet_of(gpus, [target[0], draining_spec], policies=policies, claims=claims)

    decision = _decide(fleet)

    assert decision.spec == _current_spec(fleet)
    assert decision.gpus[0].settled
    assert set(decision.drains) == {gpu(1).uuid}


@pytest.mark.parametrize(
    "spec",
    [
        MIG_3G_X2,
        MIG_1G_X7,
        {"strategy": "MIG", "mig": {"preset": "all-balanced", "sharing": {"strategy": "MPS"}}},
        TIME_SLICED,
        {"strategy": "MPS", "mps": {"memory": {"default": "10Gi"}}},
        {"strategy": "DynamicMIG"},
        {"strategy": "Exclusive"},
    ],
    ids=lambda s: str(s["strategy"]) + ("-shared" if "sharing" in str(s) else ""),
)
def test_a_layout_once_applied_is_planned_again_unchanged(spec: dict[str, Any]) -> None:
    policies = [policy_body("p", **spec)]
    first = _decide(fleet_of([gpu(0), mig_gpu(1)], policies=policies))
    status = [applied(g, first.spec.gpus[i]) for i, g in enumerate([gpu(0), mig_gpu(1)])]

    again = _decide(fleet_of(status, first.spec.gpus, policies=policies, generation=2, observed_generation=2))

    assert again.spec == first.spec
    assert all(g.settled for g in again.gpus)
    assert again.draining_devices == frozenset(), "an applied layout leaves nothing tainted"


# -- drains -----------------------------------------------------------------------------------


def test_an_allocated_mig_instance_the_new_layout_keeps_needs_no_drain() -> None:
    current = layout_of(mig_gpu(0), "old")
    fleet = fleet_of(
        [mig_gpu(0)],
        [current],
        policies=[policy_body("mig", **MIG_3G_X2)],
        claims=[claim_body("c", ["gpu-0-mig-3g-40gb-0"], pods=["p"])],
    )

    decision = _decide(fleet)

    assert decision.spec.gpus == [_mig(mig_gpu(0).uuid, "mig", ("3g.40gb", 0), ("3g.40gb", 4))]
    assert decision.drains == {}
    assert decision.gpus[0].settled
    # No drain, but until the agent has applied the new layout the instances it drops are
    # tainted, so no new claim lands on them; the allocated 3g instance is kept and not tainted.
    published = published_device_names(mig_gpu(0))
    kept = {"gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4"}
    assert decision.draining_devices == published - kept
    assert "gpu-0-mig-3g-40gb-0" not in decision.draining_devices


def test_a_strategy_change_drains_an_allocated_whole_gpu_and_keeps_its_old_spec() -> None:
    old = [layout_of(gpu(0), "whole"), layout_of(gpu(1), "whole")]
    fleet = fleet_of(
        [gpu(0), gpu(1)],
        old,
        policies=[policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("train", ["gpu-0"], namespace="ml", pods=["trainer"])],
    )

    decision = _decide(fleet, now=42.0)

    held, free = decision.gpus
    assert held.written == old[0]
    assert held.target is not None
    assert held.target.strategy is Strategy.TIME_SLICING
    assert not held.settled
    drain = held.drain
    assert drain is not None
    assert (drain.node, drain.gpu_uuid, drain.gpu_index, drain.policy) == (NODE, gpu(0).uuid, 0, "shared")
    assert drain.target == held.target
    assert drain.devices == frozenset({"gpu-0"})
    assert drain.claims == ("ml/train",)
    assert (drain.since, drain.timed_out) == (42.0, False)
    assert drain.describe() == f"1 claim on {NODE} GPU 0"
    # the other GPU does not wait for it
    assert free.settled
    assert decision.spec.gpus == [old[0], free.target]
    assert decision.drains == {gpu(0).uuid: drain}
    # gpu-0 drains; gpu-1 is tainted only while the agent has not applied its written layout
    assert decision.draining_devices == frozenset({"gpu-0", "gpu-1"})
    assert free.changing == frozenset({"gpu-1"})


def test_a_drain_names_every_claim_that_holds_a_changing_device() -> None:
    fleet = fleet_of(
        [time_sliced_gpu(0)],
        [layout_of(time_sliced_gpu(0), "shared")],
        policies=[policy_body("shared", strategy="TimeSlicing", timeSlicing={"replicas": 8})],
        claims=[claim_body(f"c{i}", ["gpu-0"]) for i in (2, 1, 3)],
    )

    drain = _decide(fleet).gpus[0].drain

    assert drain is not None
    assert drain.claims == ("default/c1", "default/c2", "default/c3")
    assert drain.describe() == f"3 claims on {NODE} GPU 0"


def test_a_gpu_blocked_by_an_instance_in_use_drains_towards_the_when_idle_layout() -> None:
    current = layout_of(mig_gpu(0), "old")
    fleet = fleet_of(
        [mig_gpu(0)],
        [current],
        policies=[policy_body("small", **MIG_1G_X7)],
        claims=[claim_body("c", ["gpu-0-mig-3g-40gb-0"])],
    )

    decision = _decide(fleet)

    (plan,) = decision.plan.for_node(NODE)
    assert plan.layout is None
    assert plan.error is not None
    assert plan.error.reason is PlanErrorReason.BLOCKED
    assert plan.error.when_idle is not None
    (g,) = decision.gpus
    assert g.error is None  # blocked is not a failure: it waits
    assert g.target == plan.error.when_idle
    assert g.target == _mig(mig_gpu(0).uuid, "small", *[("1g.10gb", s) for s in range(7)])
    assert g.written == current
    assert g.drain is not None
    # the 3g and 2g instances go; the 1g at slice 6 stays and is not tainted
    assert g.drain.devices == frozenset({"gpu-0-mig-3g-40gb-0", "gpu-0-mig-2g-20gb-4"})
    assert g.drain.claims == ("default/c",)


def test_claims_on_devices_the_new_layout_keeps_do_not_hold_a_drain() -> None:
    fleet = fleet_of(
        [mig_gpu(0)],
        [layout_of(mig_gpu(0), "old")],
        policies=[policy_body("small", **MIG_1G_X7)],
        claims=[claim_body("stays", ["gpu-0-mig-1g-10gb-6"], pods=["p"])],
    )

    decision = _decide(fleet)

    assert decision.drains == {}
    assert decision.spec.gpus == [_mig(mig_gpu(0).uuid, "small", *[("1g.10gb", s) for s in range(7)])]


def test_allocations_on_other_nodes_do_not_hold_this_node() -> None:
    fleet = fleet_of(
        [gpu(0)],
        [layout_of(gpu(0))],
        policies=[policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("elsewhere", [("node-2", "gpu-0")])],
    )

    decision = _decide(fleet)

    assert decision.drains == {}
    assert decision.gpus[0].settled


def test_a_drain_from_dynamic_mig_names_every_published_partition() -> None:
    status = dynamic_gpu(0, mig_instances=[instance(H100, "3g.40gb", 0, dynamic=True)])
    fleet = fleet_of(
        [status],
        [layout_of(status, "dyn")],
        policies=[policy_body("static", **MIG_3G_X2)],
        claims=[claim_body("c", ["gpu-0-dyn-3g-40gb-0"])],
    )

    (g,) = _decide(fleet).gpus

    assert g.drain is not None
    assert g.drain.devices == published_device_names(status)
    assert g.written == layout_of(status, "dyn")


def test_drain_since_is_carried_over_while_the_target_stays() -> None:
    fleet = fleet_of(
        [gpu(0)],
        [layout_of(gpu(0))],
        policies=[policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-0"])],
    )
    first = _decide(fleet, now=100.0)
    fleet.set_claim(claim_body("d", ["gpu-0"]))  # more claims come; the target is the same

    later = _decide(fleet, now=250.0, previous=first)

    drain = later.gpus[0].drain
    assert drain is not None
    assert drain.since == 100.0
    assert drain.claims == ("default/c", "default/d")


def test_drain_since_restarts_when_the_target_changes() -> None:
    fleet = fleet_of(
        [gpu(0)],
        [layout_of(gpu(0))],
        policies=[policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-0"])],
    )
    first = _decide(fleet, now=100.0)
    fleet.set_policy(policy_body("shared", generation=2, strategy="TimeSlicing", timeSlicing={"replicas": 8}))

    later = _decide(fleet, now=250.0, previous=first)

    drain = later.gpus[0].drain
    assert drain is not None
    assert drain.target.time_slicing == TimeSlicingSpec(replicas=8)
    assert drain.since == 250.0


def test_drain_since_is_not_taken_from_another_gpu() -> None:
    fleet = fleet_of(
        [gpu(0), gpu(1)],
        [layout_of(gpu(0)), layout_of(gpu(1))],
        policies=[policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-0"])],
    )
    first = _decide(fleet, now=100.0)
    fleet.set_claim(claim_body("d", ["gpu-1"]))

    later = _decide(fleet, now=250.0, previous=first)

    assert {uuid: d.since for uuid, d in later.drains.items()} == {gpu(0).uuid: 100.0, gpu(1).uuid: 250.0}


@pytest.mark.parametrize(("waited", "timed_out"), [(0.0, False), (599.0, False), (600.0, True), (7200.0, True)])
def test_a_drain_times_out_after_the_policy_drain_timeout(waited: float, timed_out: bool) -> None:
    fleet = fleet_of(
        [gpu(0)],
        [layout_of(gpu(0))],
        policies=[policy_body("shared", drain={"timeout": "10m"}, **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-0"])],
    )
    first = _decide(fleet, now=100.0)

    drain = _decide(fleet, now=100.0 + waited, previous=first).gpus[0].drain

    assert drain is not None
    assert drain.timed_out is timed_out


def test_a_claimless_handover_never_times_out_into_a_drain_timeout() -> None:
    fleet = fleet_of([gpu(0)], [layout_of(gpu(0))], policies=[policy_body("shared", **TIME_SLICED)])
    first = _decide(fleet, now=0.0, handed_over=False)

    later = _decide(fleet, now=1e6, previous=first, handed_over=False)

    drain = later.gpus[0].drain
    assert drain is not None
    assert drain.claims == ()
    assert not drain.timed_out
    assert later.evict == ()


# -- the handover: taint, re-read claims, only then write -----------------------------------


def test_a_change_is_not_written_before_its_devices_are_handed_over() -> None:
    fleet = fleet_of([gpu(0)], [layout_of(gpu(0))], policies=[policy_body("mig", **MIG_3G_X2)])

    decision = _decide(fleet, handed_over=False)

    assert decision.spec == _current_spec(fleet), "the old layout stays in the spec"
    assert decision.draining_devices == {"gpu-0"}, "the device that will change is tainted first"
    drain = decision.gpus[0].drain
    assert drain is not None
    assert drain.claims == ()


def test_a_claim_the_fresh_read_sees_stops_the_write_although_the_watch_has_not_seen_it() -> None:
    fleet = fleet_of([gpu(0)], [layout_of(gpu(0))], policies=[policy_body("mig", **MIG_3G_X2)])
    allocated_meanwhile = claim_hold(claim_body("raced", ["gpu-0"], pods=["p"]))
    assert allocated_meanwhile is not None

    decision = decide_node(fleet, NODE, 0.0, None, _handed_over(fleet), [allocated_meanwhile])

    assert decision is not None
    assert decision.spec == _current_spec(fleet)
    drain = decision.gpus[0].drain
    assert drain is not None
    assert drain.claims == ("default/raced",)


def test_devices_handed_over_must_cover_every_device_the_change_touches() -> None:
    status = mig_gpu(0)
    fleet = fleet_of([status], [layout_of(status)], policies=[policy_body("small", **MIG_1G_X7)])
    changing = _decide(fleet, handed_over=False).draining_devices
    assert len(changing) >= 2
    partly = {status.uuid: frozenset(sorted(changing)[1:])}

    decision = decide_node(fleet, NODE, 0.0, None, partly)

    assert decision is not None
    assert decision.spec == _current_spec(fleet), "one device not handed over is enough to wait"
    assert decision.draining_devices == changing
    assert _decide(fleet).spec != _current_spec(fleet), "with all of them handed over it is written"


def test_a_change_that_touches_no_published_device_needs_no_handover() -> None:
    status = gpu(0, Strategy.MIG, mig_mode_current=True, mig_instances=[instance(H100, "3g.40gb", 0)])
    fleet = fleet_of([status], [layout_of(status, "mig")], policies=[policy_body("mig", **MIG_3G_X2)])

    decision = _decide(fleet, handed_over=False)

    assert [i.start for i in decision.spec.gpus[0].mig_instances] == [0, 4], "adding into free slices is safe"
    assert decision.drains == {}


def _evict_fleet(mode: str) -> Fleet:
    """MIG 3g+2g+1g going to 7 x 1g: a claim on the 3g blocks it, one on the 1g it keeps does not."""
    return fleet_of(
        [mig_gpu(0)],
        [layout_of(mig_gpu(0), "old")],
        policies=[policy_body("small", drain={"mode": mode, "timeout": "5m"}, **MIG_1G_X7)],
        claims=[
            claim_body("blocking", ["gpu-0-mig-3g-40gb-0"], namespace="ml", pods=["w-2", "w-1"]),
            claim_body("kept", ["gpu-0-mig-1g-10gb-6"], namespace="ml", pods=["other"]),
        ],
    )


def test_evict_mode_lists_the_reserved_pods_only_after_the_timeout() -> None:
    fleet = _evict_fleet("Evict")
    first = _decide(fleet, now=0.0)
    before = _decide(fleet, now=299.0, previous=first)

    after = _decide(fleet, now=300.0, previous=first)

    assert first.evict == before.evict == ()
    assert after.evict == (("ml", "w-1"), ("ml", "w-2"))  # not the Pod of the claim the layout keeps


def test_wait_mode_never_evicts() -> None:
    fleet = _evict_fleet("Wait")
    first = _decide(fleet, now=0.0)

    later = _decide(fleet, now=1e9, previous=first)

    drain = later.gpus[0].drain
    assert drain is not None
    assert drain.timed_out
    assert later.evict == ()


def test_the_drain_ends_and_the_spec_gets_the_target_when_the_claim_goes() -> None:
    fleet = _evict_fleet("Wait")
    first = _decide(fleet, now=0.0)
    assert first.gpus[0].drain is not None
    fleet.remove_claim("ml", "blocking")

    released = _decide(fleet, now=10.0, previous=first)

    (g,) = released.gpus
    assert g.drain is None
    assert g.settled
    assert released.spec.gpus == [first.gpus[0].target]
    assert released.evict == ()


def test_a_drain_is_called_off_when_the_policy_goes_back_to_the_current_layout() -> None:
    fleet = fleet_of(
        [gpu(0)],
        [layout_of(gpu(0), "whole")],
        policies=[policy_body("whole", generation=2, **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-0"])],
    )
    first = _decide(fleet)
    assert first.gpus[0].drain is not None
    fleet.set_policy(policy_body("whole", generation=3))

    back = _decide(fleet, previous=first)

    assert back.drains == {}
    assert back.gpus[0].settled
    assert back.spec == _current_spec(fleet)


def test_a_deallocated_claim_releases_the_drain_too() -> None:
    fleet = fleet_of(
        [gpu(0)],
        [layout_of(gpu(0))],
        policies=[policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-0"])],
    )
    first = _decide(fleet)
    fleet.set_claim(claim_body("c"))  # the scheduler deallocated it; the claim object stays

    released = _decide(fleet, previous=first)

    assert released.drains == {}
    assert released.spec.gpus == [first.gpus[0].target]


# -- plan errors ---------------------------------------------------------------------------


def test_a_gpu_with_a_plan_error_keeps_its_current_spec() -> None:
    current = layout_of(mig_gpu(0), "old")
    fleet = fleet_of(
        [mig_gpu(0), gpu(1)],
        [current],
        policies=[policy_body("too-big", strategy="MIG", mig={"profiles": {"3g.40gb": 3}})],
    )

    decision = _decide(fleet)

    failed, unspecified = decision.gpus
    assert failed.target is None
    assert failed.written == current
    assert failed.error is not None
    assert "do not fit" in failed.error
    assert not failed.settled
    assert unspecified.written is None  # no spec before, none now: the agent leaves it alone
    assert decision.spec.gpus == [current]
    assert decision.drains == {}


def test_a_plan_error_on_one_gpu_does_not_hold_back_the_others() -> None:
    l4 = GpuStatus(uuid="GPU-l4", index=1, product_name="NVIDIA L4", memory_mib=23034)
    fleet = fleet_of([gpu(0), l4], policies=[policy_body("mig", **MIG_3G_X2)])

    decision = _decide(fleet)

    ok, failed = decision.gpus
    assert ok.settled
    assert failed.error is not None
    assert "NVIDIA L4" in failed.error
    assert [g.uuid for g in decision.spec.gpus] == [gpu(0).uuid]


# -- affected_devices, published_device_names ----------------------------------------------


def test_published_device_names_follow_the_strategy_the_gpu_has() -> None:
    assert published_device_names(gpu(0)) == {"gpu-0"}
    assert published_device_names(time_sliced_gpu(1)) == {"gpu-1"}
    assert published_device_names(mps_gpu(2)) == {"gpu-2"}
    assert published_device_names(mig_gpu(3)) == {
        "gpu-3-mig-3g-40gb-0",
        "gpu-3-mig-2g-20gb-4",
        "gpu-3-mig-1g-10gb-6",
    }
    dynamic = published_device_names(dynamic_gpu(4))
    assert "gpu-4-dyn-7g-80gb-0" in dynamic
    assert all(name.startswith("gpu-4-dyn-") for name in dynamic)


def _affected(status: Any, target: GpuLayout) -> frozenset[str]:
    return affected_devices(status, published_device_names(status), target)


def test_a_strategy_change_affects_every_published_device() -> None:
    status = mig_gpu(0)

    assert _affected(status, GpuLayout(uuid=status.uuid, strategy=Strategy.EXCLUSIVE)) == published_device_names(status)


def test_a_change_of_sharing_affects_every_device() -> None:
    status = mig_gpu(0)
    shared = layout_of(status).model_copy(update={"mig_sharing": ShareStrategy.MPS, "mps": mps_gpu(0).mps})
    assert _affected(status, shared) == published_device_names(status)

    sliced = time_sliced_gpu(0, replicas=4)
    assert _affected(sliced, layout_of(time_sliced_gpu(0, replicas=8))) == {"gpu-0"}


def test_within_static_mig_only_dropped_instances_are_affected() -> None:
    status = mig_gpu(0)
    target = _mig(status.uuid, "p", ("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6))

    assert _affected(status, target) == {"gpu-0-mig-2g-20gb-4"}


@pytest.mark.parametrize(
    ("status", "target"),
    [
        (gpu(0), GpuLayout(uuid=gpu(0).uuid, policy="renamed")),
        (time_sliced_gpu(0), layout_of(time_sliced_gpu(0), "renamed")),
        (mig_gpu(0), layout_of(mig_gpu(0), "renamed")),
        (dynamic_gpu(0), GpuLayout(uuid=dynamic_gpu(0).uuid, policy="renamed", strategy=Strategy.DYNAMIC_MIG)),
    ],
    ids=["exclusive", "time-slicing", "mig", "dynamic-mig"],
)
def test_a_layout_that_only_changes_the_policy_name_affects_nothing(status: Any, target: GpuLayout) -> None:
    assert _affected(status, target) == frozenset()


# -- the devices a decision carries to the publisher ------------------------------------------


def test_a_decision_carries_each_gpus_devices_built_once_in_the_status_order(monkeypatch: pytest.MonkeyPatch) -> None:
    statuses = [mig_gpu(1), gpu(0), dynamic_gpu(2)]
    fleet = fleet_of(statuses, policies=[policy_body("take", **MIG_1G_X7)])
    built: list[str] = []
    real = decide_module.build_gpu_devices

    def counting(status: GpuStatus, draining: Any = ()) -> Any:
        built.append(status.uuid)
        return real(status, draining)

    monkeypatch.setattr(decide_module, "build_gpu_devices", counting)
    decision = _decide(fleet, handed_over=False)

    assert built == [s.uuid for s in statuses], "each GPU's devices are built once per decision"
    assert [d.gpu_uuid for d in decision.devices] == [s.uuid for s in statuses]
    assert all("taints" not in d for g in decision.devices for d in g.devices), "built untainted"


def test_the_devices_to_publish_are_what_building_them_with_the_decisions_drains_gives() -> None:
    statuses = [mig_gpu(0), gpu(1, health=Health.UNHEALTHY), time_sliced_gpu(2), dynamic_gpu(3)]
    fleet = fleet_of(
        statuses,
        [layout_of(statuses[2], "shared")],
        policies=[policy_body("take", **MIG_1G_X7), policy_body("shared", **TIME_SLICED)],
        claims=[claim_body("c", ["gpu-2"])],
    )

    decision = _decide(fleet, handed_over=False)

    assert "gpu-1" in decision.draining_devices, "a drain on an unhealthy GPU (both taints) among others"
    assert decision.devices_to_publish() == [build_gpu_devices(s, decision.draining_devices) for s in statuses]
    (unhealthy,) = decision.devices_to_publish()[1].devices
    assert [t["key"] for t in unhealthy["taints"]] == ["gpu.tessera.dev/unhealthy", "tessera.dev/repartition"]


def test_a_decision_counts_the_devices_each_gpu_publishes_for_the_policy_status() -> None:
    fleet = fleet_of([mig_gpu(0), gpu(1)])

    decision = _decide(fleet, handed_over=False)

    assert decision.devices_of(mig_gpu(0).uuid) == len(published_device_names(mig_gpu(0))) > 1
    assert decision.devices_of(gpu(1).uuid) == 1
    assert decision.devices_of("GPU-not-on-this-node") == 0
    carried_out = replace(decision, devices=())  # what the operator keeps once it has published them
    assert carried_out.devices_of(gpu(1).uuid) == 1
