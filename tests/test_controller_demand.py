"""The operator's adaptive demand loop on a real Fleet and real decisions (no API server):
which claims count as pending, what a pass recuts, the cap, the one Warning, cooldown and the
return to the idle layout, and what the policy status says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tessera.adaptive.layouts import status_after
from tessera.controller.decide import NodeDecision, decide_node
from tessera.controller.demand import AdaptiveDemand, pod_claims, unschedulable
from tessera.controller.state import Fleet
from tessera.dra.devices import RESERVED_TAINT_KEY
from tessera.models.policy import SharingPolicyStatus
from tests.controller_fleet import NODE, claim_body, layout_body, node_body, policy_body
from tests.dra_gpus import gpu
from tests.fakeclock import FakeClock

ADAPTIVE = {
    "strategy": "Adaptive",
    "adaptive": {
        "layouts": [{"name": "whole"}, {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}}],
        "idle": "whole",
        "cooldown": "60s",
        "maxRecuts": 1,
        "pendingAfter": "5s",
    },
}
THREE_G = 'device.attributes["gpu.tessera.dev"].migProfile == "3g.40gb"'


class View:
    """The Controller as the demand loop sees it: a fleet, its decisions, a queue."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.decisions: dict[str, NodeDecision] = {}
        self.enqueued: list[str] = []

    def enqueue(self, *nodes: str) -> None:
        self.enqueued.extend(nodes)

    def decide(self) -> None:
        """Decide the node and write the spec, as a reconcile does (the handover is immediate:
        no claim holds a device here unless a test says so)."""
        decision = decide_node(self.fleet, NODE, 0.0)
        assert decision is not None
        view = self.fleet.nodes[NODE]
        assert view.layout is not None
        assert view.layout.status is not None
        if decision.spec != view.layout.spec:
            cleared = {g.uuid: g.drain.devices for g in decision.gpus if g.drain is not None and not g.drain.claims}
            decision = decide_node(self.fleet, NODE, 0.0, None, cleared) or decision
            self.fleet.set_layout(layout_body(view.layout.status.gpus, decision.spec.gpus))
        self.decisions[NODE] = decision


