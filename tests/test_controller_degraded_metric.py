"""``tessera_operator_policy_degraded``: after each pass over the policies' status, one series per
Degraded policy (labels policy, reason), and none for a policy that is no longer Degraded. The
chart's TesseraPolicyDegraded alert reads it."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import REGISTRY

from tessera.controller.decide import decide_node
from tessera.controller.runtime import Controller
from tessera.kube.objects import Api
from tests.controller_fleet import fleet_of, policy_body
from tests.dra_gpus import gpu

TIME_SLICED = {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}}


class StatusApi:
    """Records the status patches and events a status pass writes."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        self.patches.append((name, status))

    async def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        return None


def _degraded(policy: str, reason: str) -> float | None:
    return REGISTRY.get_sample_value("tessera_operator_policy_degraded", {"policy": policy, "reason": reason})


async def test_a_degraded_policy_is_one_series_until_it_is_fixed() -> None:
    failing = policy_body("broken", gpuSelector={"cel": 'device.attributes["gpu.tessera.dev"].nosuch == 1'},
                          **TIME_SLICED)
    healthy = policy_body("fine", nodeSelector={"matchLabels": {"a": "b"}}, **TIME_SLICED)
    api = StatusApi()
    controller = Controller(cast(Api, api))
    controller.fleet = fleet_of([gpu(0)], policies=[failing, healthy])
    for view in controller.fleet.gpu_nodes():
        decision = decide_node(controller.fleet, view.name, 0.0)
        if decision is not None:
            controller.decisions[view.name] = decision

    await controller.write_policy_statuses()

    assert _degraded("broken", "PlanFailed") == 1.0
    assert _degraded("fine", "PlanFailed") is None
    assert {name for name, _ in api.patches} == {"broken", "fine"}

    controller.fleet.set_policy(policy_body("broken", generation=2, **TIME_SLICED))
    controller.decisions.clear()
    await controller.write_policy_statuses()
    assert _degraded("broken", "PlanFailed") is None
