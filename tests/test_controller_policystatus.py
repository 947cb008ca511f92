"""SharingPolicy status from the operator's decisions: the counts, conflicts, what drains wait
for, the Ready / Progressing / Degraded conditions, and the events their transitions post.
An unchanged status must compare equal to the one written before, or every resync writes."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from tessera.controller.decide import NodeDecision, decide_node
from tessera.controller.policystatus import PolicyTally, TallyMemo, policy_status, tally, transitions
from tessera.controller.state import Fleet
from tessera.models.conditions import Condition, ConditionStatus, find_condition
from tessera.models.layout import GpuLayout
from tessera.models.policy import PolicyConflict, SharingPolicy, SharingPolicyStatus, Strategy, TimeSlicingSpec
from tests.controller_fleet import NODE, applied, claim_body, fleet_of, layout_body, node_body, policy_body
from tests.dra_gpus import gpu, mig_gpu

TIME_SLICED = {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}}
LONG_AGO = "2020-01-01T00:00:00Z"


def _sliced(uuid: str, policy: str = "shared") -> GpuLayout:
    return GpuLayout(uuid=uuid, policy=policy, strategy=Strategy.TIME_SLICING, time_slicing=TimeSlicingSpec(replicas=4))


def _applied_fleet(n: int = 2, *, generation: int = 2, observed: int | None = 2, **extra: Any) -> Fleet:
    """NODE with ``n`` GPUs whose agent applied the 'shared' policy's layout."""
    spec = [_sliced(gpu(i).uuid) for i in range(n)]
    status = [applied(gpu(i), spec[i]) for i in range(n)]
    extra.setdefault("policies", [policy_body("shared", **TIME_SLICED)])
    return fleet_of(status, spec, generation=generation, observed_generation=observed, **extra)


def _add_node(fleet: Fleet, name: str, gpus: list[Any], spec: list[GpuLayout], generation: int, observed: int) -> None:
    fleet.set_node(node_body(name))
    fleet.set_layout(layout_body(gpus, spec, node=name, generation=generation, observed_generation=observed))


def _decisions(fleet: Fleet, now: float = 0.0) -> list[NodeDecision]:
    out = [decide_node(fleet, view.name, now) for view in fleet.gpu_nodes()]
    return [d for d in out if d is not None]


def _tally(fleet: Fleet, policy: str = "shared", pending: dict[str, bool] | None = None) -> PolicyTally:
    return tally(fleet, policy, _decisions(fleet), pending or {})


def _status(fleet: Fleet, policy: str = "shared", previous: SharingPolicyStatus | None = None) -> SharingPolicyStatus:
    return policy_status(fleet.policies[policy], _tally(fleet, policy), previous)


def _condition(status: SharingPolicyStatus, type_: str) -> tuple[ConditionStatus, str, str]:
    c = find_condition(status.conditions, type_)
    assert c is not None, f"no {type_} condition"
    return c.status, c.reason, c.message


def _policy(generation: int = 1) -> SharingPolicy:
    return SharingPolicy.model_validate(policy_body("shared", generation=generation, **TIME_SLICED))


def _tallied(
    gpus: int = 2,
    applied: int = 2,
    *,
    errors: tuple[str, ...] = (),
    draining: tuple[str, ...] = (),
    timed_out: tuple[str, ...] = (),
) -> PolicyTally:
    return PolicyTally(1 if gpus else 0, gpus, applied, gpus, (), errors, draining, timed_out)


# -- counts --------------------------------------------------------------------------------


def test_counts_nodes_gpus_applied_gpus_and_published_devices() -> None:
    fleet = _applied_fleet(2)
    # node-2's agent has not caught up with its new spec yet
    _add_node(fleet, "node-2", [gpu(0)], [_sliced(gpu(0).uuid)], generation=3, observed=2)

    t = _tally(fleet)

    assert (t.nodes, t.gpus, t.applied, t.devices) == (2, 3, 2, 3)
    assert t.conflicts == t.errors == t.draining == t.timed_out == ()
    status = _status(fleet)
    assert (status.nodes, status.gpus, status.gpus_applied, status.devices_published, status.conflicts) == (
        2,
        3,
        2,
        3,
        0,
    )
    assert status.observed_generation == 1