def pending_claim(name: str, cel: str = THREE_G, cls: str = "mig.tessera.dev") -> dict[str, Any]:
    body = claim_body(name, namespace="team-a")
    body["metadata"]["uid"] = f"uid-{name}"
    body["spec"] = {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": cls, "selectors": [{"cel": {"expression": cel}}]}}]}}
    return body


def waiting_pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def setup(gpus: int = 2) -> tuple[View, AdaptiveDemand, FakeClock, list[tuple[str, str, str, str]]]:
    fleet = Fleet()
    fleet.set_node(node_body())
    fleet.set_policy(policy_body("adaptive", **ADAPTIVE))
    fleet.set_layout(layout_body([gpu(i) for i in range(gpus)]))
    view = View(fleet)
    view.decide()
    events: list[tuple[str, str, str, str]] = []

    async def post(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        events.append((body["metadata"]["name"], type_, reason, message))

    clock = FakeClock(1000.0)
    return view, AdaptiveDemand(view, post, clock=clock), clock, events


def test_a_pod_names_its_claims_and_says_when_it_is_unschedulable() -> None:
    pod = waiting_pod("p", "p-gpu-x1")
    pod["spec"]["resourceClaims"].append({"name": "b", "resourceClaimName": "shared"})
    assert pod_claims(pod) == ["team-a/p-gpu-x1", "team-a/shared"]
    assert unschedulable(pod)
    assert not unschedulable({**pod, "spec": {**pod["spec"], "nodeName": "n"}})
    assert not unschedulable({**pod, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}})


async def test_a_claim_is_demand_only_past_the_debounce_and_then_its_gpu_is_recut() -> None:
    view, demand, clock, events = setup()
    demand.claim_seen("ADDED", pending_claim("llm-0"))
    demand.pod_seen("ADDED", waiting_pod("llm", "llm-0"))
    clock.now += 4
    plan = await demand.run_pass()
    assert plan is not None
    assert plan.recuts == (), "inside the debounce nothing counts yet"
    clock.now += 2
    plan = await demand.run_pass()
    assert plan is not None
    assert [(r.index, r.layout) for r in plan.recuts] == [(0, "halves")]
    assert view.fleet.adaptive_choices == {gpu(0).uuid: "halves"}
    assert view.enqueued == [NODE]
    assert events == [("llm-0", "Normal", "AdaptiveRecut",
                       f"GPU 0 on {NODE} is being recut to layout 'halves' of SharingPolicy adaptive for this claim")]
    # The decision now wants the chosen layout for GPU 0 and keeps GPU 1 whole.
    view.decide()
    wanted = {g.index: g.target for g in view.decisions[NODE].gpus}
    assert wanted[0] is not None
    assert wanted[0].menu_layout == "halves"
    assert len(wanted[0].mig_instances) == 2
    assert wanted[1] is not None
    assert wanted[1].menu_layout == "whole"


async def test_claims_of_other_drivers_and_allocated_claims_are_ignored() -> None:
    _view, demand, _clock, _ = setup()
    other = pending_claim("other", cls="gpu.example.com")
    demand.claim_seen("ADDED", other)
    allocated = claim_body("done", ["gpu-1"], namespace="team-a", pods=["p"])
    demand.claim_seen("ADDED", allocated)
    assert demand.claims == {}


async def test_the_cap_counts_recuts_under_way_and_one_warning_goes_to_a_claim_nothing_fits() -> None:
    view, demand, clock, events = setup(gpus=3)
    for i in range(3):
        demand.claim_seen("ADDED", pending_claim(f"c{i}"))
        demand.pod_seen("ADDED", waiting_pod(f"p{i}", f"c{i}"))
    huge = 'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("500Gi")) >= 0'
    demand.claim_seen("ADDED", pending_claim("huge", huge, "whole-gpu.tessera.dev"))
    demand.pod_seen("ADDED", waiting_pod("ph", "huge"))
    clock.now += 10
    first = await demand.run_pass()
    assert first is not None
    assert len(first.recuts) == 1
    assert sorted(first.placed) == ["team-a/c0", "team-a/c1"]
    assert first.waiting == ("team-a/c2",)
    view.decide()  # the spec is not applied yet: the recut is under way, so the cap is full
    second = await demand.run_pass()
    assert second is not None
    assert second.recuts == ()
    warnings = [e for e in events if e[2] == "NoAdaptiveLayoutFits"]
    assert len(warnings) == 1
    assert warnings[0][0] == "huge"
    assert warnings[0][1] == "Warning"
    assert "request 'gpu'" in warnings[0][3]


async def test_a_gpu_returns_to_idle_only_when_free_and_past_its_cooldown() -> None:
    view, demand, clock, _ = setup(gpus=1)
    demand.claim_seen("ADDED", pending_claim("c"))
    demand.pod_seen("ADDED", waiting_pod("p", "c"))
    clock.now += 10
    plan = await demand.run_pass()
    assert plan is not None
    assert len(plan.recuts) == 1
    # The operator writes the spec, the agent applies it, the scheduler allocates the claim.
    view.decide()
    target = view.decisions[NODE].gpus[0].target
    assert target is not None
    view.fleet.set_layout(layout_body([status_after(gpu(0), target)], [target]))
    view.decide()
    allocated = claim_body("c", ["gpu-0-mig-3g-40gb-0"], namespace="team-a", pods=["p"])
    view.fleet.set_claim(allocated)
    demand.claim_seen("MODIFIED", allocated)
    clock.now += 120
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "halves", "a held GPU is never recut, cooldown or not"
    status = demand.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus())
    assert [(r.layout, r.reason) for r in status.adaptive] == [("halves", "recut for claim team-a/c")]
    assert status.gpus_recut == 1
    # The claim goes: now free and long past the cooldown, the GPU goes back to whole.
    view.fleet.remove_claim("team-a", "c")
    demand.claim_seen("DELETED", allocated)
    view.decide()
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "whole"
    status = demand.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus())
    assert [(r.index, r.layout, r.reason) for r in status.adaptive] == [(0, "whole", "idle default")]
    assert status.gpus_recut == 0


