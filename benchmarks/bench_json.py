"""Benchmark: the standard library's json against orjson on the bodies Tessera reads and writes
most: a node's ResourceSlice of 8 GPUs cut to MIG (4 devices each), and the NodeLayout status
the agent reports for it. ``tessera.kube.http`` writes JSON with orjson for these figures (and
reads it with the standard library: its module head says why).

    .venv/bin/python benchmarks/bench_json.py [--rounds 2000]

Prints, per body, its size and the microseconds of one ``loads`` and one ``dumps`` with each
library (the compact form Tessera writes: digests, cached slices, request bodies). Not a test:
it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import orjson

from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.dra.slices import NodeRef, build_node_slices
from tessera.log import configure_logging
from tessera.models.layout import GpuLayout, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import Strategy

ALL_BALANCED = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))  # bench_operator's preset


def bodies() -> dict[str, Any]:
    """A MIG node's slice and NodeLayout status, built by the agent's and the operator's own code."""
    backend = SimulatedBackend.from_spec("bench", "8xH100-80GB")
    gpus = backend.inventory().gpus
    balanced = [PlacedInstance(profile=p, start=s) for p, s in ALL_BALANCED]
    spec = NodeLayoutSpec(gpus=[GpuLayout(uuid=g.uuid, strategy=Strategy.MIG, mig_instances=balanced) for g in gpus])
    result = apply_layout(backend, spec)
    status = build_status(result.inventory, spec, result.plans, backend="simulated", agent_version="bench",
                          observed_generation=1)
    (built,) = build_node_slices(NodeRef("bench", "uid"), status)
    return {"ResourceSlice (8 MIG GPUs)": built, "NodeLayout status (8 MIG GPUs)": status.to_kube()}


def per_call(fn: Callable[[Any], object], arg: object, rounds: int) -> float:
    """Microseconds of one ``fn(arg)``."""
    started = time.perf_counter()
    for _ in range(rounds):
        fn(arg)
    return (time.perf_counter() - started) / rounds * 1e6


def compact(body: object) -> bytes:
    """The standard library's compact JSON, as bytes (what orjson.dumps gives)."""
    return json.dumps(body, separators=(",", ":")).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    configure_logging("warning")
    for name, body in bodies().items():
        text = orjson.dumps(body)
        loads_json = per_call(json.loads, text, args.rounds)
        loads_orjson = per_call(orjson.loads, text, args.rounds)
        dumps_json = per_call(compact, body, args.rounds)
        dumps_orjson = per_call(orjson.dumps, body, args.rounds)
        print(f"{name}, {len(text)} bytes: loads json {loads_json:.0f} us, orjson {loads_orjson:.0f} us "
              f"({loads_json / loads_orjson:.1f}x); dumps json {dumps_json:.0f} us, orjson {dumps_orjson:.0f} us "
              f"({dumps_json / dumps_orjson:.1f}x)", flush=True)


if __name__ == "__main__":
    main()
