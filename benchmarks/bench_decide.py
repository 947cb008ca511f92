"""Benchmark: one node's decision (``decide_node``) as the cluster's allocated claims grow.

    .venv/bin/python benchmarks/bench_decide.py [--nodes 1000] [--claims 0,8000,32000] [--sample 200]

N simulated nodes whose 8 GPUs carry the MIG ``all-balanced`` layout (4 devices each) that one
SharingPolicy asks for (``bench_operator_memory.layout_body``: the agent's own ``apply_layout``
and ``build_status``), and C claims, each allocated one of those devices, spread over every
node (32 per node hold every device). For each C it times ``decide_node`` on a sample of the
nodes, with the claims in the watch's view, then with the same claims as a fresh list as well
(the handover's second decision, made with every claim read after the taint's grace), and
prints microseconds per decision. A node's decision should cost what its own claims cost, not
what the cluster's do: a rollout decides every node three or four times. Not a test: it prints
figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench_operator_memory import POLICY, layout_body, node_body

from tessera import DRIVER_NAME
from tessera.controller.decide import decide_node
from tessera.controller.freshclaims import FreshClaims
from tessera.controller.state import Fleet, Holds, claim_hold
from tessera.log import configure_logging

DEVICES = ("gpu-{i}-mig-1g-10gb-0", "gpu-{i}-mig-1g-10gb-1", "gpu-{i}-mig-2g-20gb-2", "gpu-{i}-mig-3g-40gb-4")


def claim(n: int, node: str, device: str) -> dict[str, object]:
    return {"metadata": {"name": f"claim-{n}", "namespace": "bench", "uid": f"uid-claim-{n}"}, "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER_NAME, "pool": node, "device": device}]}},
                "reservedFor": [{"resource": "pods", "name": f"pod-{n}", "uid": f"uid-pod-{n}"}]}}


def claims_for(names: list[str], count: int) -> list[dict[str, object]]:
    """``count`` claims, one device each, dealt over the nodes' devices round-robin."""
    devices = [(node, d.format(i=gpu)) for d in DEVICES for gpu in range(8) for node in names]
    if count > len(devices):
        raise SystemExit(f"--claims {count}: {len(names)} nodes have only {len(devices)} devices")
    return [claim(n, *devices[n]) for n in range(count)]


async def fresh_of(bodies: list[dict[str, object]]) -> Holds:
    async def read() -> list[dict[str, object]]:
        return bodies

    return await FreshClaims(read).since(0.0)


def per_decision(fleet: Fleet, sample: list[str], fresh: Holds) -> float:
    """Microseconds per decision over ``sample``: the faster of two rounds (the first also warms up)."""
    rounds = []
    for _ in range(2):
        started = time.perf_counter()
        for name in sample:
            decide_node(fleet, name, 0.0, None, None, fresh)
        rounds.append((time.perf_counter() - started) / len(sample) * 1e6)
    return min(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", default="0,8000,32000", help="comma-separated claim counts")
    parser.add_argument("--sample", type=int, default=200, help="nodes decided per figure")
    args = parser.parse_args()
    configure_logging("warning")

    names = [f"n-{i:05d}" for i in range(args.nodes)]
    layout = layout_body(names[0], "8xH100-80GB")  # every node the same GPUs: one agent's build, renamed
    sample = names[:: max(1, len(names) // args.sample)][: args.sample]
    print(f"{args.nodes} nodes x 8 H100 (MIG all-balanced), decide_node on {len(sample)} of them")
    print(f"  {'claims':>8} {'watch view (us)':>16} {'+ fresh list (us)':>18}")
    for count in [int(c) for c in args.claims.split(",")]:
        fleet = Fleet()
        fleet.set_policy(POLICY)
        for name in names:
            fleet.set_node(node_body(name))
            fleet.set_layout({**layout, "metadata": {**layout["metadata"], "name": name, "uid": f"uid-layout-{name}"}})
        bodies = claims_for(names, count)
        for body in bodies:
            fleet.set_claim(body)
        assert sum(1 for b in bodies if claim_hold(b) is not None) == count
        fresh = asyncio.run(fresh_of(bodies))
        watch_only = per_decision(fleet, sample, Holds())
        with_fresh = per_decision(fleet, sample, fresh)
        print(f"  {count:>8} {watch_only:>16.0f} {with_fresh:>18.0f}")


if __name__ == "__main__":
    main()