@pytest.mark.parametrize(
    ("generation", "observed", "gpu_applied", "pending", "count"),
    [
        (2, 2, True, False, 1),
        (2, 1, True, False, 0),  # the agent has not seen the latest spec
        (2, None, True, False, 0),  # the agent has reported nothing yet
        (2, 2, False, False, 0),  # the agent is still applying
        (2, 2, True, True, 0),  # the operator has a new spec to write
    ],
    ids=["applied", "old-generation", "no-generation", "not-applied", "spec-pending"],
)
def test_a_gpu_counts_as_applied_only_for_the_current_generation(
    generation: int, observed: int | None, gpu_applied: bool, pending: bool, count: int
) -> None:
    spec = [_sliced(gpu(0).uuid)]
    status = [applied(gpu(0), spec[0]).model_copy(update={"applied": gpu_applied})]
    fleet = fleet_of(
        status,
        spec,
        policies=[policy_body("shared", **TIME_SLICED)],
        generation=generation,
        observed_generation=observed,
    )

    assert _tally(fleet, pending={NODE: pending}).applied == count


def test_once_carried_out_a_gpu_counts_from_the_status_that_was_published() -> None:
    """The agent may report a layout before the operator has published it: Ready follows the
    slices, not the agent, so a decision's published status and spec generation decide."""
    fleet = _applied_fleet(1)
    (decision,) = _decisions(fleet)
    assert tally(fleet, "shared", [decision], {}).applied == 1
    layout = fleet.nodes[NODE].layout
    assert layout is not None
    assert layout.status is not None
    before_applied = layout.status.model_copy(update={"observed_generation": 1})
    unpublished = replace(decision, spec_generation=2, published=before_applied)
    assert tally(fleet, "shared", [unpublished], {}).applied == 0
    published = replace(decision, spec_generation=2, published=layout.status)
    assert tally(fleet, "shared", [published], {}).applied == 1


def test_a_gpu_in_another_strategy_is_not_applied_whatever_the_agent_says() -> None:
    fleet = fleet_of([gpu(0)], policies=[policy_body("shared", **TIME_SLICED)])  # Exclusive, applied=True

    t = _tally(fleet)

    assert (t.gpus, t.applied) == (1, 0)


def test_a_draining_gpu_is_not_applied() -> None:
    fleet = _applied_fleet(1, claims=[claim_body("c", ["gpu-0"])])
    fleet.set_policy(policy_body("shared", generation=2, strategy="TimeSlicing", timeSlicing={"replicas": 8}))

    t = _tally(fleet)

    assert (t.gpus, t.applied) == (1, 0)
    assert t.draining == (f"1 claim on {NODE} GPU 0",)


@pytest.mark.parametrize("seed", range(12))
def test_a_memo_of_each_nodes_counts_tallies_what_counting_every_node_again_does(seed: int) -> None:
    """Status passes over a fleet that changes between them (an agent reports, a claim comes or
    goes, a spec is pending, a policy changes, a node goes), a changed node decided again or not
    yet (a pass may come before its reconcile): each pass's tally through the memo equals a count from scratch."""
    rng = random.Random(seed)
    nodes = [f"node-{i}" for i in range(4)]
    fleet = Fleet()
    fleet.set_policy(policy_body("shared", **TIME_SLICED))
    fleet.set_policy(policy_body("whole", strategy="Exclusive", gpuSelector={"indices": [1]}))
    spec = [_sliced(gpu(i).uuid) for i in range(2)]
    for name in nodes:
        _add_node(fleet, name, [applied(gpu(i), spec[i]) for i in range(2)], spec, 2, 2)
    decisions = {d.node: d for d in _decisions(fleet)}
    memo = TallyMemo()
    for _ in range(40):
        touched = rng.sample(nodes, rng.randint(0, 2))
        for name in touched:
            match rng.choice(["report", "claim", "release", "drop"]):
                case "report":
                    observed = rng.choice([1, 2])
                    _add_node(fleet, name, [applied(gpu(i), spec[i]) if rng.random() < 0.7 else gpu(i)
                                            for i in range(2)], spec, 2, observed)
                case "claim":
                    fleet.set_claim(claim_body(f"c-{name}", [(name, "gpu-0")]))
                case "release":
                    fleet.remove_claim("default", f"c-{name}")
                case "drop":
                    fleet.remove_node(name)
                    fleet.remove_layout(name)
                    decisions.pop(name, None)
                    continue
            # A pass may run before the node's reconcile: the old decision with the new view.
            if rng.random() < 0.6 and (decision := decide_node(fleet, name, 0.0)) is not None:
                decisions[name] = decision
        if rng.random() < 0.2:
            fleet.set_policy(policy_body("shared", generation=rng.randint(2, 9), strategy="TimeSlicing",
                                         timeSlicing={"replicas": rng.choice([4, 8])}))
        pending = {name: rng.random() < 0.2 for name in decisions}
        for policy in ("shared", "whole", "gone"):
            assert tally(fleet, policy, decisions.values(), pending, memo) == tally(
                fleet, policy, decisions.values(), pending)
        memo.next_pass()


