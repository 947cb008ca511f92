"""The simulated GPUs' fault injection and state (tessera.agent.backends.simfaults, .simstate):
a fault fires after its good calls, as many times as asked, on its GPU only; bad names are
refused with the choices; the state, faults and events included, survives JSON unchanged."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from tessera.agent.backends.base import InsufficientResourcesError
from tessera.agent.backends.simfaults import FAULT_OPERATIONS, SimulatedCrash, fire_fault, lose, new_fault, xid_event
from tessera.agent.backends.simstate import SimGpu, SimState, parse_simulate_spec, simulated_gpu_uuid


def state() -> SimState:
    return SimState(node_name="n", gpus=[SimGpu(index=i, uuid=simulated_gpu_uuid("n", i), model="H100-80GB")
                                         for i in range(2)])


def test_a_fault_fires_after_its_good_calls_as_often_as_asked_and_only_on_its_gpu() -> None:
    s = state()
    s.faults.append(new_fault("create_gpu_instance", "InsufficientResources", gpu_index=1, count=2, after=1))

    fire_fault(s, "create_gpu_instance", 0)  # another GPU
    fire_fault(s, "destroy_gpu_instance", 1)  # another operation
    fire_fault(s, "create_gpu_instance", 1)  # the one good call
    for _ in range(2):
        with pytest.raises(InsufficientResourcesError, match="injected fault"):
            fire_fault(s, "create_gpu_instance", 1)
    fire_fault(s, "create_gpu_instance", 1)
    assert s.faults == []


def test_a_crash_is_a_fault_like_any_other() -> None:
    s = state()
    s.faults.append(new_fault("start_mps", "Crash"))
    with pytest.raises(SimulatedCrash):
        fire_fault(s, "start_mps", 0)


def test_unknown_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=f"one of {', '.join(FAULT_OPERATIONS)}"):
        new_fault("melt", "InUse")
    with pytest.raises(ValueError, match="unknown fault 'Melted'; one of InUse"):
        new_fault("start_mps", "Melted")


def test_the_state_with_its_faults_and_events_round_trips_through_json() -> None:
    s = state()
    s.faults.append(new_fault("stop_mps", "Timeout", count=3))
    s.events.append(xid_event(0, 79, gpu_instance_id=2))
    s.events.append(lose(s.gpus[1]))
    s.holds["GPU-x"] = ["claim-a"]

    again = SimState.from_json(json.loads(json.dumps(asdict(s))))
    assert again == s
    assert again.gpus[1].lost


def test_a_spec_names_the_bad_part() -> None:
    assert [m.key for m in parse_simulate_spec("2xH100-80GB, A100-80GB")] == ["H100-80GB"] * 2 + ["A100-80GB"]
    with pytest.raises(ValueError, match="'0xH100-80GB'"):
        parse_simulate_spec("0xH100-80GB")
