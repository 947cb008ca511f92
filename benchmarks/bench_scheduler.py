"""Benchmark: how fast the stock kube-scheduler binds Pods whose claims ask for Tessera's devices,
against the same number of plain devices.

    .venv/bin/python benchmarks/bench_scheduler.py [--nodes 50] [--pods 300] [--trials 2]

Each run starts a fresh local control plane whose scheduler has its client rate limits raised
(``--kube-api-qps 2000 --kube-api-burst 4000``), so that the scheduler itself is measured, not
a QPS limit. It adds N kubelet-less Nodes, each with 8 simulated H100s, published one of two ways:

- ``tessera``: the ResourceSlices Tessera publishes for whole GPUs (the agent's ``build_status``
  on simulated GPUs, then ``build_node_slices``: every attribute and capacity). Claims ask for
  the ``whole-gpu.tessera.dev`` class and its CEL selector.
- ``plain``: the same number of devices, each with one attribute, from a driver ``plain.bench``.
  Claims ask for a class that selects that driver and nothing else.

Then P ResourceClaims are created, then P Pods, each naming one claim. The clock runs from the
first Pod's create to the moment a watch has seen every Pod bound (``spec.nodeName``). The
benchmark prints Pods per second for each run and, per trial, the ratio tessera / plain. It
also prints how long the creates alone took, to show the scheduler and not the client was the
bottleneck. The two modes alternate, with the order flipped each trial. Not a test: it prints
figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from tessera import DRIVER_NAME, RESOURCE_API_VERSION
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.dra.slices import NodeRef, build_node_slices
from tessera.kube.http import KubeClient, load_kubeconfig, resource_path
from tessera.localcluster import LocalCluster
from tessera.models.layout import GpuLayout, NodeLayoutSpec
from tessera.models.policy import Strategy

GPUS_PER_NODE = 8
NAMESPACE = "bench"
PLAIN_DRIVER = "plain.bench"
SCHEDULER_ARGS = ("--kube-api-qps=2000", "--kube-api-burst=4000")
SLICES = resource_path("resource.k8s.io", "v1", "resourceslices")
CLASSES = resource_path("resource.k8s.io", "v1", "deviceclasses")
CLAIMS = resource_path("resource.k8s.io", "v1", "resourceclaims", namespace=NAMESPACE)
PODS = resource_path("", "v1", "pods", namespace=NAMESPACE)


def tessera_slices(node: dict[str, Any]) -> list[dict[str, Any]]:
    """What Tessera publishes for a node of 8 whole H100s, built by the agent's and the
    publisher's own code."""
    name = node["metadata"]["name"]
    backend = SimulatedBackend.from_spec(name, f"{GPUS_PER_NODE}xH100-80GB")
    gpus = backend.inventory().gpus
    spec = NodeLayoutSpec(gpus=[GpuLayout(uuid=g.uuid, strategy=Strategy.EXCLUSIVE) for g in gpus])
    result = apply_layout(backend, spec)
    status = build_status(result.inventory, spec, result.plans, backend="simulated", agent_version="bench",
                          observed_generation=1)
    return [dict(s) for s in build_node_slices(NodeRef(name, node["metadata"]["uid"]), status)]


