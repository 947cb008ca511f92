"""The agent's last line, priced: what one claim check costs (a consistent list of every
ResourceClaim of the cluster, then the allocations of this node picked out), against a real
local control plane holding N allocated claims; and what a whole repartition pays for it (one
check per destroying or reshaping operation).

    .venv/bin/python benchmarks/bench_claimguard.py [--claims 100,1000,3000] [--reads 20]

The claims are created and allocated (status subresource, as the scheduler writes it) through
the API with 32 requests in flight; one in fifty is allocated a device of the measured node.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from tessera import DRIVER_NAME
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.claimguard import ClaimGuard, allocated_devices_on_node
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.kube.claims import list_resource_claims
from tessera.kube.http import KubeClient, resource_path
from tessera.localcluster import LocalCluster
from tessera.log import configure_logging
from tessera.models.layout import GpuLayout, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import Strategy

NODE = "bench-node"
NAMESPACE = "bench-claims"
GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceclaims"


def claim(i: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c-{i:05d}", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
    }


def allocation(i: int) -> dict[str, Any]:
    pool = NODE if i % 50 == 0 else f"other-{i % 97}"
    result = {"request": "gpu", "driver": DRIVER_NAME, "pool": pool, "device": f"gpu-{i % 8}"}
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


async def fill(api: KubeClient, start: int, stop: int) -> None:
    semaphore = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with semaphore:
            await api.create(resource_path(GROUP, VERSION, PLURAL, namespace=NAMESPACE), claim(i))
            await api.patch(resource_path(GROUP, VERSION, PLURAL, f"c-{i:05d}", namespace=NAMESPACE,
                                          subresource="status"), allocation(i))

    await asyncio.gather(*(one(i) for i in range(start, stop)))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(kube: KubeClient, reads: int) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, devices of this node) of one check."""
    times = []
    found = 0
    for _ in range(reads):
        t = time.perf_counter()
        claims = await list_resource_claims(kube)
        found = len(allocated_devices_on_node(claims, DRIVER_NAME, NODE))
        times.append((time.perf_counter() - t) * 1000)
    return percentile(times, 0.5), percentile(times, 0.99), found


async def repartition(kube: KubeClient) -> tuple[int, float]:
    """A 7 x 1g.10gb GPU becomes one 7g.80gb: (claim reads, seconds) of the guarded apply."""
    backend = SimulatedBackend.from_spec(NODE, "1xH100-80GB")
    gpu = backend.inventory().gpus[0].uuid
    small = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu, strategy=Strategy.MIG, mig_instances=[
        PlacedInstance(profile="1g.10gb", start=s) for s in range(7)])])
    first = apply_layout(backend, small)
    published = build_status(first.inventory, small, first.plans, backend="simulated", agent_version="bench",
                             observed_generation=1)
    big = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu, strategy=Strategy.MIG,
                                         mig_instances=[PlacedInstance(profile="7g.80gb", start=0)])])
    loop = asyncio.get_running_loop()

    def list_claims() -> list[dict[str, Any]]:
        return asyncio.run_coroutine_threadsafe(list_resource_claims(kube), loop).result(60)

    guard = ClaimGuard(list_claims, driver=DRIVER_NAME, node="no-claims-here", spec=big, published=published)
    t = time.perf_counter()
    result = await asyncio.to_thread(apply_layout, backend, big, guard=guard)
    elapsed = time.perf_counter() - t
    assert not result.refusals, result.refusals
    return guard.checks, elapsed


async def run(counts: list[int], reads: int) -> int:
    cluster = await asyncio.to_thread(LocalCluster.start)
    try:
        kube = KubeClient.from_environment(str(cluster.kubeconfig))  # the agent's client: fills and checks
        cluster.kubectl("create", "namespace", NAMESPACE)
        rows = []
        made = 0
        for n in counts:
            t = time.perf_counter()
            await fill(kube, made, n)
            made = n
            print(f"{n} claims created and allocated in {time.perf_counter() - t:.1f}s", flush=True)
            p50, p99, found = await measure(kube, reads)
            checks, seconds = await repartition(kube)
            rows.append((n, p50, p99, found, checks, seconds))
        await kube.close()
    finally:
        await asyncio.to_thread(cluster.stop)
    print(f"\none claim check = list every ResourceClaim (consistent read) + pick this node's ({reads} reads)")
    print(f"{'claims':>7}  {'check p50':>10}  {'check p99':>10}  {'on node':>7}  "
          f"{'7x1g -> 7g: checks':>19}  {'apply':>7}")
    for n, p50, p99, found, checks, seconds in rows:
        print(f"{n:>7}  {p50:>8.1f}ms  {p99:>8.1f}ms  {found:>7}  {checks:>19}  {seconds:>6.2f}s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", default="100,1000,3000", help="cumulative claim counts (default 100,1000,3000)")
    parser.add_argument("--reads", type=int, default=20, help="checks timed per count")
    args = parser.parse_args()
    configure_logging("warning")
    counts = sorted(int(x) for x in str(args.claims).split(",") if x.strip())
    return asyncio.run(run(counts, args.reads))


if __name__ == "__main__":
    sys.exit(main())
