"""Prepare latency of the DRA kubelet plugin on the simulated backend: p50 / p99 per device
kind, called over the real DRA unix socket the way the kubelet calls it.

Claims are served from memory (no apiserver), so the figures are the plugin's own cost: the
gRPC round trip, resolving devices against the GPUs, holds, dynamic MIG creation, the CDI
spec and checkpoint writes (each fsync'ed). Every claim is unprepared after it is measured,
so dynamic instances can be made again.

    .venv/bin/python benchmarks/bench_prepare.py [--rounds 200] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.plugin import KubeletPlugin, PluginConfig
from tessera.agent.plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tessera.log import configure_logging
from tessera.models.devices import dynamic_mig_device_name, gpu_device_name, mig_device_name

NODE = "bench-node"
DRIVER = "gpu.tessera.dev"
KINDS: dict[str, tuple[str, dict[str, str] | None]] = {
    "whole GPU": (gpu_device_name(3), None),
    "static MIG": (mig_device_name(0, "3g.40gb", 0), None),
    "MPS share": (gpu_device_name(1), {"memory": "4Gi", "compute": "10"}),
    "dynamic MIG": (dynamic_mig_device_name(2, "1g.10gb", 0), None),
}


class MemoryClaims:
    """A claim reader over a dict: what the apiserver would return, without the apiserver."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def make(self, device: str, consumed: dict[str, str] | None) -> dict[str, Any]:
        uid = str(uuid.uuid4())
        result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
        if consumed:
            result |= {"consumedCapacity": consumed, "shareID": uid[:8]}
        claim = {"metadata": {"namespace": "bench", "name": f"c-{uid[:8]}", "uid": uid},
                 "status": {"allocation": {"devices": {"results": [result]}}}}
        self.claims[claim["metadata"]["name"]] = claim
        return claim

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get(name)


def backend() -> SimulatedBackend:
    b = SimulatedBackend.from_spec(NODE, "4xH100-80GB")
    gpus = b.inventory().gpus
    b.set_mig_mode(gpus[0].uuid, True)
    b.create_instance(gpus[0].uuid, "3g.40gb", 0)
    b.start_mps(gpus[1].uuid)
    b.set_mig_mode(gpus[2].uuid, True)
    return b


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(rounds: int, concurrency: int, root: Path) -> int:
    claims = MemoryClaims()
    config = PluginConfig(node_name=NODE, registry_dir=root / "reg", plugin_dir=root / "plugin",
                          cdi_dir=root / "cdi", proc_root=root / "proc")
    async with KubeletPlugin(config, backend(), claims) as plugin, \
            grpc.aio.insecure_channel(f"unix://{plugin.config.dra_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)

        async def once(device: str, consumed: dict[str, str] | None) -> tuple[float, float]:
            body = claims.make(device, consumed)
            msg = dra_v1_pb2.Claim(namespace="bench", name=body["metadata"]["name"], uid=body["metadata"]["uid"])
            start = time.perf_counter()
            prepared = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[msg]))
            middle = time.perf_counter()
            await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[msg]))
            end = time.perf_counter()
            error = prepared.claims[msg.uid].error
            if error:
                raise RuntimeError(error)
            return middle - start, end - middle

        print(f"{rounds} prepare+unprepare rounds per kind over the DRA socket; CDI + checkpoint in {root}")
        print(f"{'kind':<14} {'prepare p50':>12} {'p99':>9} {'unprepare p50':>14} {'p99':>9}")
        for kind, (device, consumed) in KINDS.items():
            for _ in range(5):  # warm up
                await once(device, consumed)
            times = [await once(device, consumed) for _ in range(rounds)]
            prep = [t[0] * 1000 for t in times]
            unprep = [t[1] * 1000 for t in times]
            print(f"{kind:<14} {statistics.median(prep):>10.2f}ms {percentile(prep, 0.99):>7.2f}ms "
                  f"{statistics.median(unprep):>12.2f}ms {percentile(unprep, 0.99):>7.2f}ms")

        # Many kubelet calls at once: MPS shares of one GPU (no hardware lock), each its own call.
        shares = [claims.make(gpu_device_name(1), {"memory": "1Gi", "compute": "1"}) for _ in range(rounds)]
        latencies: list[float] = []
        semaphore = asyncio.Semaphore(concurrency)

        async def timed(body: dict[str, Any]) -> None:
            msg = dra_v1_pb2.Claim(namespace="bench", name=body["metadata"]["name"], uid=body["metadata"]["uid"])
            async with semaphore:
                start = time.perf_counter()
                await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[msg]))
                latencies.append((time.perf_counter() - start) * 1000)

        wall = time.perf_counter()
        await asyncio.gather(*(timed(b) for b in shares))
        wall = time.perf_counter() - wall
        print(f"{'MPS, ' + str(concurrency) + ' at once':<14} {statistics.median(latencies):>10.2f}ms "
              f"{percentile(latencies, 0.99):>7.2f}ms   ({rounds / wall:.0f} prepares/s, {len(shares)} claims held)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=None, help="CDI specs and checkpoint go here (default: a temp dir)")
    args = parser.parse_args()
    configure_logging("warning")
    if args.dir is not None:
        return asyncio.run(run(args.rounds, args.concurrency, args.dir))
    with tempfile.TemporaryDirectory(prefix="tb-", dir="/tmp") as tmp:
        return asyncio.run(run(args.rounds, args.concurrency, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
