"""Benchmark: how fast the stock kube-scheduler binds Pods whose claims ask for Tessera's devices,
against the same number of plain devices, saturated.

    .venv/bin/python benchmarks/bench_scheduler.py [--nodes 50] [--pods 300] [--trials 2] [--qps 2000]
        [--modes tessera,plain]

Quick check: ``--nodes 10 --pods 40 --trials 1``. At scale (issue 22):
``--nodes 1000 --pods 2000 --trials 2 --modes tessera,plain``.

Each run starts a fresh local control plane whose scheduler and controller manager have their
client rate limits raised (``--kube-api-qps QPS --kube-api-burst 2*QPS``), so that the scheduler's
own work is measured, not a QPS limit. It adds N kubelet-less Nodes (created in parallel), each
with 8 simulated H100s, published one of these ways (``--modes``, any of them, in that order):

- ``tessera``: the ResourceSlices Tessera publishes for whole GPUs (the agent's ``build_status``
  on simulated GPUs, then ``build_node_slices``: every attribute and capacity, the node's GPUs
  sharing one slice). Claims ask for the ``whole-gpu.tessera.dev`` class and its CEL selector
  (driver, and ``type == "gpu"``).
- ``tessera-per-gpu``: the same devices, one slice per GPU (``<node>-tessera-gpu-<i>``), as
  Tessera published them before slices were shared: what the sharing gains.
- ``plain``: the same number of devices from a driver ``plain.bench``, in one slice, each with
  an ``index`` and ``type: gpu``; claims ask for a class that selects the driver and
  ``type == "gpu"``, so the class costs what Tessera's costs and the difference is the devices.
- ``plain-untyped``: as ``plain`` with only the ``index`` attribute and a class that selects the
  driver alone (the cheapest claim there is; this benchmark's baseline before issue 22).

Then P ResourceClaims are created. The scheduler is paused (SIGSTOP) while P Pods, each naming
one claim, are created, so every Pod is waiting when it resumes (SIGCONT): the queue is full
from the first moment, and the client's create speed is out of the figure. The clock runs from
the resume to the moment a watch has seen every Pod bound (``spec.nodeName``). The benchmark
prints Pods per second for each run (and the time to the first and the median bind), the CPU
seconds kube-scheduler and kube-apiserver spent per Pod over that time (``/proc/<pid>/stat``:
on a shared machine the scheduler's own CPU is a steadier measure of its work than the wall
clock), the load average, and, per trial, each mode's ratio to ``plain``: Pods/s mode / plain,
and scheduler CPU per Pod plain / mode (1 = as cheap as plain). The modes take turns, the order
flipped each trial. Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera import DRIVER_NAME, RESOURCE_API_VERSION
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.dra.devices import build_gpu_devices
from tessera.dra.slices import NodeRef, build_node_slices, build_slices_from_devices
from tessera.kube.http import KubeClient, load_kubeconfig, resource_path
from tessera.localcluster import LocalCluster
from tessera.models.layout import GpuLayout, NodeLayoutSpec, NodeLayoutStatus
from tessera.models.policy import Strategy

GPUS_PER_NODE = 8
NAMESPACE = "bench"
PLAIN_DRIVER = "plain.bench"
NODES = resource_path("", "v1", "nodes")
SLICES = resource_path("resource.k8s.io", "v1", "resourceslices")
CLASSES = resource_path("resource.k8s.io", "v1", "deviceclasses")
CLAIMS = resource_path("resource.k8s.io", "v1", "resourceclaims", namespace=NAMESPACE)
PODS = resource_path("", "v1", "pods", namespace=NAMESPACE)


def _whole_gpus(node: dict[str, Any]) -> NodeLayoutStatus:
    """What the agent reports for a node of 8 whole H100s, built by the agent's own code."""
    name = node["metadata"]["name"]
    backend = SimulatedBackend.from_spec(name, f"{GPUS_PER_NODE}xH100-80GB")
    gpus = backend.inventory().gpus
    spec = NodeLayoutSpec(gpus=[GpuLayout(uuid=g.uuid, strategy=Strategy.EXCLUSIVE) for g in gpus])
    result = apply_layout(backend, spec)
    return build_status(result.inventory, spec, result.plans, backend="simulated", agent_version="bench",
                        observed_generation=1)


def tessera_slices(node: dict[str, Any]) -> list[dict[str, Any]]:
    """What Tessera publishes for a node of 8 whole H100s, built by the publisher's own code."""
    ref = NodeRef(node["metadata"]["name"], node["metadata"]["uid"])
    return [dict(s) for s in build_node_slices(ref, _whole_gpus(node))]