def plain_slices(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The same number of devices, one attribute each, in one slice."""
    name = node["metadata"]["name"]
    devices = [{"name": f"dev-{i}", "attributes": {"index": {"int": i}}} for i in range(GPUS_PER_NODE)]
    return [{
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-plain"},
        "spec": {"driver": PLAIN_DRIVER, "nodeName": name, "devices": devices,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}},
    }]


CLASS_OF = {"tessera": "whole-gpu.tessera.dev", "plain": "plain.bench"}
SLICES_OF = {"tessera": tessera_slices, "plain": plain_slices}


def device_classes() -> list[dict[str, Any]]:
    def cls(name: str, expression: str) -> dict[str, Any]:
        return {"apiVersion": RESOURCE_API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}

    return [
        cls("whole-gpu.tessera.dev",  # as in manifests/deviceclasses.yaml, without the extended resource
            f'device.driver == "{DRIVER_NAME}" && device.attributes["{DRIVER_NAME}"].type == "gpu"'),
        cls("plain.bench", f'device.driver == "{PLAIN_DRIVER}"'),
    ]


def claim(i: int, device_class: str) -> dict[str, Any]:
    return {"apiVersion": RESOURCE_API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": f"c-{i:05d}", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}


def pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i:05d}", "namespace": NAMESPACE},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": f"c-{i:05d}"}],
                     "containers": [{"name": "c", "image": "registry.invalid/none:0",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


async def in_parallel(calls: list[Any], width: int = 32) -> None:
    gate = asyncio.Semaphore(width)

    async def one(call: Any) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


async def run_once(mode: str, nodes: int, pods: int) -> tuple[float, float]:
    """(seconds from the first Pod created to every Pod bound, seconds the creates took)."""
    cluster = await asyncio.to_thread(LocalCluster.start, scheduler_args=SCHEDULER_ARGS)
    try:
        async with KubeClient(load_kubeconfig(cluster.kubeconfig)) as kube:
            for c in device_classes():
                await kube.create(CLASSES, c)
            await kube.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            made = [await asyncio.to_thread(cluster.add_node, f"n-{i:03d}") for i in range(nodes)]
            await in_parallel([kube.create(SLICES, s) for node in made for s in SLICES_OF[mode](node)])
            await in_parallel([kube.create(CLAIMS, claim(i, CLASS_OF[mode])) for i in range(pods)])

            listed = await kube.list_page(PODS)
            bound: set[str] = set()
            all_bound = asyncio.Event()

            async def watch() -> None:
                # The apiserver ends a watch whose reader falls behind (this process is busy
                # creating Pods meanwhile): go on from the last version seen.
                version = listed["metadata"]["resourceVersion"]
                while True:
                    async for _, obj in kube.watch(PODS, resource_version=version, bookmarks=True):
                        version = obj["metadata"]["resourceVersion"]
                        if obj.get("spec", {}).get("nodeName"):
                            bound.add(obj["metadata"]["name"])
                            if len(bound) == pods:
                                all_bound.set()
                                return

            watcher = asyncio.create_task(watch())
            started = time.perf_counter()
            await in_parallel([kube.create(PODS, pod(i)) for i in range(pods)])
            created = time.perf_counter() - started
            done = asyncio.create_task(all_bound.wait())
            await asyncio.wait({watcher, done}, timeout=600, return_when=asyncio.FIRST_COMPLETED)
            elapsed = time.perf_counter() - started
            if not all_bound.is_set():  # the watch failed or ended early: say why, measure nothing
                done.cancel()
                if watcher.done():
                    watcher.result()
                watcher.cancel()
                raise RuntimeError(f"{mode}: only {len(bound)} of {pods} Pods seen bound")
            return elapsed, created
    finally:
        await asyncio.to_thread(cluster.stop)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    if args.pods > args.nodes * GPUS_PER_NODE:
        parser.error(f"--pods must be at most nodes x {GPUS_PER_NODE} (one whole GPU per Pod)")
    print(f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.pods} Pods with one claim each, "
          f"scheduler {' '.join(SCHEDULER_ARGS)}")
    ratios = []
    for trial in range(args.trials):
        rates: dict[str, float] = {}
        for mode in (("tessera", "plain") if trial % 2 == 0 else ("plain", "tessera")):
            elapsed, created = await run_once(mode, args.nodes, args.pods)
            rates[mode] = args.pods / elapsed
            print(f"trial {trial + 1} {mode:8} {rates[mode]:7.1f} Pods/s  ({elapsed:.2f} s to bind all; "
                  f"creates took {created:.2f} s)")
        ratios.append(rates["tessera"] / rates["plain"])
        print(f"trial {trial + 1} ratio tessera/plain {ratios[-1]:.2f}")
    print(f"median ratio tessera/plain over {args.trials} trials: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    asyncio.run(main())