# -- conditions ------------------------------------------------------------------------------


def test_a_policy_applied_everywhere_is_ready_and_stable() -> None:
    status = _status(_applied_fleet(2))

    assert [c.type for c in status.conditions] == ["Ready", "Progressing", "Degraded"]
    assert _condition(status, "Ready") == (ConditionStatus.TRUE, "Applied", "2/2 GPUs on 1 node")
    assert _condition(status, "Progressing") == (ConditionStatus.FALSE, "Stable", "")
    assert _condition(status, "Degraded") == (ConditionStatus.FALSE, "AsExpected", "")
    assert all(c.observed_generation == 1 for c in status.conditions)


def test_a_policy_the_agents_are_still_applying_is_progressing() -> None:
    fleet = fleet_of([gpu(0), gpu(1)], policies=[policy_body("shared", **TIME_SLICED)])

    status = _status(fleet)

    assert _condition(status, "Ready") == (ConditionStatus.FALSE, "Applying", "0/2 GPUs on 1 node applied")
    assert _condition(status, "Progressing") == (ConditionStatus.TRUE, "Applying", "0/2 GPUs applied")
    assert _condition(status, "Degraded")[0] is ConditionStatus.FALSE


def test_a_gpu_the_agent_cannot_change_makes_the_policy_degraded_with_the_agents_words() -> None:
    """An Ampere GPU whose MIG mode waits for a reset never gets applied by itself: the policy
    says so (Degraded ApplyBlocked, the agent's message) instead of Applying forever."""
    spec = [_sliced(gpu(0).uuid), _sliced(gpu(1).uuid)]
    status = [applied(gpu(0), spec[0]),
              gpu(1).model_copy(update={"applied": False, "reason": "ResetRequired",
                                        "message": "GPU 1: MIG mode waits for a reset (nvidia-smi -r)"})]
    fleet = fleet_of(status, spec, policies=[policy_body("shared", **TIME_SLICED)], generation=2,
                     observed_generation=2)

    result = _status(fleet)

    blocked = f"{NODE} GPU 1: MIG mode waits for a reset (nvidia-smi -r) (ResetRequired)"
    assert _condition(result, "Degraded") == (ConditionStatus.TRUE, "ApplyBlocked", blocked)
    in_use = [status[0], status[1].model_copy(update={"reason": "InstanceInUse", "message": "GPU 1: 1g.10gb in use"})]
    waiting = _status(fleet_of(in_use, spec, policies=[policy_body("shared", **TIME_SLICED)], generation=2,
                               observed_generation=2))
    assert _condition(waiting, "Degraded")[0] is ConditionStatus.FALSE, "an instance in use clears by itself"
    assert _condition(waiting, "Ready") == (
        ConditionStatus.FALSE, "Blocked",
        f"1/2 GPUs on 1 node applied; the agent waits: {NODE} GPU 1: 1g.10gb in use (InstanceInUse)")
    applying = [status[0], status[1].model_copy(update={"reason": "Applying", "message": "GPU 1: create 1g.10gb"})]
    under_way = fleet_of(applying, spec, policies=[policy_body("shared", **TIME_SLICED)], generation=2,
                         observed_generation=2)
    assert _condition(_status(under_way), "Degraded")[0] is ConditionStatus.FALSE, "work under way is not blocked"
    assert _condition(result, "Ready") == (ConditionStatus.FALSE, "Degraded", "1/2 GPUs on 1 node applied")
    stale = fleet_of(status, spec, policies=[policy_body("shared", **TIME_SLICED)], generation=3,
                     observed_generation=2)
    assert _condition(_status(stale), "Degraded")[0] is ConditionStatus.FALSE, "a report for an older spec says nothing"


