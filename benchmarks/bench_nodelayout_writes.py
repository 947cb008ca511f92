"""Benchmark: what one NodeLayout write costs the apiserver, and why.

    .venv/bin/python benchmarks/bench_nodelayout_writes.py [--objects 100] [--rounds 5]

On a real control plane (``LocalCluster``) it creates, per variant, ``--objects`` NodeLayouts of
a node of 8 H100s cut to MIG all-balanced (the spec and the agent's status as
``bench_operator_memory.layout_body`` builds them), then writes each ``--rounds`` times, 16
writes at a time, and prints the apiserver's CPU (from /proc) per write:

- the agent's status write, as ``write_node_layout_status`` makes it: the whole status put
  through the status subresource over the resourceVersion last seen;
- the same status as a merge patch, for comparison;
- a label patch, the smallest write there is: the apiserver still decodes, validates and
  tracks the fields of the whole object;
- the same label patch on an empty NodeLayout, on a 5 KB ConfigMap and on copies of the CRD
  whose status, or spec and status, are schemaless (``x-kubernetes-preserve-unknown-fields``):
  how much of the cost is the object's size and how much its schema;
- a read of the NodeLayout (the agent's GET at the start of a pass, from etcd), and the same
  read served from the watch cache (``resourceVersion=0``).

Each variant runs twice, interleaved. Not a test: it prints figures and asserts nothing.

``--pprof SECONDS`` also turns the apiserver's profiling on and, after the figures, takes a Go
CPU profile of it (``/debug/pprof/profile``) for that long while the agent's status write runs
over and over, and prints its hottest functions, flat and cumulative (``go tool pprof -top``):
where a write's milliseconds go inside the apiserver.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_operator import apiserver_cpu, cpu_by_child, fetch_profile  # noqa: E402
from benchmarks.bench_operator_memory import layout_body  # noqa: E402

from tessera.kube.http import KubeClient, resource_path  # noqa: E402
from tessera.kube.nodelayouts import write_node_layout_status  # noqa: E402
from tessera.localcluster import LocalCluster  # noqa: E402

CRD = ROOT / "crds" / "tessera.dev_nodelayouts.yaml"
# Copies of the NodeLayout CRD in groups of their own: variant -> (group, the parts left schemaless)
LOOSE = {"status schemaless": ("status-loose.bench.tessera.dev", ("status",)),
         "spec and status schemaless": ("all-loose.bench.tessera.dev", ("status", "spec"))}
GROUPS = {"": "tessera.dev"} | {variant: group for variant, (group, _) in LOOSE.items()}


def loose_copy(crd: dict[str, Any], group: str, loose: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(crd)
    out["metadata"]["name"] = f"nodelayouts.{group}"
    out["spec"]["group"] = group
    properties = out["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for part in loose:
        properties[part] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return out


async def timed(label: str, count: int, one: Callable[[int, int], Awaitable[Any]], rounds: int) -> None:
    before, started = cpu_by_child(), time.monotonic()
    gate = asyncio.Semaphore(16)

    async def go(i: int, r: int) -> None:
        async with gate:
            await one(i, r)

    await asyncio.gather(*(go(i, r) for r in range(rounds) for i in range(count)))
    cpu, writes = apiserver_cpu(before), rounds * count
    print(f"{label:58} {writes} writes in {time.monotonic() - started:5.2f} s, apiserver "
          f"{cpu:5.2f} CPU s: {cpu / writes * 1000:5.2f} ms per write", flush=True)


def print_profile(cluster: LocalCluster, profile: Path, writes: int) -> None:
    print(f"-- the apiserver's CPU profile over {writes} status writes --", flush=True)
    for order in ([], ["-cum"]):
        top = subprocess.run(["go", "tool", "pprof", "-top", *order, "-nodecount=45",
                              str(cluster.binaries.kube_apiserver), str(profile)],
                             capture_output=True, text=True, check=True, timeout=120)
        print(top.stdout, flush=True)


async def run(objects: int, rounds: int, pprof: int) -> None:
    cluster = await asyncio.to_thread(
        LocalCluster.start, apiserver_args=("--profiling=true",) if pprof else ())
    kube = KubeClient.from_environment(str(cluster.kubeconfig))
    try:
        cluster.apply(ROOT / "crds")
        crd = yaml.safe_load(CRD.read_text())
        for group, loose in LOOSE.values():
            await kube.create(resource_path("apiextensions.k8s.io", "v1", "customresourcedefinitions"),
                              loose_copy(crd, group, loose))
        await asyncio.sleep(5)  # the copies' endpoints come up
        body = layout_body("bench", "8xH100-80GB")

        def path(group: str, name: str, subresource: str | None = None) -> str:
            return resource_path(group, "v1alpha1", "nodelayouts", name, subresource=subresource)

        for variant, group in GROUPS.items():
            for i in range(objects):
                await kube.create(path(group, ""), {"apiVersion": f"{group}/v1alpha1", "kind": "NodeLayout",
                                                    "metadata": {"name": f"mig-{i}"}, "spec": body["spec"]})
                await kube.patch(path(group, f"mig-{i}", "status"), {"status": body["status"]})
            if not variant:
                for i in range(objects):
                    await kube.create(path(group, ""), {"apiVersion": f"{group}/v1alpha1", "kind": "NodeLayout",
                                                        "metadata": {"name": f"empty-{i}"}, "spec": {}})
                    await kube.create(resource_path("", "v1", "configmaps", namespace="default"),
                                      {"metadata": {"name": f"cm-{i}"}, "data": {"x": "y" * 5000}})

        versions: dict[int, str] = {}

        async def status_write(i: int, r: int) -> None:
            status = {**body["status"], "observedGeneration": 100 + r}
            read = {"apiVersion": f"{GROUPS['']}/v1alpha1", "kind": "NodeLayout",
                    "metadata": {"resourceVersion": versions[i]}} if i in versions else None
            written = await write_node_layout_status(kube, f"mig-{i}", status, read=read)
            versions[i] = written["metadata"]["resourceVersion"]

        def status_patch(i: int, r: int) -> Awaitable[Any]:
            return kube.patch(path(GROUPS[""], f"mig-{i}", "status"),
                              {"status": {**body["status"], "observedGeneration": 200 + r}})

        def read(i: int, r: int) -> Awaitable[Any]:
            return kube.get(path(GROUPS[""], f"mig-{i}"))

        def cached_read(i: int, r: int) -> Awaitable[Any]:
            return kube.request("GET", path(GROUPS[""], f"mig-{i}"), params={"resourceVersion": "0"})

        def label(group: str, name: str, namespace: str | None = None) -> Callable[[int, int], Awaitable[Any]]:
            def write(i: int, r: int) -> Awaitable[Any]:
                target = (resource_path("", "v1", "configmaps", f"{name}-{i}", namespace=namespace) if namespace
                          else path(group, f"{name}-{i}"))
                return kube.patch(target, {"metadata": {"labels": {"bench": f"v{r}"}}})
            return write

        for _ in range(2):
            await timed("NodeLayout of 8 MIG GPUs: the agent's status write (put)", objects, status_write, rounds)
            await timed("  the same status as a merge patch", objects, status_patch, rounds)
            await timed("NodeLayout of 8 MIG GPUs: a label patch", objects, label(GROUPS[""], "mig"), rounds)
            for variant in LOOSE:
                await timed(f"  the same, {variant}", objects, label(GROUPS[variant], "mig"), rounds)
            await timed("empty NodeLayout: a label patch", objects, label(GROUPS[""], "empty"), rounds)
            await timed("ConfigMap of 5 KB: a label patch", objects, label("", "cm", "default"), rounds)
            await timed("NodeLayout of 8 MIG GPUs: a read (GET, from etcd)", objects, read, rounds)
            await timed("  the same read from the watch cache (resourceVersion=0)", objects, cached_read, rounds)
        if pprof:
            profile = Path(tempfile.mkdtemp(prefix="tessera-pprof-")) / "apiserver.pprof"
            taking = asyncio.create_task(asyncio.to_thread(fetch_profile, cluster, pprof, profile))
            writes = 0
            while not taking.done():
                await timed("  (profiled) the agent's status write", objects, status_write, 1)
                writes += objects
            await taking
            print_profile(cluster, profile, writes)
    finally:
        await kube.close()
        await asyncio.to_thread(cluster.stop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pprof", type=int, default=0, metavar="SECONDS",
                        help="profile the apiserver for this long while status writes run (Go's pprof)")
    args = parser.parse_args()
    asyncio.run(run(args.objects, args.rounds, args.pprof))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
