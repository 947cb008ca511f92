"""The SharingPolicy status passes (tessera.controller.statuswriter): a pass writes only a status
that changed, with an Event per changed condition; a node decided before the latest policy
change does not count as applied; the loop waits for the first sweep of the fleet."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from tessera.controller.decide import NodeDecision, decide_node
from tessera.controller.statuswriter import PolicyStatusWriter
from tessera.kube.http import ApiError
from tessera.models.layout import GpuLayout
from tessera.models.policy import Strategy, TimeSlicingSpec
from tests.conditions import until
from tests.controller_fleet import NODE, applied, fleet_of, policy_body
from tests.dra_gpus import gpu

TIME_SLICED = {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}}


class Api:
    def __init__(self) -> None:
        self.statuses: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str]] = []

    async def patch(self, name: str, status: dict[str, Any]) -> None:
        self.statuses.append((name, status))

    async def post(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason))


def applied_node() -> tuple[Any, dict[str, NodeDecision]]:
    layout = GpuLayout(uuid=gpu(0).uuid, policy="shared", strategy=Strategy.TIME_SLICING,
                       time_slicing=TimeSlicingSpec(replicas=4))
    fleet = fleet_of([applied(gpu(0), layout)], [layout], policies=[policy_body("shared", **TIME_SLICED)],
                     generation=1, observed_generation=1)
    decision = decide_node(fleet, NODE, 0.0)
    assert decision is not None
    return fleet, {NODE: replace(decision, spec_generation=1, published=fleet.nodes[NODE].layout.status)}


def ready_reason(status: dict[str, Any]) -> str:
    return next(str(c["reason"]) for c in status["conditions"] if c["type"] == "Ready")


async def test_a_pass_writes_a_changed_status_once_with_its_events_and_nothing_when_unchanged() -> None:
    fleet, decisions = applied_node()
    api = Api()
    writer = PolicyStatusWriter(fleet, decisions, api.patch, api.post)

    await writer.write_all()
    assert [name for name, _ in api.statuses] == ["shared"]
    assert api.statuses[0][1]["gpusApplied"] == 1
    assert api.events, "the first Ready is announced"
    events = len(api.events)

    await writer.write_all()
    assert len(api.statuses) == 1, "the same status again writes nothing"
    assert len(api.events) == events


async def test_after_a_policy_change_nodes_decided_before_it_do_not_count_as_applied() -> None:
    fleet, decisions = applied_node()
    api = Api()
    writer = PolicyStatusWriter(fleet, decisions, api.patch, api.post)
    writer.policies_changed()
    assert writer.epoch == 1

    await writer.write_all()
    assert api.statuses[-1][1]["gpusApplied"] == 0
    decisions[NODE] = replace(decisions[NODE], epoch=1)
    await writer.write_all()
    assert api.statuses[-1][1]["gpusApplied"] == 1


async def test_the_loop_writes_nothing_before_the_fleet_is_swept_and_then_writes_when_dirty() -> None:
    fleet, decisions = applied_node()
    api = Api()
    writer = PolicyStatusWriter(fleet, decisions, api.patch, api.post)
    swept = asyncio.Event()
    loop = asyncio.create_task(writer.run(swept))
    try:
        writer.changed()
        await asyncio.sleep(0.3)  # longer than the debounce: a pass would have run by now
        assert api.statuses == []
        swept.set()
        await until(lambda: bool(api.statuses), "a status pass")
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert [name for name, _ in api.statuses] == ["shared"]


async def test_a_policy_deleted_before_its_status_is_written_is_skipped_and_the_others_are_written() -> None:
    fleet, decisions = applied_node()
    fleet.set_policy(policy_body("also", **TIME_SLICED))
    api = Api()

    async def patch(name: str, status: dict[str, Any]) -> None:
        if name == "also":  # the batch was deleted between the view and the write
            raise ApiError(404, "NotFound", 'sharingpolicies.tessera.dev "also" not found')
        await api.patch(name, status)

    writer = PolicyStatusWriter(fleet, decisions, patch, api.post)
    await writer.write_all()  # no exception: the pass goes on

    assert [name for name, _ in api.statuses] == ["shared"]
    assert "status" not in fleet.policy_bodies["also"]
