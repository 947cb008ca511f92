"""Long seeded fault campaign: policy churn and claims on simulated nodes while the operator,
the agents and the kube-apiserver are killed at random (``tests/integration/campaign.py``).

    .venv/bin/python benchmarks/fault_campaign.py [--seeds 1,2,3] [--steps 300] [--nodes 3]

Starts its own control plane per seed, prints per seed the faults injected, the invariant
checks and violations (must be 0), convergence after faults stop (p50/p99) and the writes of
a restarted operator with nothing new (must be 0); exits 1 on any violation. A failing seed
replays its actions and pauses with the same ``--seeds``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the campaign lives beside the integration tests

from tests.integration.campaign import Campaign, CampaignReport  # noqa: E402

from tessera.localcluster import LocalCluster  # noqa: E402 (after the path above)
from tessera.localcluster.processes import TesseraProcesses  # noqa: E402


async def one(seed: int, steps: int, nodes: int) -> CampaignReport:
    """One seed's campaign; its processes' logs are kept (and named) if it fails, finds a
    violation, or its restarted operator writes."""
    folder = Path(tempfile.mkdtemp(prefix=f"tessera-campaign-{seed}-"))
    kept = True
    with LocalCluster.start() as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml", ROOT / "manifests" / "namespace.yaml")
        processes = TesseraProcesses(cluster, folder)
        processes.operator()
        try:
            campaign = Campaign(cluster, processes, seed, nodes)
            await campaign.setup()
            report = await campaign.run(steps)
            kept = bool(report.violations) or report.restart_writes != 0
            return report
        finally:
            processes.stop_all()
            if kept:
                print(f"seed {seed}: the processes' logs are in {folder}", flush=True)
            else:
                shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    failed = False
    convergence: list[float] = []
    faults = violations = 0
    for seed in (int(s) for s in args.seeds.split(",")):
        report = asyncio.run(one(seed, args.steps, args.nodes))
        print(report.summary(), flush=True)
        for v in report.violations:
            print(f"  VIOLATION: {v}")
        for late in report.stale_allocations:
            print(f"  stale scheduler view (not a violation): {late}")
        failed |= bool(report.violations) or report.restart_writes != 0
        convergence += report.convergence
        faults += report.faults
        violations += len(report.violations)
    convergence.sort()
    if convergence:
        p50 = convergence[len(convergence) // 2]
        p99 = convergence[min(len(convergence) - 1, int(len(convergence) * 0.99))]
        print(f"all seeds: {faults} faults, {violations} violations, convergence p50 {p50:.1f} s, p99 {p99:.1f} s "
              f"over {len(convergence)} quiet periods")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