def test_a_policy_that_selects_no_gpu_says_so() -> None:
    fleet = fleet_of([gpu(0)], policies=[policy_body("shared", nodeSelector={"matchLabels": {"pool": "x"}})])

    status = _status(fleet)

    assert (status.nodes, status.gpus) == (0, 0)
    assert _condition(status, "Ready") == (
        ConditionStatus.FALSE,
        "NoMatchingGPUs",
        "the policy selects no GPU that it wins",
    )
    assert _condition(status, "Progressing")[:2] == (ConditionStatus.FALSE, "Stable")
    assert _condition(status, "Degraded")[:2] == (ConditionStatus.FALSE, "AsExpected")


def test_the_loser_of_a_conflict_lists_the_gpus_and_the_winner() -> None:
    fleet = fleet_of([gpu(0), gpu(1)], policies=[policy_body("b", **TIME_SLICED), policy_body("a", **TIME_SLICED)])

    loser, winner = _status(fleet, "b"), _status(fleet, "a")

    assert loser.conflicts == 2
    assert loser.conflicting == [PolicyConflict(node=NODE, gpu=gpu(i).uuid, winner="a") for i in (0, 1)]
    assert (loser.gpus, _condition(loser, "Ready")[1]) == (0, "NoMatchingGPUs")
    assert (winner.conflicts, winner.conflicting, winner.gpus) == (0, [], 2)


def test_a_higher_priority_wins_a_conflict_whatever_the_names() -> None:
    fleet = fleet_of([gpu(0)], policies=[policy_body("z", priority=5, **TIME_SLICED), policy_body("a")])

    assert _status(fleet, "a").conflicting == [PolicyConflict(node=NODE, gpu=gpu(0).uuid, winner="z")]
    assert _status(fleet, "z").gpus == 1


def test_a_gpu_with_a_plan_error_makes_the_policy_degraded() -> None:
    current = GpuLayout(uuid=mig_gpu(0).uuid, policy="old", strategy=Strategy.MIG)
    fleet = fleet_of(
        [mig_gpu(0)], [current], policies=[policy_body("big", strategy="MIG", mig={"profiles": {"3g.40gb": 3}})]
    )

    status = _status(fleet, "big")

    degraded, reason, message = _condition(status, "Degraded")
    assert (degraded, reason) == (ConditionStatus.TRUE, "PlanFailed")
    assert message.startswith(f"{NODE} GPU 0: 3 x 3g.40gb do not fit one H100-80GB")
    assert _condition(status, "Ready")[:2] == (ConditionStatus.FALSE, "Degraded")
    assert (status.gpus, status.gpus_applied) == (1, 0)


def test_a_gpu_selector_that_does_not_compile_makes_the_policy_degraded() -> None:
    fleet = fleet_of([gpu(0)], policies=[policy_body("shared", gpuSelector={"cel": "device.("}, **TIME_SLICED)])

    status = _status(fleet)

    assert _condition(status, "Degraded")[:2] == (ConditionStatus.TRUE, "PlanFailed")
    assert status.gpus == 0


def test_a_gpu_selector_that_fails_on_a_gpu_makes_the_policy_degraded() -> None:
    selector = {"cel": 'device.attributes["gpu.tessera.dev"].nosuch == 1'}
    fleet = fleet_of([gpu(0)], policies=[policy_body("shared", gpuSelector=selector, **TIME_SLICED)])

    status = _status(fleet)

    degraded, reason, message = _condition(status, "Degraded")
    assert (degraded, reason) == (ConditionStatus.TRUE, "PlanFailed")
    assert message.startswith(f"{NODE} GPU 0: gpuSelector ")
    assert "has no 'nosuch'" in message
    assert status.gpus == 0  # it does not select the GPU


def test_a_selector_error_is_reported_only_on_the_policy_it_belongs_to() -> None:
    failing = policy_body("shared-2", gpuSelector={"cel": 'device.attributes["gpu.tessera.dev"].nosuch == 1'})
    fleet = fleet_of([gpu(0)], policies=[failing, policy_body("shared", nodeSelector={"matchLabels": {"a": "b"}})])

    assert _condition(_status(fleet, "shared-2"), "Degraded")[:2] == (ConditionStatus.TRUE, "PlanFailed")
    assert _condition(_status(fleet, "shared"), "Degraded")[:2] == (ConditionStatus.FALSE, "AsExpected")


