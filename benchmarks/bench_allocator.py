"""Benchmark: the Kubernetes structured DRA allocator alone, on Tessera's slices against plain
devices: microseconds per node, separated from the rest of the scheduler.

    .venv/bin/python benchmarks/bench_allocator.py [--nodes 1000] [--pods 10] [--trials 2]
        [--modes tessera,tessera-per-gpu,plain,plain-untyped]

``benchmarks/bench_scheduler.py`` measures the whole scheduler (queue, plugins, API writes) on a
real control plane; this one runs only the allocator that its DynamicResources plugin calls —
``k8s.io/dynamic-resource-allocation/structured`` at the version the local cluster runs — in a
small Go program (``benchmarks/allocator/main.go``, built here with the Go toolchain on first
use), over the very slices and DeviceClasses ``bench_scheduler`` creates (its modes, built by
its functions). Per Pod the program does what the plugin does for one claim: one
``NewAllocator`` over every slice of the cluster, then ``Allocate`` on every node. The
allocator gathers each node's pools by walking every slice of the cluster, so its cost per
node grows with the cluster's slice count: the number of slices a node publishes is multiplied
by the number of nodes. Prints, per mode and trial, µs per node and ms of ``NewAllocator`` per
Pod, and the load average. Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench_scheduler's modes live beside this file

from benchmarks.bench_scheduler import CLASS_OF, MODES, SLICES_OF, device_classes  # noqa: E402

PROGRAM = ROOT / "benchmarks" / "allocator"


def build(out: Path) -> Path:
    """``benchmarks/allocator`` built with the local Go toolchain (modules from the Go module proxy)."""
    binary = out / "allocator"
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    done = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=PROGRAM, env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"building {PROGRAM} failed (is Go 1.26 installed?):\n{done.stderr[-3000:]}")
    return binary


def mode_input(mode: str, nodes: int) -> dict[str, Any]:
    names = [f"n-{i:04d}" for i in range(nodes)]
    slices = [s for name in names for s in SLICES_OF[mode]({"metadata": {"name": name, "uid": f"uid-{name}"}})]
    return {"name": mode, "class": CLASS_OF[mode], "nodes": names, "slices": slices}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10, help="scheduling cycles per mode and trial")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, any of {', '.join(MODES)}")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in SLICES_OF]
    if unknown or not modes:
        parser.error(f"--modes {args.modes!r}: unknown {', '.join(unknown) or '(none given)'}; "
                     f"choose from {', '.join(MODES)}")
    inputs = {m: mode_input(m, args.nodes) for m in modes}
    with tempfile.TemporaryDirectory(prefix="tessera-allocator-") as tmp:
        binary = build(Path(tmp))
        print(f"{args.nodes} nodes, {args.pods} Pods with one claim each per mode and trial; "
              "the structured allocator of k8s.io/dynamic-resource-allocation alone", flush=True)
        for trial in range(args.trials):
            order = modes if trial % 2 == 0 else list(reversed(modes))
            payload = {"modes": [inputs[m] for m in order], "classes": device_classes(), "pods": args.pods}
            done = subprocess.run([str(binary)], input=json.dumps(payload), capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                raise SystemExit(f"the allocator program failed:\n{done.stderr[-3000:]}")
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            for line in done.stdout.splitlines():
                print(f"trial {trial + 1} {line}; load {load}", flush=True)


if __name__ == "__main__":
    main()