async def test_a_recut_gpu_keeps_its_layout_through_the_cooldown_even_when_free() -> None:
    view, demand, clock, _ = setup(gpus=1)
    demand.claim_seen("ADDED", pending_claim("c"))
    demand.pod_seen("ADDED", waiting_pod("p", "c"))
    clock.now += 10
    await demand.run_pass()
    view.decide()
    target = view.decisions[NODE].gpus[0].target
    assert target is not None
    view.fleet.set_layout(layout_body([status_after(gpu(0), target)], [target]))
    view.decide()
    demand.claim_seen("DELETED", pending_claim("c"))  # the Pod gave up before it ran
    clock.now += 30
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "halves", "inside the 60 s cooldown it stays"
    clock.now += 31
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "whole"


class FakeWallClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def _recut_then_free(view: View, demand: AdaptiveDemand, clock: FakeClock) -> None:
    """GPU 0 recut to halves for a claim, applied by the agent; then the claim goes unserved."""
    demand.claim_seen("ADDED", pending_claim("c"))
    demand.pod_seen("ADDED", waiting_pod("p", "c"))
    clock.now += 10
    await demand.run_pass()
    view.decide()
    target = view.decisions[NODE].gpus[0].target
    assert target is not None
    view.fleet.set_layout(layout_body([status_after(gpu(0), target)], [target]))
    view.decide()
    demand.claim_seen("DELETED", pending_claim("c"))


def _restarted(view: View, status: SharingPolicyStatus | None) -> tuple[AdaptiveDemand, FakeClock, FakeWallClock]:
    """A new operator process: nothing in memory but what the API holds (the NodeLayout spec
    names the menu layout; the policy status is ``status``, if it was written)."""
    body = dict(view.fleet.policy_bodies["adaptive"])
    if status is not None:
        body["status"] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    view.fleet.set_policy(body)
    view.fleet.adaptive_choices.clear()

    async def post(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        return None

    clock, wall = FakeClock(1000.0), FakeWallClock()
    clock.now = 7.0  # another process: its monotonic clock has nothing to do with the last one's
    return AdaptiveDemand(view, post, clock=clock, wall_clock=wall), clock, wall


async def _recut_on_a_wall_clock() -> tuple[View, AdaptiveDemand, FakeClock, FakeWallClock, SharingPolicyStatus]:
    """``_recut_then_free`` by a process with a wall clock of its own; the policy status after it."""
    view, _, clock, _ = setup(gpus=1)
    wall = FakeWallClock()
    demand = AdaptiveDemand(view, setup(gpus=1)[1].post_event, clock=clock, wall_clock=wall)
    await _recut_then_free(view, demand, clock)
    return view, demand, clock, wall, demand.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus())


async def test_the_status_records_when_each_layout_was_chosen() -> None:
    _, _, _, _, status = await _recut_on_a_wall_clock()
    assert [(r.layout, r.since) for r in status.adaptive] == [("halves", "2026-12-04T12:00:00Z")]


async def test_a_restarted_operator_counts_the_cooldown_from_the_recorded_choice() -> None:
    view, _, _, first_wall, status = await _recut_on_a_wall_clock()

    restarted, clock, wall = _restarted(view, status)
    wall.now = first_wall.now + timedelta(seconds=30)
    await restarted.run_pass()
    assert view.fleet.adaptive_choices.get(gpu(0).uuid) is None, "30 s after the recut: still cooling down"
    again = restarted.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus())
    assert again == status, "the restart rewrites no status: same layout, reason and time"
    clock.now += 31
    wall.now += timedelta(seconds=31)
    await restarted.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "whole", "61 s after the recut the free GPU goes back"


