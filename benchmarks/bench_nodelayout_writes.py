"""Benchmark: what one NodeLayout write costs the apiserver, and why.

    .venv/bin/python benchmarks/bench_nodelayout_writes.py [--objects 100] [--rounds 5]

On a real control plane (``LocalCluster``) it creates, per variant, ``--objects`` NodeLayouts of
a node of 8 H100s cut to MIG all-balanced (the spec and the agent's status as
``bench_operator_memory.layout_body`` builds them), then writes each ``--rounds`` times, 16
writes at a time, and prints the apiserver's CPU (from /proc) per write:

- the agent's status write (a merge patch of the whole status through the status subresource);
- a label patch, the smallest write there is: the apiserver still decodes, validates and
  tracks the fields of the whole object;
- the same label patch on an empty NodeLayout, on a 5 KB ConfigMap and on copies of the CRD
  whose status, or spec and status, are schemaless (``x-kubernetes-preserve-unknown-fields``):
  how much of the cost is the object's size and how much its schema.

Each variant runs twice, interleaved. Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_operator import apiserver_cpu, cpu_by_child  # noqa: E402
from benchmarks.bench_operator_memory import layout_body  # noqa: E402

from tessera.kube.http import KubeClient, resource_path  # noqa: E402
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


async def run(objects: int, rounds: int) -> None:
    cluster = await asyncio.to_thread(LocalCluster.start)
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

        def status_write(i: int, r: int) -> Awaitable[Any]:
            return kube.patch(path(GROUPS[""], f"mig-{i}", "status"),
                              {"status": {**body["status"], "observedGeneration": 100 + r}})

        def label(group: str, name: str, namespace: str | None = None) -> Callable[[int, int], Awaitable[Any]]:
            def write(i: int, r: int) -> Awaitable[Any]:
                target = (resource_path("", "v1", "configmaps", f"{name}-{i}", namespace=namespace) if namespace
                          else path(group, f"{name}-{i}"))
                return kube.patch(target, {"metadata": {"labels": {"bench": f"v{r}"}}})
            return write

        for _ in range(2):
            await timed("NodeLayout of 8 MIG GPUs: the agent's status write", objects, status_write, rounds)
            await timed("NodeLayout of 8 MIG GPUs: a label patch", objects, label(GROUPS[""], "mig"), rounds)
            for variant in LOOSE:
                await timed(f"  the same, {variant}", objects, label(GROUPS[variant], "mig"), rounds)
            await timed("empty NodeLayout: a label patch", objects, label(GROUPS[""], "empty"), rounds)
            await timed("ConfigMap of 5 KB: a label patch", objects, label("", "cm", "default"), rounds)
    finally:
        await kube.close()
        await asyncio.to_thread(cluster.stop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.objects, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
