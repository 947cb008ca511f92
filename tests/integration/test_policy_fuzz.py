"""A few hundred generated SharingPolicies, valid and not (``tests/policy_fuzz.py``, seeded),
against the real apiserver and a running operator with one simulated GPU node: each is refused
at admission with a message naming the field, or accepted and then given a status at its
generation whose Ready (or Degraded) condition carries a reason; the operator neither crashes
nor logs an unhandled exception. The 10,000-policy run is ``benchmarks/bench_policy_fuzz.py``."""

from __future__ import annotations

import os

import pytest

from tessera.kube.http import KubeClient
from tessera.localcluster import LocalCluster
from tessera.localcluster.processes import TesseraProcesses
from tests.policy_fuzz import NODE_LABELS, draw_specs, log_problems, summary, try_batch

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("TESSERA_POLICY_FUZZ_SEED", "20261204"))
EXAMPLES = 240
BATCH = 80
NODE = "fuzz-node"


async def test_generated_policies_are_refused_naming_the_field_or_settle_with_a_reason(
    cluster: LocalCluster, tessera: TesseraProcesses
) -> None:
    cluster.add_node(NODE, NODE_LABELS)
    tessera.agent(NODE, "1xH100-80GB,1xA100-40GB")
    operator = tessera.processes[0]
    specs = draw_specs(EXAMPLES, SEED)
    assert len(specs) >= EXAMPLES * 0.9
    outcomes = []
    async with KubeClient.from_environment(str(cluster.kubeconfig)) as api:
        for start in range(0, len(specs), BATCH):
            outcomes += await try_batch(api, specs[start:start + BATCH], f"s{SEED}-{start}")
    kinds = summary(outcomes)
    print(f"\n{len(outcomes)} policies (seed {SEED}):")
    for kind, count in sorted(kinds.items()):
        print(f"  {count:5d}  {kind}")
    problems = [f"{o.name} {o.spec}: {o.problem()}" for o in outcomes if o.problem() is not None]
    assert not problems, f"{len(problems)} of {len(outcomes)}:\n" + "\n".join(problems[:10])
    refused = sum(1 for o in outcomes if o.refused is not None)
    assert 0.2 * len(outcomes) < refused < 0.8 * len(outcomes), f"the generator should mix valid and not: {kinds}"
    assert operator.alive(), f"the operator died:\n{operator.tail()}"
    bad_lines = log_problems(operator.log.read_text(errors="replace"))
    assert not bad_lines, "\n".join(bad_lines[:10])