def tessera_per_gpu_slices(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The same devices one slice per GPU, named as Tessera named them before slices were shared."""
    ref = NodeRef(node["metadata"]["name"], node["metadata"]["uid"])
    out = []
    for gpu in _whole_gpus(node).gpus:
        (one,) = build_slices_from_devices(ref, [build_gpu_devices(gpu)])
        one["metadata"]["name"] = f"{ref.name}-tessera-gpu-{gpu.index}"
        one["spec"]["pool"]["resourceSliceCount"] = GPUS_PER_NODE
        out.append(one)
    return out


def plain_slices(node: dict[str, Any], typed: bool = True) -> list[dict[str, Any]]:
    """The same number of devices in one slice: an index each and, when ``typed``, ``type: gpu``."""
    name = node["metadata"]["name"]
    devices = [
        {"name": f"dev-{i}", "attributes": {"index": {"int": i}, **({"type": {"string": "gpu"}} if typed else {})}}
        for i in range(GPUS_PER_NODE)
    ]
    return [{
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-plain"},
        "spec": {"driver": PLAIN_DRIVER, "nodeName": name, "devices": devices,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}},
    }]


def node(name: str) -> dict[str, Any]:
    """A kubelet-less Node, Ready (as ``LocalCluster.add_node`` makes it, without a kubectl per node)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "simulated node (no kubelet)", "lastHeartbeatTime": now,
                                       "lastTransitionTime": now}]}}


def rate_limit_args(qps: int) -> tuple[str, ...]:
    return (f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}")


CLASS_OF = {"tessera": "whole-gpu.tessera.dev", "tessera-per-gpu": "whole-gpu.tessera.dev",
            "plain": "gpu.plain.bench", "plain-untyped": "plain.bench"}
SLICES_OF: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "tessera": tessera_slices,
    "tessera-per-gpu": tessera_per_gpu_slices,
    "plain": plain_slices,
    "plain-untyped": lambda node: plain_slices(node, typed=False),
}
MODES = tuple(SLICES_OF)


