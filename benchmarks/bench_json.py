"""Benchmark: the standard library's json against orjson on the bodies Tessera reads and writes
most: a node's ResourceSlice of 8 GPUs cut to MIG (4 devices each), and the NodeLayout status
the agent reports for it (``bench_operator_memory.layout_body``: all-balanced, as a policy
asks). ``tessera.kube.http`` writes JSON with orjson for these figures (and reads it with the
standard library: its module head says why).

    .venv/bin/python benchmarks/bench_json.py [--rounds 2000]

Prints, per body, its size and the microseconds of one ``loads`` and one ``dumps`` with each
library (the compact form Tessera writes: digests, cached slices, request bodies). Not a test:
it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tessera.dra.slices import NodeRef, build_node_slices
from tessera.log import configure_logging
from tessera.models.layout import NodeLayoutStatus

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the NodeLayout is bench_operator_memory's

from benchmarks.bench_operator_memory import layout_body  # noqa: E402


def bodies() -> dict[str, Any]:
    """A MIG node's slice and NodeLayout status, built by the agent's and the operator's own code."""
    status = layout_body("bench", "8xH100-80GB")["status"]
    (built,) = build_node_slices(NodeRef("bench", "uid"), NodeLayoutStatus.model_validate(status))
    return {"ResourceSlice (8 MIG GPUs)": built, "NodeLayout status (8 MIG GPUs)": status}


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
