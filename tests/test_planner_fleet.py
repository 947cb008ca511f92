"""Matching policies to nodes and GPUs (label selectors, CEL gpuSelectors), conflicts, the
inventory file format, and the fleet planner's determinism."""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import pytest

from tessera.models.layout import GpuStatus
from tessera.models.policy import SharingPolicy, Strategy
from tessera.planner import GpuSelectorError, NodeInventory, PlanErrorReason, compile_gpu_selector, plan_fleet
from tessera.planner import fleet as fleet_module
from tessera.planner import selector as selector_module
from tessera.planner.fleet import FleetPlan, PlanMemo
from tessera.planner.inventory import InventoryError, catalog_gpu, gpu_uuid, parse_inventory

H100 = catalog_gpu("n", 0, "H100-80GB", driver_version="580.65.06", pci_bus_id="00000000:3B:00.0",
                   pcie_root="pci0000:3a")
A100 = catalog_gpu("n", 1, "A100-40GB")
L4 = GpuStatus(uuid="GPU-l4", index=2, product_name="NVIDIA L4", memory_mib=23034)


def _policy(name: str, **spec: Any) -> SharingPolicy:
    return SharingPolicy.model_validate({"metadata": {"name": name}, "spec": spec})


def _cel(expr: str) -> dict[str, str]:
    return {"cel": expr}


@pytest.mark.parametrize(
    ("expression", "h100", "a100"),
    [
        ('device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100")', True, False),
        ('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) > 0', True, False),
        ('device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("39Gi"))', True, True),
        ('device.capacity["gpu.tessera.dev"].memory.isLessThan(quantity("50G"))', False, True),
        ('device.capacity["gpu.tessera.dev"].memory == quantity("40960Mi")', False, True),
        ('device.attributes["gpu.tessera.dev"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))', True, False),
        ('device.attributes["gpu.tessera.dev"].cudaComputeCapability.major() == 8', False, True),
        ('device.attributes["gpu.tessera.dev"].architecture == "Hopper"', True, False),
        (
            'device.attributes["gpu.tessera.dev"].migCapable && device.attributes["gpu.tessera.dev"].index == 0',
            True,
            False,
        ),
        ('has(device.attributes["gpu.tessera.dev"].driverVersion)', True, False),
        (
            'has(device.attributes["resource.kubernetes.io"].pcieRoot) && '
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:3a"',
            True,
            False,
        ),
        ('device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"', True, True),
        (
            'device.capacity["gpu.tessera.dev"].memory.add(quantity("1Gi")).sub(1).asInteger() > 53687091200',
            True,
            False,
        ),
    ],
)
def test_gpu_selector_sees_the_published_attributes(expression: str, h100: bool, a100: bool) -> None:
    selector = compile_gpu_selector(expression)
    assert (selector.matches(H100), selector.matches(A100)) == (h100, a100)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('device.attributes["gpu.tessera.dev"', "does not parse: at column"),
        ('device.attributes["gpu.tessera.dev"].colour == "green"', "the device has no 'colour'"),
        ('device.capacity["gpu.tessera.dev"].memory > 4', "No such overload"),
        ('device.capacity["gpu.tessera.dev"].memory.compareTo(40) > 0', "compares two quantities or two semantic"),
        ('device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("forty"))', "not a quantity"),
        ('device.attributes["gpu.tessera.dev"].productName', "must give true or false, not str"),
        ("nvidia(1)", "Undefined variable or function: 'nvidia'"),
    ],
)
def test_bad_gpu_selector_is_a_clear_error_not_a_crash(expression: str, message: str) -> None:
    with pytest.raises(GpuSelectorError, match="gpuSelector") as caught:
        compile_gpu_selector(expression).matches(H100)
    assert message in str(caught.value)


def test_selector_results_are_remembered_per_distinct_gpu_kind() -> None:
    selector = compile_gpu_selector('device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H")')
    for i in range(20):
        assert selector.matches(catalog_gpu(f"n{i}", i % 8, "H100-80GB"))
    assert len(selector._memo) == 1