async def test_a_restart_without_a_recorded_time_starts_the_cooldown_then() -> None:
    """The operator stopped before the policy status said when: the recut was at some moment
    before the restart, so the cooldown runs from the restart, never as already passed."""
    view, demand, clock, _ = setup(gpus=1)
    await _recut_then_free(view, demand, clock)

    restarted, clock, wall = _restarted(view, None)
    await restarted.run_pass()
    assert view.fleet.adaptive_choices.get(gpu(0).uuid) is None, "right after the restart: no recut back"
    clock.now += 59
    wall.now += timedelta(seconds=59)
    await restarted.run_pass()
    assert view.fleet.adaptive_choices.get(gpu(0).uuid) is None
    clock.now += 2
    wall.now += timedelta(seconds=2)
    await restarted.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "whole"


async def test_a_claim_needing_a_recut_gpu_and_a_free_device_beside_it_gets_the_recut() -> None:
    """GPU 0 is in halves with one 3g instance held; a claim for three 3g instances needs its
    free one beside GPU 1 recut to halves: the pass offers the room GPU 0's free device."""
    view, demand, clock, _ = setup(gpus=2)
    demand.claim_seen("ADDED", pending_claim("c"))
    demand.pod_seen("ADDED", waiting_pod("p", "c"))
    clock.now += 10
    first = await demand.run_pass()
    assert first is not None
    assert [(r.index, r.layout) for r in first.recuts] == [(0, "halves")]
    view.decide()
    targets = [g.target for g in view.decisions[NODE].gpus]
    assert targets[0] is not None
    assert targets[1] is not None
    view.fleet.set_layout(layout_body([status_after(gpu(0), targets[0]), gpu(1)], targets))
    view.decide()
    allocated = claim_body("c", ["gpu-0-mig-3g-40gb-0"], namespace="team-a", pods=["p"])
    view.fleet.set_claim(allocated)
    demand.claim_seen("MODIFIED", allocated)

    trio = pending_claim("trio")
    trio["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
    demand.claim_seen("ADDED", trio)
    demand.pod_seen("ADDED", waiting_pod("t", "trio"))
    clock.now += 10
    plan = await demand.run_pass()
    assert plan is not None
    assert [(r.index, r.layout, r.claims) for r in plan.recuts] == [(1, "halves", ("team-a/trio",))]
    assert set(plan.placed["team-a/trio"]) == {gpu(0).uuid, gpu(1).uuid}


async def test_a_gpu_is_recut_ahead_for_claims_like_those_just_placed_and_not_after_the_lead_time() -> None:
    view, demand, clock, events = setup(gpus=3)
    for name in ("c", "c2"):
        demand.claim_seen("ADDED", pending_claim(name))
        demand.pod_seen("ADDED", waiting_pod(f"p-{name}", name))
    clock.now += 10
    first = await demand.run_pass()
    assert first is not None
    assert [(r.index, r.layout) for r in first.recuts] == [(0, "halves")], "both claims wait: no forecast yet"
    view.decide()
    targets = [g.target for g in view.decisions[NODE].gpus if g.target is not None]
    assert len(targets) == 3
    view.fleet.set_layout(layout_body([status_after(gpu(0), targets[0]), gpu(1), gpu(2)], targets))
    view.decide()
    for name, start in (("c", 0), ("c2", 4)):
        allocated = claim_body(name, [f"gpu-0-mig-3g-40gb-{start}"], namespace="team-a", pods=[f"p-{name}"])
        view.fleet.set_claim(allocated)
        demand.claim_seen("MODIFIED", allocated)
    clock.now += 5
    await demand.run_pass()
    assert view.fleet.adaptive_choices.get(gpu(1).uuid) == "halves", "two 3g claims just came: two more are expected"
    status = demand.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus())
    rows = [(r.index, r.layout, r.reason) for r in status.adaptive]
    assert (1, "halves", "recut ahead for claims like team-a/c, team-a/c2") in rows
    assert [e[0] for e in events if e[2] == "AdaptiveRecut"] == ["c", "c2"], "no Event for a recut ahead"


