"""Benchmark: plan 10,000 GPUs (1,250 nodes x 8) under mixed policies and print the time.

    .venv/bin/python benchmarks/bench_planner.py [--gpus 10000] [--repeat 5]

The fleet mixes five catalog models and three pools; a fifth of the MIG GPUs already run a
layout with an instance in use, some of which block the new layout. Policies use node
selectors, CEL gpuSelectors (product name, quantity comparison), MIG profiles and presets
with MPS sharing, DynamicMIG, time-slicing and MPS, with overlaps resolved by priority.
Each repeat plans the whole fleet with plan_fleet (the placement tables of tessera.planner.mig
and the compiled selectors stay warm after the first, as in a running operator).
Then it plans node by node, as the operator's reconcile does, twice: with gpuSelectors
compiled once (and their memos kept), and with every selector compiled afresh for each node
(as before the compile cache); the difference is the per-node selector cost saved.
Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tessera.models.catalog import MODELS_BY_KEY
from tessera.models.layout import GpuStatus, MigInstanceStatus
from tessera.models.policy import SharingPolicy
from tessera.planner import NodeInventory, plan_fleet
from tessera.planner.inventory import catalog_gpu, mig_uuid
from tessera.planner.selector import forget_compiled_selectors

MODELS = ["H100-80GB", "A100-80GB", "A100-40GB", "H200-141GB", "B200"]
POOLS = ["inference", "training", "dev"]


def _policies() -> list[SharingPolicy]:
    specs = [
        (
            "h100-inference",
            {
                "priority": 100,
                "nodeSelector": {"matchLabels": {"pool": "inference"}},
                "gpuSelector": {"cel": 'device.attributes["gpu.tessera.dev"].productName.startsWith("NVIDIA H100")'},
                "strategy": "MIG",
                "mig": {"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, "sharing": {"strategy": "MPS"}},
            },
        ),
        (
            "big-memory",
            {
                "priority": 50,
                "gpuSelector": {"cel": 'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("100Gi")) > 0'},
                "strategy": "MIG",
                "mig": {"preset": "all-balanced"},
            },
        ),
        (
            "a100-training",
            {
                "priority": 40,
                "nodeSelector": {"matchLabels": {"pool": "training"}},
                "gpuSelector": {"cel": 'device.attributes["gpu.tessera.dev"].architecture == "Ampere"'},
                "strategy": "DynamicMIG",
            },
        ),
        (
            "inference-small",
            {
                "priority": 30,
                "nodeSelector": {"matchLabels": {"pool": "inference"}},
                "strategy": "MIG",
                "mig": {"preset": "all-1g"},
            },
        ),
        (
            "dev-ts",
            {
                "priority": 10,
                "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["dev"]}]},
                "strategy": "TimeSlicing",
                "timeSlicing": {"replicas": 4},
            },
        ),
        ("default-mps", {"strategy": "MPS"}),
    ]
    return [SharingPolicy.model_validate({"metadata": {"name": n}, "spec": s}) for n, s in specs]


def _fleet(total: int) -> list[NodeInventory]:
    nodes: list[NodeInventory] = []
    for n in range(total // 8):
        name = f"node-{n:05d}"
        model = MODELS[n % len(MODELS)]
        gpus: list[GpuStatus] = []
        for i in range(8):
            gpu = catalog_gpu(name, i, model, driver_version="580.65.06")
            if (n * 8 + i) % 5 == 0:  # a fifth already run MIG, with one instance in use
                profile = MODELS_BY_KEY[model].profiles[0]
                start = (n + i) % 7
                instance = MigInstanceStatus(
                    profile=profile.name,
                    start=start,
                    size=1,
                    uuid=mig_uuid(gpu.uuid, start, profile.name),
                    gpu_instance_id=1,
                    memory_mib=profile.memory_mib,
                    in_use=True,
                )
                gpu = gpu.model_copy(update={"mig_mode_current": True, "mig_instances": [instance]})
            gpus.append(gpu)
        nodes.append(NodeInventory(name, {"pool": POOLS[n % len(POOLS)]}, gpus))
    return nodes


def _per_node(policies: list[SharingPolicy], nodes: list[NodeInventory], *, compile_each_node: bool) -> float:
    """Seconds per node to plan the fleet one node at a time, as the operator's reconciles do."""
    plan_fleet(policies, nodes[:1])  # warm: the selectors are compiled once in a running operator
    started = time.perf_counter()
    for node in nodes:
        if compile_each_node:
            forget_compiled_selectors()
        plan_fleet(policies, [node])
    return (time.perf_counter() - started) / len(nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    policies, nodes = _policies(), _fleet(args.gpus)
    gpus = sum(len(n.gpus) for n in nodes)
    times: list[float] = []
    plan = None
    for _ in range(args.repeat):
        started = time.perf_counter()
        plan = plan_fleet(policies, nodes)
        times.append(time.perf_counter() - started)
    assert plan is not None
    errors = sum(1 for p in plan.gpus if p.error is not None)
    by_policy = {p.name: len(plan.of_policy(p.name)) for p in policies}
    print(f"planned {gpus} GPUs on {len(nodes)} nodes under {len(policies)} policies")
    print(f"  first run: {times[0] * 1000:.1f} ms ({times[0] / gpus * 1e6:.1f} us per GPU, cold caches)")
    best, median = min(times), statistics.median(times)
    print(
        f"  best of {len(times)}: {best * 1000:.1f} ms ({best / gpus * 1e6:.1f} us per GPU); "
        f"median {median * 1000:.1f} ms"
    )
    print(f"  {errors} GPUs blocked or refused, {len(plan.conflicts)} conflicts; won per policy: {by_policy}")
    fresh = min(_per_node(policies, nodes, compile_each_node=True) for _ in range(args.repeat))
    cached = min(_per_node(policies, nodes, compile_each_node=False) for _ in range(args.repeat))
    print(
        f"node by node ({len(nodes)} reconciles, best of {args.repeat}): "
        f"{fresh * 1e6:.0f} us per node compiling the selectors each time, "
        f"{cached * 1e6:.0f} us compiled once; {(fresh - cached) * 1e6:.0f} us per node saved"
    )


if __name__ == "__main__":
    main()