def test_a_drain_is_progressing_and_says_what_it_waits_for() -> None:
    fleet = _applied_fleet(2, claims=[claim_body("c", ["gpu-1"])])
    fleet.set_policy(policy_body("shared", generation=2, strategy="TimeSlicing", timeSlicing={"replicas": 8}))

    status = _status(fleet)

    waiting = f"1 claim on {NODE} GPU 1"
    assert status.draining == [waiting]
    assert _condition(status, "Progressing") == (ConditionStatus.TRUE, "Draining", f"waiting for {waiting}")
    assert _condition(status, "Ready")[:2] == (ConditionStatus.FALSE, "Draining")
    assert _condition(status, "Degraded")[0] is ConditionStatus.FALSE


def test_a_timed_out_drain_makes_the_policy_degraded() -> None:
    fleet = _applied_fleet(1, claims=[claim_body("c", ["gpu-0"])])
    fleet.set_policy(
        policy_body(
            "shared", generation=2, strategy="TimeSlicing", timeSlicing={"replicas": 8}, drain={"timeout": "0s"}
        )
    )

    status = _status(fleet)

    waiting = f"1 claim on {NODE} GPU 0"
    assert _condition(status, "Degraded") == (
        ConditionStatus.TRUE,
        "DrainTimeout",
        f"drain timed out, still waiting for {waiting}",
    )
    assert _condition(status, "Progressing") == (ConditionStatus.TRUE, "Draining", f"waiting for {waiting}")
    assert status.draining == [waiting]


def test_a_plan_error_outranks_a_timed_out_drain() -> None:
    status = policy_status(_policy(), _tallied(applied=0, errors=("boom",), timed_out=("1 claim on n GPU 0",)), None)

    assert _condition(status, "Degraded")[:2] == (ConditionStatus.TRUE, "PlanFailed")


def test_long_lists_are_cut_short_in_messages_but_not_in_draining() -> None:
    waits = tuple(f"1 claim on {NODE} GPU {i}" for i in range(5))

    status = policy_status(_policy(), _tallied(5, 0, draining=waits), None)

    assert _condition(status, "Progressing")[2] == f"waiting for {'; '.join(waits[:3])}; and 2 more"
    assert status.draining == list(waits)


# -- transition times and writes ---------------------------------------------------------------


def _backdated(status: SharingPolicyStatus) -> SharingPolicyStatus:
    return status.model_copy(
        update={"conditions": [c.model_copy(update={"last_transition_time": LONG_AGO}) for c in status.conditions]}
    )


def test_last_transition_time_stays_while_a_condition_keeps_its_status() -> None:
    before = _backdated(policy_status(_policy(), _tallied(4, 1), None))

    after = policy_status(_policy(), _tallied(4, 3), before)  # a new message, the same statuses

    assert _condition(after, "Progressing")[2] == "3/4 GPUs applied"
    assert [c.last_transition_time for c in after.conditions] == [LONG_AGO] * 3


def test_last_transition_time_moves_when_a_condition_changes_status() -> None:
    before = _backdated(policy_status(_policy(), _tallied(4, 1), None))

    after = policy_status(_policy(), _tallied(4, 4), before)

    times = {c.type: c.last_transition_time for c in after.conditions}
    assert times["Degraded"] == LONG_AGO
    assert times["Ready"] != LONG_AGO
    assert times["Progressing"] != LONG_AGO


def test_an_unchanged_status_compares_equal_so_nothing_is_written() -> None:
    fleet = _applied_fleet(2)
    first = _status(fleet)

    again = _status(fleet, previous=first)
    as_read_back = _status(fleet, previous=SharingPolicyStatus.model_validate(first.to_kube()))

    assert again == first
    assert as_read_back == SharingPolicyStatus.model_validate(first.to_kube())


def test_a_new_generation_is_a_new_status() -> None:
    first = policy_status(_policy(1), _tallied(), None)

    second = policy_status(_policy(2), _tallied(), first)

    assert second != first
    assert second.observed_generation == 2
    assert [c.last_transition_time for c in second.conditions] == [c.last_transition_time for c in first.conditions]