async def test_no_recut_ahead_once_the_claims_are_older_than_the_lead_time() -> None:
    view, demand, clock, _ = setup(gpus=3)
    for name in ("c", "c2"):
        demand.claim_seen("ADDED", pending_claim(name))
        demand.pod_seen("ADDED", waiting_pod(f"p-{name}", name))
    clock.now += 10
    await demand.run_pass()
    view.decide()
    targets = [g.target for g in view.decisions[NODE].gpus if g.target is not None]
    view.fleet.set_layout(layout_body([status_after(gpu(0), targets[0]), gpu(1), gpu(2)], targets))
    view.decide()
    for name, start in (("c", 0), ("c2", 4)):
        allocated = claim_body(name, [f"gpu-0-mig-3g-40gb-{start}"], namespace="team-a", pods=[f"p-{name}"])
        view.fleet.set_claim(allocated)
        demand.claim_seen("MODIFIED", allocated)
    clock.now += demand.lead_time(demand.adaptive_policies()) + 1
    await demand.run_pass()
    assert gpu(1).uuid not in view.fleet.adaptive_choices
    assert gpu(2).uuid not in view.fleet.adaptive_choices


async def test_a_free_cut_gpu_stays_while_claims_it_could_serve_came_within_the_cooldown() -> None:
    # Hysteresis: the lead time (52 s here) decides recuts ahead, the cooldown (60 s) decides
    # what stays off idle, so a sliding lead window does not flap a GPU back and forth.
    view, demand, clock, _ = setup(gpus=1)
    demand.claim_seen("ADDED", pending_claim("c"))
    demand.pod_seen("ADDED", waiting_pod("p", "c"))
    clock.now += 10
    await demand.run_pass()  # at 1010: gpu 0 recut to halves for c
    view.decide()
    target = view.decisions[NODE].gpus[0].target
    assert target is not None
    view.fleet.set_layout(layout_body([status_after(gpu(0), target)], [target]))
    view.decide()
    clock.now += 5
    demand.claim_seen("ADDED", pending_claim("c2"))  # at 1015, placed at once on the other half
    held = []
    for name, start in (("c", 0), ("c2", 4)):
        allocated = claim_body(name, [f"gpu-0-mig-3g-40gb-{start}"], namespace="team-a", pods=[f"p-{name}"])
        view.fleet.set_claim(allocated)
        demand.claim_seen("MODIFIED", allocated)
        held.append(allocated)
    for name, body in (("c", held[0]), ("c2", held[1])):
        view.fleet.remove_claim("team-a", name)
        demand.claim_seen("DELETED", body)
    view.decide()
    assert demand.lead_time(demand.adaptive_policies()) < 55 < 60
    clock.now = 1070  # the cooldown is over; c2 came 55 s ago: past the lead time, within the cooldown
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "halves", "a 3g claim came within the cooldown"
    clock.now = 1080  # c2 came 65 s ago: a whole cooldown with no claim for it
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "whole"


