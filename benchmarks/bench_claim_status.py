"""What writing a claim's ``status.devices`` costs at a prepare and an unprepare (the kubelet
plugin writes it after its answer, so the kubelet no longer waits for it): p50 / p99 of the
server-side apply the plugin makes (``tessera.kube.claimstatus``), against the real local
control plane, for claims allocated one device each.

    .venv/bin/python benchmarks/bench_claim_status.py [--claims 100] [--concurrency 8]

Prints the latency of a write (at prepare) and of a clear (at unprepare), sequential and with
``--concurrency`` writes in flight (the kubelet prepares a Pod's claims together).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from tessera.kube.claimstatus import apply_claim_device_status
from tessera.kube.http import KubeClient
from tessera.localcluster import LocalCluster

NODE = "bench-node"
NAMESPACE = "bench"


def _claims(cluster: LocalCluster, count: int) -> list[dict[str, Any]]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    bodies = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": f"c-{i}", "namespace": NAMESPACE},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}}}
              for i in range(count)]
    cluster.apply_objects(bodies)
    out = []
    for i in range(count):
        claim = cluster.get_json("resourceclaim", f"c-{i}", "-n", NAMESPACE)
        claim["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.tessera.dev", "pool": NODE, "device": f"gpu-{i % 8}"}]}}}
        cluster.kubectl("replace", "--subresource=status", "-f", "-", input=json.dumps(claim))
        out.append(claim)
    return out


def _entry(claim: dict[str, Any]) -> dict[str, Any]:
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    return {"driver": "gpu.tessera.dev", "pool": NODE, "device": device,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "data": {"uuid": f"GPU-{device}", "driverVersion": "580.95.5"}}


async def _measure(client: Any, claims: list[dict[str, Any]], clear: bool, concurrency: int) -> list[float]:
    limit = asyncio.Semaphore(concurrency)
    times: list[float] = []

    async def one(claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        async with limit:
            started = time.perf_counter()
            await apply_claim_device_status(client, NAMESPACE, meta["name"], meta["uid"], f"gpu.tessera.dev/{NODE}",
                                            [] if clear else [_entry(claim)])
            times.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(one(c) for c in claims))
    return times


def _line(what: str, times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"  {what:<28} p50 {statistics.median(ordered):6.1f} ms   p99 {p99:6.1f} ms   (n={len(ordered)})"


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    with LocalCluster.start() as cluster:
        claims = _claims(cluster, args.claims)
        async with KubeClient.from_environment(str(cluster.kubeconfig)) as client:
            await _measure(client, claims[:5], clear=False, concurrency=1)  # warm the connection
            await _measure(client, claims[:5], clear=True, concurrency=1)
            print(f"claim status writes, {args.claims} claims, local control plane")
            print(_line("write, one at a time", await _measure(client, claims, False, 1)))
            print(_line("clear, one at a time", await _measure(client, claims, True, 1)))
            n = args.concurrency
            print(_line(f"write, {n} in flight", await _measure(client, claims, False, n)))
            print(_line(f"clear, {n} in flight", await _measure(client, claims, True, n)))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