# -- events -------------------------------------------------------------------------------------


def test_becoming_ready_posts_a_normal_event() -> None:
    after = policy_status(_policy(), _tallied(), None)

    assert transitions(None, after) == [("Normal", "Applied", "2/2 GPUs on 1 node")]


def test_nothing_changed_posts_nothing() -> None:
    status = policy_status(_policy(), _tallied(2, 1), None)

    assert transitions(status, policy_status(_policy(), _tallied(2, 1), status)) == []
    assert transitions(status, status) == []


def test_a_drain_starting_posts_a_normal_event() -> None:
    ready = policy_status(_policy(), _tallied(), None)

    draining = policy_status(_policy(), _tallied(2, 1, draining=("1 claim on n GPU 0",)), ready)

    assert transitions(ready, draining) == [("Normal", "Draining", "waiting for 1 claim on n GPU 0")]


def test_a_drain_starting_while_applying_posts_a_draining_event() -> None:
    applying = policy_status(_policy(), _tallied(2, 0), None)

    draining = policy_status(_policy(), _tallied(2, 0, draining=("1 claim on n GPU 0",)), applying)

    assert _condition(applying, "Progressing")[0] is _condition(draining, "Progressing")[0] is ConditionStatus.TRUE
    assert transitions(applying, draining) == [("Normal", "Draining", "waiting for 1 claim on n GPU 0")]


def test_a_drain_timing_out_posts_a_warning() -> None:
    waits = ("1 claim on n GPU 0",)
    draining = policy_status(_policy(), _tallied(2, 1, draining=waits), None)

    timed_out = policy_status(_policy(), _tallied(2, 1, timed_out=waits), draining)

    assert transitions(draining, timed_out) == [
        ("Warning", "DrainTimeout", "drain timed out, still waiting for 1 claim on n GPU 0")
    ]


def test_a_degraded_policy_whose_reason_changes_posts_a_new_warning() -> None:
    waits = ("1 claim on n GPU 0",)
    failed = policy_status(_policy(), _tallied(2, 1, errors=("n GPU 1: boom",), draining=waits), None)

    timed_out = policy_status(_policy(), _tallied(2, 1, timed_out=waits), failed)

    assert transitions(failed, timed_out) == [
        ("Warning", "DrainTimeout", "drain timed out, still waiting for 1 claim on n GPU 0")
    ]


def test_recovering_posts_only_the_ready_event() -> None:
    failed = policy_status(_policy(), _tallied(2, 1, errors=("n GPU 1: boom",)), None)

    recovered = policy_status(_policy(), _tallied(), failed)

    assert transitions(failed, recovered) == [("Normal", "Applied", "2/2 GPUs on 1 node")]


def test_a_condition_can_be_read_back_from_the_api_form() -> None:
    status = policy_status(_policy(), _tallied(), None)

    kube = status.to_kube()

    assert [c["type"] for c in kube["conditions"]] == ["Ready", "Progressing", "Degraded"]
    assert all(Condition.model_validate(c) in status.conditions for c in kube["conditions"])


def test_a_claim_on_a_device_that_no_longer_exists_makes_its_policy_degraded_and_names_it() -> None:
    # The agent reports the time-sliced gpu-1, but a claim holds a MIG device of GPU 1 that is gone.
    fleet = _applied_fleet(2, claims=[claim_body("lost", ["gpu-1-mig-3g-40gb-0"], namespace="ml", pods=["w"])])

    status = _status(fleet)

    degraded = _condition(status, "Degraded")
    assert degraded[:2] == (ConditionStatus.TRUE, "AllocatedDeviceMissing")
    assert "ResourceClaim ml/lost is allocated gpu-1-mig-3g-40gb-0" in degraded[2]
    assert "ml/w" in degraded[2], "it names the Pod"
    assert "delete" in degraded[2], "it says what to do"
    assert ("Warning", "AllocatedDeviceMissing", degraded[2]) in transitions(None, status)


def test_claims_on_devices_that_exist_are_not_missing() -> None:
    fleet = _applied_fleet(2, claims=[claim_body("fine", ["gpu-1"])])

    assert _condition(_status(fleet), "Degraded")[:2] == (ConditionStatus.FALSE, "AsExpected")
