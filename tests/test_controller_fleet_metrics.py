"""What the operator exports for the chart's alerts and dashboard after each pass over the
policies' status: ``tessera_operator_policy_degraded`` (one series per Degraded policy, labels
policy and reason, gone once it is fixed), ``tessera_operator_gpus`` per strategy and
``tessera_operator_devices`` allocated and free (``fleet_figures``, pure)."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from tessera.controller.decide import NodeDecision, decide_node
from tessera.controller.fleetmetrics import StrategyMemo, fleet_figures
from tessera.controller.state import Fleet
from tessera.controller.statuswriter import PolicyStatusWriter
from tessera.models.policy import Strategy
from tests.controller_fleet import NODE, claim_body, fleet_of, layout_body, policy_body
from tests.dra_gpus import gpu

TIME_SLICED = {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}}


class StatusApi:
    """Records the status patches a status pass writes."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def patch_status(self, name: str, status: dict[str, Any]) -> None:
        self.patches.append((name, status))

    async def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        return None


def _decisions(fleet: Fleet) -> list[NodeDecision]:
    out = [decide_node(fleet, view.name, 0.0) for view in fleet.gpu_nodes()]
    return [d for d in out if d is not None]


def test_fleet_figures_count_gpus_per_strategy_and_each_held_device_once() -> None:
    sliced = gpu(1, Strategy.TIME_SLICING)
    fleet = fleet_of([gpu(0), sliced, gpu(2)], claims=[
        claim_body("a", ["gpu-0"]), claim_body("b", ["gpu-1"]), claim_body("c", ["gpu-1"]),
        claim_body("elsewhere", [("other-node", "gpu-0")]), claim_body("pending"),
    ])
    decisions = _decisions(fleet)

    figures = fleet_figures(fleet, decisions)

    assert figures.gpus_by_strategy == {"Exclusive": 2, "TimeSlicing": 1}
    assert figures.devices_published == sum(sum(d.device_counts.values()) for d in decisions) == 3
    assert (figures.devices_allocated, figures.devices_free) == (2, 1)


def test_fleet_figures_count_a_node_again_only_when_its_status_is_a_new_one() -> None:
    fleet = fleet_of([gpu(0), gpu(1, Strategy.TIME_SLICING)])
    memo: StrategyMemo = {}
    first = fleet_figures(fleet, [], memo)
    counted = memo[NODE][1]
    assert fleet_figures(fleet, [], memo) == first
    assert memo[NODE][1] is counted, "the same status: the same counts, not counted again"

    fleet.set_layout(layout_body([gpu(0, Strategy.MPS), gpu(1, Strategy.MPS), gpu(2)]))
    assert fleet_figures(fleet, [], memo).gpus_by_strategy == {"Exclusive": 1, "MPS": 2}
    assert fleet_figures(fleet, [], memo) == fleet_figures(fleet, []), "as without the memo"

    fleet.remove_node(NODE)
    assert fleet_figures(fleet, [], memo).gpus_by_strategy == {}
    assert memo == {}, "a node gone is forgotten"


def _degraded(policy: str, reason: str) -> float | None:
    return REGISTRY.get_sample_value("tessera_operator_policy_degraded", {"policy": policy, "reason": reason})


async def test_a_degraded_policy_is_one_series_until_it_is_fixed() -> None:
    failing = policy_body("broken", gpuSelector={"cel": 'device.attributes["gpu.tessera.dev"].nosuch == 1'},
                          **TIME_SLICED)
    healthy = policy_body("fine", nodeSelector={"matchLabels": {"a": "b"}}, **TIME_SLICED)
    api = StatusApi()
    fleet = fleet_of([gpu(0)], policies=[failing, healthy], claims=[claim_body("a", ["gpu-0"])])
    decisions = {d.node: d for d in _decisions(fleet)}
    writer = PolicyStatusWriter(fleet, decisions, api.patch_status, api.post_event)

    await writer.write_all()

    assert _degraded("broken", "PlanFailed") == 1.0
    assert REGISTRY.get_sample_value("tessera_operator_gpus", {"strategy": "Exclusive"}) == 1.0
    assert REGISTRY.get_sample_value("tessera_operator_devices", {"state": "allocated"}) == 1.0
    assert REGISTRY.get_sample_value("tessera_operator_devices", {"state": "free"}) == 0.0
    assert _degraded("fine", "PlanFailed") is None
    assert {name for name, _ in api.patches} == {"broken", "fine"}

    fleet.set_policy(policy_body("broken", generation=2, **TIME_SLICED))
    decisions.clear()
    await writer.write_all()
    assert _degraded("broken", "PlanFailed") is None


def _request_claim(name: str, *, exactly: str | None = None, first: tuple[str, ...] = ()) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu"}
    if exactly:
        request["exactly"] = {"deviceClassName": exactly}
    if first:
        request["firstAvailable"] = [{"name": f"alt{i}", "deviceClassName": c} for i, c in enumerate(first)]
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"devices": {"requests": [request]}},
            "status": {}}


def test_pending_claims_are_the_unallocated_ones_on_tesseras_classes_and_the_gauge_follows_them() -> None:
    fleet = Fleet()
    # The operator's status writer binds the gauge to its fleet.
    PolicyStatusWriter(fleet, {}, StatusApi().patch_status, StatusApi().post_event)
    fleet.set_claim(_request_claim("mig", exactly="mig.tessera.dev"))
    fleet.set_claim(_request_claim("either", first=("example.com-gpu", "high-memory-gpu")))
    fleet.set_claim(_request_claim("not-ours", exactly="example.com-gpu"))
    assert fleet.pending_claims == {"default/mig", "default/either"}
    assert REGISTRY.get_sample_value("tessera_operator_pending_claims") == 2.0

    allocated = _request_claim("mig", exactly="mig.tessera.dev")
    allocated["status"] = claim_body("mig", ["gpu-0"])["status"]
    fleet.set_claim(allocated)
    fleet.remove_claim("default", "either")
    assert fleet.pending_claims == set()
    assert REGISTRY.get_sample_value("tessera_operator_pending_claims") == 0.0