async def test_a_node_is_kept_for_a_claim_needing_its_gpus_until_its_free_devices_can_hold_it() -> None:
    """GPU 0 is held; a claim for both GPUs waits. The node is kept for it: every device of its
    Adaptive GPUs is published with the reservation taint (no new claim lands there), once
    Event; when GPU 0 is freed the taint comes off so the scheduler can place the claim."""
    view, demand, clock, events = setup(gpus=2)
    holder = claim_body("holder", ["gpu-0"], namespace="team-a", pods=["h"])
    view.fleet.set_claim(holder)
    view.decide()
    gang = pending_claim("gang", cel="true", cls="whole-gpu.tessera.dev")
    gang["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    demand.claim_seen("ADDED", gang)
    demand.pod_seen("ADDED", waiting_pod("g", "gang"))
    clock.now += 10
    for _ in range(2):
        plan = await demand.run_pass()
        assert plan is not None
        assert plan.recuts == ()
        assert plan.waiting == ("team-a/gang",)
    assert view.fleet.adaptive_reserved == {NODE: frozenset({gpu(0).uuid, gpu(1).uuid})}
    assert NODE in view.enqueued
    assert [(e[0], e[2]) for e in events] == [("gang", "AdaptiveReserve")], "one Event, not one per pass"
    assert NODE in events[0][3]
    assert RESERVED_TAINT_KEY in events[0][3]
    view.decide()
    published = [d for g in view.decisions[NODE].devices_to_publish() for d in g.devices]
    assert published
    assert all({"key": RESERVED_TAINT_KEY, "effect": "NoSchedule"} in d.get("taints", []) for d in published)
    assert view.decisions[NODE].draining_devices == frozenset(), "a reservation is no drain"
    # The holder ends: both GPUs free, the claim fits them; the taint comes off for the scheduler.
    view.fleet.remove_claim("team-a", "holder")
    view.enqueued.clear()
    await demand.run_pass()
    assert view.fleet.adaptive_reserved == {}
    assert view.enqueued == [NODE]
    view.decide()
    assert not any(d.get("taints") for g in view.decisions[NODE].devices_to_publish() for d in g.devices)
    allocated = claim_body("gang", ["gpu-0", "gpu-1"], namespace="team-a", pods=["g"])
    view.fleet.set_claim(allocated)
    demand.claim_seen("MODIFIED", allocated)
    await demand.run_pass()
    assert demand.reserved == {}
    assert view.fleet.adaptive_reserved == {}


async def test_a_claim_one_gpu_can_host_keeps_no_node() -> None:
    view, demand, clock, events = setup(gpus=2)
    for i in range(2):
        held = claim_body(f"h{i}", [f"gpu-{i}"], namespace="team-a", pods=[f"h{i}"])
        view.fleet.set_claim(held)
    view.decide()
    demand.claim_seen("ADDED", pending_claim("one", cel="true", cls="whole-gpu.tessera.dev"))
    demand.pod_seen("ADDED", waiting_pod("o", "one"))
    clock.now += 10
    await demand.run_pass()
    assert view.fleet.adaptive_reserved == {}
    assert events == []


async def test_a_restarted_operators_first_status_pass_rewrites_nothing_before_any_demand_pass() -> None:
    """A new leader's status pass can come before its first demand pass: each GPU's row is then
    what the policy status recorded of the layout its spec names, recut or back at idle."""
    view, demand, clock, first_wall, recut = await _recut_on_a_wall_clock()
    restarted, _, _ = _restarted(view, recut)
    assert restarted.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus()) == recut

    clock.now += 61  # past the cooldown: the first process takes the free GPU back to idle, at a recorded time
    first_wall.now += timedelta(seconds=61)
    await demand.run_pass()
    assert view.fleet.adaptive_choices[gpu(0).uuid] == "whole"
    view.decide()
    target = view.decisions[NODE].gpus[0].target  # the agent applies the idle layout
    assert target is not None
    assert target.menu_layout in (None, "whole")
    view.fleet.set_layout(layout_body([status_after(gpu(0), target)], [target]))
    idle = demand.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus())
    assert [(r.layout, r.since) for r in idle.adaptive] == [("whole", "2026-12-04T12:01:01Z")]
    restarted, _, _ = _restarted(view, idle)
    assert restarted.with_status(view.fleet.policies["adaptive"], SharingPolicyStatus()) == idle
