"""Benchmark: bursts of Pods that fill a shared GPU, with and without the operator's scheduler wake.

    .venv/bin/python benchmarks/bench_share_burst.py [--rounds 40] [--stuck-after 60]

kube-scheduler 1.36.5 may refuse the last Pod of a burst that fills a shared device while it
counts another claim's share twice (``tessera.controller.schedwake``); with its default
``--pod-max-in-unschedulable-pods-duration`` (five minutes, set back here as a real cluster
has it) that Pod then waits until something wakes the scheduler.

One kubelet-less node with a simulated A100 80GB (80Gi) under an MPS policy. Each round creates
four Pods at once, each with a claim of 20Gi of the shared GPU (together they fill it exactly,
so every Pod after the first may be refused when a share before it counts twice), times how
long until all four claims are allocated, then deletes the Pods and waits until their claims
are gone. Rounds alternate between two DeviceClasses that select the same shared GPU:
Tessera's ``shared-gpu.tessera.dev`` (the operator wakes the scheduler for its claims) and a
copy of it under another name (the operator does not know it, so nothing wakes the
scheduler). A round still short of four allocations after ``--stuck-after`` seconds is counted
as stuck and ended. At the scheduler's usual logging (``--scheduler-verbosity 0``) the double
count is rare (CI hit it once in many runs); at 5 the scheduler is slower and it shows more often.

Prints per class: the rounds, the rounds in which the scheduler refused a Pod at least once (its
``scheduler_schedule_attempts_total{result="unschedulable"}``), the time to all four allocated
(p50 and max, stuck rounds left out) and the stuck rounds; then the operator's wakes
(``tessera_operator_scheduler_wakes_total``). Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the helpers live beside the integration tests

from tests.integration.kube_helpers import apply, gpu_node, node_devices, policy  # noqa: E402

from tessera.dra.deviceclasses import device_classes  # noqa: E402
from tessera.localcluster import LocalCluster  # noqa: E402
from tessera.localcluster.cluster import wait_for  # noqa: E402
from tessera.localcluster.processes import TesseraProcesses  # noqa: E402
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim  # noqa: E402

NODE, NAMESPACE, SIMULATE, SHARE = "burst-a", "burst", "1xA100-80GB", "20Gi"
CLASSES = {"woken": "shared-gpu.tessera.dev", "not woken": "shared-copy.bench.tessera.dev"}
PODS_PER_ROUND = 4


def refusals(cluster: LocalCluster) -> float:
    return sum(v for k, v in cluster.scheduler_metrics().items()
               if k.startswith("scheduler_schedule_attempts_total") and 'result="unschedulable"' in k)


def claims(cluster: LocalCluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]
    return items


async def one_round(cluster: LocalCluster, index: int, template: str, stuck_after: float) -> tuple[float | None, bool]:
    """(seconds to all allocated, or None when stuck; whether a Pod was refused on the way)."""
    refused_before = refusals(cluster)
    pods = [f"r{index}-{i}" for i in range(PODS_PER_ROUND)]
    started = time.monotonic()
    apply(cluster, *(pod_with_claim(p, NAMESPACE, template, on_node(NODE)) for p in pods))
    took: float | None = None
    while time.monotonic() - started < stuck_after:
        allocated = sum(1 for c in claims(cluster) if (c.get("status") or {}).get("allocation"))
        if allocated == PODS_PER_ROUND:
            took = time.monotonic() - started
            break
        await asyncio.sleep(0.1)
    refused = refusals(cluster) > refused_before
    cluster.kubectl("delete", "pods", *pods, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false")
    await wait_for(lambda: not claims(cluster), timeout=120, message="the round's claims to go")
    return took, refused


async def run(rounds: int, stuck_after: float, verbosity: int) -> None:
    scheduler_args = ("--pod-max-in-unschedulable-pods-duration=5m", f"--v={verbosity}")
    with LocalCluster.start(scheduler_args=scheduler_args) as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        copy = next(c for c in device_classes() if c["metadata"]["name"] == CLASSES["woken"])
        copy["metadata"] = {"name": CLASSES["not woken"]}
        cluster.apply_objects([copy])
        processes = TesseraProcesses(cluster, Path(tempfile.mkdtemp(prefix="tessera-burst-")))
        try:
            operator = processes.operator()
            gpu_node(cluster, processes, NODE, "burst", SIMULATE)
            mps = {"strategy": "MPS", "mps": {"memory": {"default": SHARE, "min": "1Gi", "step": "1Gi"}}}
            apply(cluster, policy("burst", "burst", mps))
            await wait_for(lambda: node_devices(cluster, NODE).get("gpu-0", {}).get("allowMultipleAllocations"),
                           timeout=120, message="the shared GPU to be published")
            cluster.kubectl("create", "namespace", NAMESPACE)
            await wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE,
                                                   check=False).returncode == 0, timeout=30, message="the namespace")
            templates = {kind: f"share-{i}" for i, kind in enumerate(CLASSES)}
            apply(cluster, *(claim_template(templates[kind], NAMESPACE, device_class, capacity={"memory": SHARE})
                             for kind, device_class in CLASSES.items()))
            results: dict[str, list[tuple[float | None, bool]]] = {kind: [] for kind in CLASSES}
            for index in range(rounds):
                kind = list(CLASSES)[index % 2]
                results[kind].append(await one_round(cluster, index, templates[kind], stuck_after))
                took, refused = results[kind][-1]
                print(f"round {index:3} {kind:9} {'stuck' if took is None else f'{took:5.2f} s'}"
                      f"{'  (a Pod was refused)' if refused else ''}", flush=True)
            print()
            for kind, rows in results.items():
                times = sorted(t for t, _ in rows if t is not None)
                with_refusal = sum(1 for _, r in rows if r)
                stuck = sum(1 for t, _ in rows if t is None)
                spread = f"p50 {statistics.median(times):.2f} s, max {times[-1]:.2f} s" if times else "none finished"
                print(f"{CLASSES[kind]} ({kind}): {len(rows)} rounds, {with_refusal} with a refusal, "
                      f"all four allocated {spread}, stuck past {stuck_after:.0f} s: {stuck}", flush=True)
            wakes = operator.metrics().get("tessera_operator_scheduler_wakes_total", 0.0)
            print(f"operator's scheduler wakes: {wakes:.0f}", flush=True)
        finally:
            processes.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--stuck-after", type=float, default=60.0)
    parser.add_argument("--scheduler-verbosity", type=int, default=0,
                        help="kube-scheduler's --v: its logging at 5 slows it enough to widen the double count's "
                        "window (the race shows more often; say so beside the figures)")
    args = parser.parse_args()
    asyncio.run(run(args.rounds, args.stuck_after, args.scheduler_verbosity))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
