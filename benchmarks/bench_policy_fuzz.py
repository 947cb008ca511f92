"""10,000 generated SharingPolicies, valid and not, against a real local control plane and a
running operator (with simulated GPU nodes and their agents): each must be refused at
admission with a message naming the field, or accepted and then settle with a reason
(``tests/policy_fuzz.py`` says what counts). Prints the outcomes by kind, the problems found,
whether the operator survived, the unhandled exceptions in its log, and the time it took.

    .venv/bin/python benchmarks/bench_policy_fuzz.py [--policies 10000] [--batch 200] [--seed 1] [--nodes 2]

Policies go in batches: a batch is created (16 requests in flight), the operator's statuses
are awaited until every accepted policy has settled (or 180 s pass), then the batch is deleted
and its deletion awaited, so the operator always holds one batch, and they fight over the
same GPUs as real policies do. Exit status 1 when any policy's outcome is a problem, the
operator died, or its log has an unhandled exception.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.policy_fuzz: the generator the integration test uses

from tests.policy_fuzz import NODE_LABELS, Outcome, draw_specs, log_problems, try_batch  # noqa: E402

from tessera.kube.http import KubeClient  # noqa: E402
from tessera.localcluster import LocalCluster  # noqa: E402
from tessera.localcluster.processes import TesseraProcesses  # noqa: E402

GPUS = ("1xH100-80GB,1xA100-40GB", "2xH200-141GB", "1xA100-80GB,1xH100-80GB")


async def run(policies: int, batch: int, seed: int, nodes: int) -> int:
    started = time.monotonic()
    specs = draw_specs(policies, seed)
    drawn = time.monotonic() - started
    print(f"drew {len(specs)} specs (seed {seed}) in {drawn:.1f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp, LocalCluster.start() as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        processes = TesseraProcesses(cluster, Path(tmp))
        operator = processes.operator()
        try:
            for i in range(nodes):
                cluster.add_node(f"fuzz-{i}", NODE_LABELS if i % 2 == 0 else {"pool": "other"})
                processes.agent(f"fuzz-{i}", GPUS[i % len(GPUS)])
            outcomes: list[Outcome] = []
            began = time.monotonic()
            async with KubeClient.from_environment(str(cluster.kubeconfig)) as api:
                for start in range(0, len(specs), batch):
                    outcomes += await try_batch(api, specs[start:start + batch], f"b{seed}-{start}")
                    done = len(outcomes)
                    print(f"  {done:6d} policies, {time.monotonic() - began:7.1f}s, "
                          f"{done / (time.monotonic() - began):.1f}/s", flush=True)
            took = time.monotonic() - began
            alive = operator.alive()
            log_lines = log_problems(operator.log.read_text(errors="replace"))
        finally:
            processes.stop_all()
    kinds = Counter(o.kind for o in outcomes)
    problems = [o for o in outcomes if o.problem() is not None]
    refused = sum(1 for o in outcomes if o.refused is not None)
    print(f"\n{len(outcomes)} policies in {took:.0f}s ({len(outcomes) / took:.1f}/s): "
          f"{refused} refused at admission, {len(outcomes) - refused} accepted")
    print("outcomes by kind:")
    for kind, count in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {count:6d}  {kind}")
    print(f"problems: {len(problems)}")
    for o in problems[:20]:
        print(f"  {o.name} {o.spec}: {o.problem()}")
    print(f"operator alive at the end: {alive}; error or exception lines in its log: {len(log_lines)}")
    for line in log_lines[:10]:
        print(f"  {line}")
    return 0 if not problems and alive and not log_lines else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    return asyncio.run(run(args.policies, args.batch, args.seed, args.nodes))


if __name__ == "__main__":
    sys.exit(main())
