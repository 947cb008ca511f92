"""The agent's pass over a NodeLayout it cannot read: nothing on the GPUs changes."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.agent import service
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.service import AgentConfig, NodeAgent


async def test_a_spec_the_agent_cannot_read_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SimulatedBackend.from_spec("node-1", "1xH100-80GB", None)
    gpu = backend.inventory().gpus[0]
    unreadable = {
        "metadata": {"name": "node-1", "generation": 2},
        "spec": {
            "gpus": [
                {
                    "uuid": gpu.uuid,
                    "strategy": "MIG",
                    "migInstances": [{"profile": "7g.80gb", "start": 0}],
                    "fromTheFuture": True,
                }
            ]
        },
    }
    writes: list[Any] = []

    async def get(api: object, name: str) -> dict[str, Any]:
        return unreadable

    async def write(api: object, name: str, status: dict[str, Any], read: object = None) -> None:
        writes.append(status)

    monkeypatch.setattr(service, "get_node_layout", get)
    monkeypatch.setattr(service, "write_node_layout_status", write)
    agent = NodeAgent(AgentConfig(node_name="node-1", metrics_port=None), backend, api=None)

    assert await agent.reconcile_once() is None
    after = backend.inventory().gpus[0]
    assert not after.mig_mode_current, "MIG mode was not touched"
    assert after.instances == ()
    assert writes == []


def test_after_failed_passes_the_next_comes_after_a_short_backoff_not_a_whole_resync() -> None:
    backend = SimulatedBackend.from_spec("node-1", "1xH100-80GB", None)
    agent = NodeAgent(AgentConfig(node_name="node-1", metrics_port=None, resync_seconds=30.0), backend, api=None)
    assert agent.next_pass_in(0) == 30.0
    assert [agent.next_pass_in(n) for n in (1, 2, 3, 4, 9)] == [1.0, 2.0, 5.0, 10.0, 10.0]
    quick = NodeAgent(AgentConfig(node_name="node-1", metrics_port=None, resync_seconds=3.0), backend, api=None)
    assert quick.next_pass_in(4) == 3.0, "never later than the resync"


async def test_the_echo_of_the_status_being_written_asks_for_no_pass_and_a_new_spec_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SimulatedBackend.from_spec("node-1", "1xH100-80GB", None)
    agent = NodeAgent(AgentConfig(node_name="node-1", metrics_port=None), backend, api=None)
    layout = {"metadata": {"name": "node-1", "generation": 3}, "spec": {"gpus": []}}
    echoes: list[bool] = []

    async def get(api: object, name: str) -> dict[str, Any]:
        return layout

    async def write(api: object, name: str, status: dict[str, Any], read: object = None) -> None:
        echoes.append(agent.wants_pass("MODIFIED", layout))  # the watch is faster than our answer

    monkeypatch.setattr(service, "get_node_layout", get)
    monkeypatch.setattr(service, "write_node_layout_status", write)
    assert agent.wants_pass("ADDED", layout), "nothing reported yet"
    assert await agent.reconcile_once() is not None
    assert echoes == [False]
    assert not agent.wants_pass("MODIFIED", layout)
    assert agent.wants_pass("MODIFIED", {"metadata": {"name": "node-1", "generation": 4}})
    assert agent.wants_pass("DELETED", layout)