def test_the_cel_evaluator_is_loaded_without_the_packages_interactive_cli() -> None:
    """The planner evaluates CEL with the compiled evaluator alone: the package's own
    ``__init__`` would also load its CLI (prompt_toolkit, typer), ~25 MiB in every operator."""
    probe = (
        "import sys\n"
        "from tessera.planner import compile_gpu_selector\n"
        "from tessera.planner.inventory import catalog_gpu\n"
        "memory = 'device.capacity[\"gpu.tessera.dev\"].memory'\n"
        "selector = compile_gpu_selector(memory + '.isGreaterThan(quantity(\"40Gi\"))')\n"
        "assert selector.matches(catalog_gpu('n', 0, 'H100-80GB'))\n"
        "assert not selector.matches(catalog_gpu('n', 1, 'A100-40GB'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cel', 'prompt_toolkit', 'typer')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['cel.cel']"


def test_priority_wins_then_name_and_losers_are_conflicts() -> None:
    node = NodeInventory("n", {"pool": "a"}, [H100, A100])
    policies = [
        _policy("zeta", priority=10, strategy="TimeSlicing"),
        _policy("alpha", priority=10, strategy="MPS"),
        _policy(
            "high",
            priority=20,
            strategy="MIG",
            mig={"preset": "whole"},
            gpuSelector=_cel('device.attributes["gpu.tessera.dev"].architecture == "Hopper"'),
        ),
    ]
    plan = plan_fleet(policies, [node])
    assert [(p.policy, p.layout.strategy if p.layout else None) for p in plan.gpus] == [
        ("high", Strategy.MIG),
        ("alpha", Strategy.MPS),
    ]
    assert [(c.gpu, c.winner, c.losers) for c in plan.conflicts] == [
        (H100.uuid, "high", ("alpha", "zeta")),
        (A100.uuid, "alpha", ("zeta",)),
    ]
    assert [c.winner for c in plan.conflicts_of("zeta")] == ["high", "alpha"]
    assert plan.gpus[0].candidates == ("high", "alpha", "zeta")


def test_node_selector_and_unselected_gpus_are_unmanaged() -> None:
    nodes = [
        NodeInventory("inference", {"pool": "inference"}, [H100]),
        NodeInventory("batch", {"pool": "batch"}, [A100]),
    ]
    policy = _policy(
        "inf",
        strategy="TimeSlicing",
        nodeSelector={"matchExpressions": [{"key": "pool", "operator": "In", "values": ["inference"]}]},
    )
    plan = plan_fleet([policy], nodes)
    by_node = {p.node: p for p in plan.gpus}
    assert by_node["inference"].policy == "inf"
    assert by_node["batch"].policy is None
    assert by_node["batch"].unmanaged, "a GPU no policy selects gets no layout: it is left as it is"
    assert by_node["batch"].layout is None
    assert by_node["batch"].error is None
    assert not by_node["inference"].unmanaged
    assert [p.gpu.uuid for p in plan.of_policy("inf")] == [H100.uuid]


def test_bad_selector_policy_selects_nothing_and_is_reported() -> None:
    plan = plan_fleet(
        [_policy("broken", gpuSelector=_cel("device.attributes[")), _policy("ok")], [NodeInventory("n", {}, [H100])]
    )
    assert "broken" in plan.policy_errors
    assert "does not parse" in plan.policy_errors["broken"]
    assert plan.gpus[0].policy == "ok"


def test_selector_that_fails_on_a_gpu_is_that_gpus_error() -> None:
    policy = _policy(
        "needs-driver",
        gpuSelector=_cel('device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("1.0.0"))'),
    )
    plan = plan_fleet([policy], [NodeInventory("n", {}, [H100, A100])])
    assert plan.gpus[0].policy == "needs-driver"
    assert plan.gpus[1].error is not None
    assert plan.gpus[1].error.reason is PlanErrorReason.SELECTOR
    assert "driverVersion" in plan.gpus[1].error.message


def test_mig_policy_on_a_gpu_without_mig_is_an_error_for_that_gpu_only() -> None:
    plan = plan_fleet([_policy("mig", strategy="MIG", mig={"preset": "all-1g"})], [NodeInventory("n", {}, [H100, L4])])
    assert plan.gpus[0].ok
    assert plan.gpus[0].layout is not None
    assert len(plan.gpus[0].layout.mig_instances) == 7
    assert not plan.gpus[1].ok
    assert plan.gpus[1].error is not None
    assert plan.gpus[1].error.reason is PlanErrorReason.NO_MIG


def test_same_input_same_output_whatever_the_order() -> None:
    nodes = parse_inventory(
        {
            "nodes": [
                {
                    "name": f"n{i}",
                    "labels": {"pool": ["a", "b"][i % 2]},
                    "simulate": ["2xH100-80GB", "A100-40GB", "B200"][i % 3],
                }
                for i in range(12)
            ]
        }
    )
    policies = [
        _policy(
            "a-mig",
            priority=5,
            nodeSelector={"matchLabels": {"pool": "a"}},
            strategy="MIG",
            mig={"preset": "all-balanced"},
        ),
        _policy("ts", strategy="TimeSlicing"),
        _policy(
            "big",
            priority=5,
            strategy="MPS",
            gpuSelector=_cel('device.capacity["gpu.tessera.dev"].memory.isGreaterThan(quantity("100Gi"))'),
        ),
    ]
    first = plan_fleet(policies, nodes)
    shuffled_nodes, shuffled_policies = list(nodes), list(policies)
    random.Random(7).shuffle(shuffled_nodes)
    random.Random(8).shuffle(shuffled_policies)
    second = plan_fleet(shuffled_policies, shuffled_nodes)
    assert [(p.node, p.gpu.uuid, p.policy, p.layout) for p in first.gpus] == [
        (p.node, p.gpu.uuid, p.policy, p.layout) for p in second.gpus
    ]
    assert first.conflicts == second.conflicts


def test_inventory_short_form_and_explicit_gpus() -> None:
    nodes = parse_inventory(
        {
            "nodes": [
                {"name": "a", "labels": {"pool": "x"}, "simulate": "2xH100-80GB"},
                {
                    "name": "b",
                    "gpus": [
                        {"model": "A100-80GB", "migInstances": [{"profile": "3g.40gb", "start": 4, "inUse": True}]},
                        {"productName": "NVIDIA L4", "memoryMiB": 23034},
                    ],
                },
            ]
        }
    )
    assert [g.uuid for g in nodes[0].gpus] == [gpu_uuid("a", 0), gpu_uuid("a", 1)]
    assert nodes[0].labels == {"pool": "x"}
    a100, l4 = nodes[1].gpus
    assert a100.mig_mode_current
    assert a100.mig_instances[0].in_use
    assert a100.mig_instances[0].size == 4
    assert a100.mig_instances[0].memory_mib == 40192
    assert (l4.index, l4.model, l4.mig_capable, l4.memory_mib) == (1, None, False, 23034)
    assert parse_inventory({"nodes": [{"name": "a", "simulate": "2xH100-80GB"}]})[0].gpus == nodes[0].gpus


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"node": []}, "a list under 'nodes'"),
        ({"nodes": [{"labels": {}}]}, "nodes[0] needs a name"),
        ({"nodes": [{"name": "a"}, {"name": "a"}]}, "node a appears twice"),
        ({"nodes": [{"name": "a", "simulate": "4xV100"}]}, "unknown GPU model 'V100'; known models: A100-40GB"),
        ({"nodes": [{"name": "a", "simulate": "lots of H100"}]}, "should look like 4xH100-80GB"),
        ({"nodes": [{"name": "a", "gpu": []}]}, "unknown field gpu"),
        (
            {
                "nodes": [
                    {
                        "name": "a",
                        "gpus": [{"model": "H100-80GB", "migInstances": [{"profile": "3g.20gb", "start": 0}]}],
                    }
                ]
            },
            "H100-80GB has no MIG profile '3g.20gb'",
        ),
        ({"nodes": [{"name": "a", "gpus": [{"productName": "X", "memoryMiB": -1}]}]}, "memory_mib"),
    ],
)
def test_bad_inventory_says_where(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(data)
    assert message in str(caught.value)


# -- compiled once ---------------------------------------------------------------------------


@pytest.fixture
def cel_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every expression the CEL library parses while the test runs."""
    parsed: list[str] = []
    real_compile = selector_module.cel.compile

    def counting_compile(source: str) -> Any:
        parsed.append(source)
        return real_compile(source)

    monkeypatch.setattr(selector_module.cel, "compile", counting_compile)
    return parsed


def test_a_second_compile_of_the_same_expression_does_not_parse_it_again(cel_parses: list[str]) -> None:
    expression = 'device.attributes["gpu.tessera.dev"].productName == "compiled once"'
    first = compile_gpu_selector(expression)
    second = compile_gpu_selector(expression)
    assert second is first, "the same selector, with its memo of verdicts"
    assert cel_parses == [expression]


def test_every_node_reconcile_reuses_the_compiled_selector(cel_parses: list[str]) -> None:
    expression = 'device.attributes["gpu.tessera.dev"].architecture == "Hopper" || false'
    policy = _policy("hopper", gpuSelector=_cel(expression))
    for node in ("a", "b", "c"):
        plan = plan_fleet([policy], [NodeInventory(node, {}, [H100])])
        assert plan.gpus[0].policy == "hopper"
    assert cel_parses == [expression]


def test_an_expression_that_does_not_parse_is_refused_every_time_but_parsed_once(cel_parses: list[str]) -> None:
    expression = 'device.attributes["gpu.tessera.dev"].index == (1'
    for _ in range(2):
        with pytest.raises(GpuSelectorError, match="does not parse"):
            compile_gpu_selector(expression)
    assert cel_parses == [expression]


def test_the_compiled_selectors_are_bounded_by_count(cel_parses: list[str]) -> None:
    expression = 'device.attributes["gpu.tessera.dev"].index == 0 && true'
    compile_gpu_selector(expression)
    for n in range(selector_module._COMPILED_LIMIT):
        compile_gpu_selector(f'device.attributes["gpu.tessera.dev"].index == {n + 1000}')
    compile_gpu_selector(expression)
    assert cel_parses.count(expression) == 2, "the oldest expression was dropped and compiled again"


# -- the plan memo across calls --------------------------------------------------------------

# Instance sets that exist on an H100 (profile, start), each instance in use or not at random.
H100_LAYOUTS = (
    (),
    (("7g.80gb", 0),),
    (("3g.40gb", 0), ("3g.40gb", 4)),
    (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)),
    (("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)),
)
MEMO_POLICY_SPECS: tuple[dict[str, Any], ...] = (
    {"strategy": "MIG", "mig": {"preset": "all-balanced"}},
    {"strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}},
    {"strategy": "MIG", "mig": {"preset": "whole"}},
    {"strategy": "TimeSlicing"},
    {"strategy": "MPS"},
    {"strategy": "DynamicMIG"},
    {"strategy": "Adaptive", "adaptive": {"layouts": [{"name": "whole"}, {"name": "halves", "strategy": "MIG",
                                                                          "mig": {"profiles": {"3g.40gb": 2}}}],
                                          "idle": "whole"}},
)


def _random_gpu(rng: random.Random, node: str, index: int) -> GpuStatus:
    layout = rng.choice(H100_LAYOUTS)
    instances = [{"profile": profile, "start": start, "size": int(profile[0]) if profile[0] != "7" else 8,
                  "uuid": f"MIG-{node}-{index}-{start}", "gpu_instance_id": n,
                  "memory_mib": 10240 * (int(profile[0]) if profile[0] != "7" else 8), "in_use": rng.random() < 0.3}
                 for n, (profile, start) in enumerate(layout, start=1)]
    return catalog_gpu(node, index, "H100-80GB", mig_instances=instances,
                       mig_mode_current=bool(instances) or rng.random() < 0.2,
                       in_use=not instances and rng.random() < 0.2)


def _plans_as_values(plan: FleetPlan) -> list[tuple[Any, ...]]:
    """A plan's GPUs as values (a PlanError is an exception: equal only to itself)."""
    return [(p.node, p.gpu, p.policy, p.layout, p.candidates, p.selector_errors,
             None if p.error is None else (p.error.reason, str(p.error), p.error.blocking, p.error.when_idle))
            for p in plan.gpus] + [plan.conflicts, dict(plan.policy_errors)]


@pytest.mark.parametrize("seed", range(5))
def test_plans_kept_across_calls_are_the_plans_a_fresh_call_makes(seed: int) -> None:
    """One memo over many calls of one node each, as the operator's decisions make them, with
    random GPUs (MIG or not, instances in use or not), policies whose specs are replaced (new
    objects, some equal) between calls, and adaptive choices: every plan is the plan a call
    with no memo makes, and the memo does plan fewer GPUs than it is asked for."""
    rng = random.Random(seed)
    memo = PlanMemo()
    planned: list[int] = []
    real = fleet_module.plan_gpu_layout

    def counted(*args: Any, **kwargs: Any) -> Any:
        planned.append(1)
        return real(*args, **kwargs)

    asked = 0
    policies = [_policy("p", **rng.choice(MEMO_POLICY_SPECS))]
    for call in range(300):
        if rng.random() < 0.05:
            policies = [_policy("p", **rng.choice(MEMO_POLICY_SPECS))]  # a new spec object, maybe equal
        if rng.random() < 0.05:
            policies = [*policies[:1], _policy("q", priority=1, **rng.choice(MEMO_POLICY_SPECS))]
        node = NodeInventory(f"n{call % 7}", {}, [_random_gpu(rng, f"n{call % 7}", i) for i in range(4)])
        choices = {g.uuid: rng.choice(["whole", "halves", "none"]) for g in node.gpus if rng.random() < 0.5}
        fleet_module.plan_gpu_layout = counted  # type: ignore[assignment]
        try:
            kept = plan_fleet(policies, [node], choices, memo)
        finally:
            fleet_module.plan_gpu_layout = real
        fresh = plan_fleet(policies, [node], choices)
        asked += len(node.gpus)
        assert _plans_as_values(kept) == _plans_as_values(fresh), f"seed {seed}, call {call}"
    assert len(planned) < asked / 2, f"the memo planned {len(planned)} of {asked} GPUs"


def test_the_plan_memo_starts_again_at_its_limit() -> None:
    memo = PlanMemo(limit=3)
    policy = _policy("p", strategy="MIG", mig={"preset": "all-balanced"})
    gpus = [catalog_gpu("n", i, model) for i, model in enumerate(["H100-80GB", "A100-40GB", "A100-80GB", "B200"])]
    for gpu in gpus:
        plan_fleet([policy], [NodeInventory("n", {}, [gpu])], None, memo)
    assert len(memo._plans) <= 3
    assert _plans_as_values(plan_fleet([policy], [NodeInventory("n", {}, gpus)], None, memo)) == _plans_as_values(
        plan_fleet([policy], [NodeInventory("n", {}, gpus)]))