def device_classes() -> list[dict[str, Any]]:
    def cls(name: str, expression: str) -> dict[str, Any]:
        return {"apiVersion": RESOURCE_API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}

    return [
        cls("whole-gpu.tessera.dev",  # as in manifests/deviceclasses.yaml, without the extended resource
            f'device.driver == "{DRIVER_NAME}" && device.attributes["{DRIVER_NAME}"].type == "gpu"'),
        cls("gpu.plain.bench",
            f'device.driver == "{PLAIN_DRIVER}" && device.attributes["{PLAIN_DRIVER}"].type == "gpu"'),
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


async def in_parallel(calls: list[Any], width: int = 32) -> list[Any]:
    gate = asyncio.Semaphore(width)

    async def one(call: Any) -> Any:
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/<pid>/stat``, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    elapsed: float  # resume -> every Pod bound
    first: float  # resume -> the first Pod bound
    median: float  # resume -> half the Pods bound
    setup: float  # Nodes, slices, claims and Pods created
    scheduler_cpu: float  # kube-scheduler's CPU seconds from the resume to the last bind
    apiserver_cpu: float  # kube-apiserver's, over the same time
    load: tuple[float, float, float]  # the load averages when the last Pod was bound

    def rate(self, pods: int) -> float:
        return pods / self.elapsed


async def run_once(mode: str, nodes: int, pods: int, qps: int) -> Run:
    """Set up ``mode`` on a fresh control plane, let ``pods`` Pods pile up before a paused
    scheduler, resume it and time until every Pod is bound."""
    limits = rate_limit_args(qps)
    cluster = await asyncio.to_thread(LocalCluster.start, scheduler_args=limits, controller_manager_args=limits)
    try:
        async with KubeClient(load_kubeconfig(cluster.kubeconfig)) as kube:
            set_up = time.perf_counter()
            for c in device_classes():
                await kube.create(CLASSES, c)
            await kube.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            made = await in_parallel([kube.create(NODES, node(f"n-{i:04d}")) for i in range(nodes)])
            await in_parallel([kube.create(SLICES, s) for each in made for s in SLICES_OF[mode](each)])
            await in_parallel([kube.create(CLAIMS, claim(i, CLASS_OF[mode])) for i in range(pods)])

            listed = await kube.list_page(PODS)
            bound: dict[str, float] = {}
            all_bound = asyncio.Event()

            async def watch() -> None:
                # The apiserver ends a watch whose reader falls behind: go on from the last version seen.
                version = listed["metadata"]["resourceVersion"]
                while True:
                    async for _, obj in kube.watch(PODS, resource_version=version, bookmarks=True):
                        version = obj["metadata"]["resourceVersion"]
                        name = obj["metadata"].get("name")
                        if name and obj.get("spec", {}).get("nodeName") and name not in bound:
                            bound[name] = time.perf_counter()
                            if len(bound) == pods:
                                all_bound.set()
                                return

            watcher = asyncio.create_task(watch())
            scheduler, apiserver = cluster.pid("kube-scheduler"), cluster.pid("kube-apiserver")
            cluster.pause("kube-scheduler")
            try:
                await in_parallel([kube.create(PODS, pod(i)) for i in range(pods)])
            finally:
                cpu_before = cpu_seconds(scheduler), cpu_seconds(apiserver)
                cluster.resume("kube-scheduler")
            started = time.perf_counter()
            setup = started - set_up
            if bound:
                raise RuntimeError(f"{mode}: {len(bound)} Pods were bound while the scheduler was paused")
            done = asyncio.create_task(all_bound.wait())
            await asyncio.wait({watcher, done}, timeout=1800, return_when=asyncio.FIRST_COMPLETED)
            elapsed = time.perf_counter() - started
            cpu_after = cpu_seconds(scheduler), cpu_seconds(apiserver)
            load = os.getloadavg()
            if not all_bound.is_set():  # the watch failed or ended early: say why, measure nothing
                done.cancel()
                if watcher.done():
                    watcher.result()
                watcher.cancel()
                raise RuntimeError(f"{mode}: only {len(bound)} of {pods} Pods seen bound")
            times = sorted(t - started for t in bound.values())
            return Run(elapsed=elapsed, first=times[0], median=statistics.median(times), setup=setup,
                       scheduler_cpu=cpu_after[0] - cpu_before[0], apiserver_cpu=cpu_after[1] - cpu_before[1],
                       load=load)
    finally:
        await asyncio.to_thread(cluster.stop)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--qps", type=int, default=2000,
                        help="the scheduler's and controller manager's --kube-api-qps (burst: twice that)")
    parser.add_argument("--modes", default="tessera,plain",
                        help=f"comma-separated, any of {', '.join(MODES)}; ratios are to plain, so list it")
    args = parser.parse_args()
    if args.pods > args.nodes * GPUS_PER_NODE:
        parser.error(f"--pods must be at most nodes x {GPUS_PER_NODE} (one whole GPU per Pod)")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in SLICES_OF]
    if unknown or not modes or len(set(modes)) != len(modes):
        parser.error(f"--modes {args.modes!r}: name each of {', '.join(MODES)} at most once "
                     f"({'unknown: ' + ', '.join(unknown) if unknown else 'none given or one twice'})")
    print(f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.pods} Pods with one claim each, "
          f"scheduler and controller manager {' '.join(rate_limit_args(args.qps))}; "
          "Pods created before a paused scheduler, clock from its resume", flush=True)
    rate_ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    for trial in range(args.trials):
        rates: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for mode in (modes if trial % 2 == 0 else list(reversed(modes))):
            run = await run_once(mode, args.nodes, args.pods, args.qps)
            rates[mode] = run.rate(args.pods)
            cpu[mode] = run.scheduler_cpu / args.pods
            print(f"trial {trial + 1} {mode:15} {rates[mode]:7.1f} Pods/s  ({run.elapsed:.2f} s to bind all, "
                  f"first bound at {run.first:.2f} s, half at {run.median:.2f} s; set-up took {run.setup:.1f} s); "
                  f"CPU per Pod: scheduler {1000 * cpu[mode]:.2f} ms, apiserver "
                  f"{1000 * run.apiserver_cpu / args.pods:.2f} ms; load {' '.join(f'{x:.2f}' for x in run.load)}",
                  flush=True)
        if "plain" not in rates:
            continue
        for mode in rates:
            if mode == "plain":
                continue
            rate_ratios.setdefault(mode, []).append(rates[mode] / rates["plain"])
            cpu_ratios.setdefault(mode, []).append(cpu["plain"] / cpu[mode])
            print(f"trial {trial + 1} ratio {mode}/plain {rate_ratios[mode][-1]:.2f} (Pods/s); "
                  f"scheduler CPU per Pod plain/{mode} {cpu_ratios[mode][-1]:.2f}", flush=True)
    for mode, ratios in rate_ratios.items():
        print(f"median ratio {mode}/plain over {args.trials} trials: {statistics.median(ratios):.2f} (Pods/s), "
              f"{statistics.median(cpu_ratios[mode]):.2f} (scheduler CPU per Pod, plain/{mode})")


if __name__ == "__main__":
    asyncio.run(main())
