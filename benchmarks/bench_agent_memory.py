"""Benchmark: the node agent's memory (RSS), idle after start and after 1,000 prepares.

    .venv/bin/python benchmarks/bench_agent_memory.py [--prepares 1000] [--simulate 1xH100-80GB]

Starts the local control plane and one real ``tessera agent`` process (simulated backend,
kubelet plugin on), the way the integration tests start it (``TesseraProcesses.agent``). Once
its NodeLayout reports the GPUs and it has sat idle a moment, reads VmRSS from
``/proc/<pid>/status``. Then creates ``--prepares`` ResourceClaims allocated (as the scheduler
would write it) the node's whole ``gpu-0`` and, one claim after another, calls
NodePrepareResources and NodeUnprepareResources on the plugin's DRA socket as the kubelet
does: each prepare reads its claim from the API and writes the claim's device status back.
Reads VmRSS again and prints both, with VmHWM (the peak).

The claims are made with kubectl and the calls use only the generated gRPC stubs, so the same
script measures older agents too (run it with ``PYTHONPATH`` pointing at another checkout's
``operator/src``). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from tessera.agent.plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tessera.localcluster import LocalCluster
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses

ROOT = Path(__file__).resolve().parents[1]
NODE = "mem-node"
NAMESPACE = "agent-memory"
IDLE_SECONDS = 5.0  # after the first status: let start-up work (and its garbage) settle


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, and RssAnon (its heaps) and RssFile (code and libraries), in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def wait(condition: Any, timeout: float, what: str, agent: TesseraProcess) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not agent.alive():
            raise RuntimeError(f"the agent exited while waiting for {what}:\n{agent.tail()}")
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}:\n{agent.tail()}")


def reported_gpus(cluster: LocalCluster) -> int:
    done = cluster.kubectl("get", "nodelayouts.tessera.dev", NODE, "-o", "json", check=False)
    if done.returncode != 0:
        return 0
    return len((json.loads(done.stdout).get("status") or {}).get("gpus") or [])


def allocated_claims(cluster: LocalCluster, count: int) -> list[dict[str, Any]]:
    """``count`` claims whose status says they were allocated this node's gpu-0."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    claims = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": f"c-{i:05d}", "namespace": NAMESPACE},
               "spec": {"devices": {"requests": [{"name": "gpu",
                                                  "exactly": {"deviceClassName": "whole-gpu.tessera.dev"}}]}}}
              for i in range(count)]
    cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                       "items": claims}), timeout=300)
    created = json.loads(cluster.kubectl("get", "resourceclaims", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    for claim in created:
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.tessera.dev", "pool": NODE, "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        }}
    cluster.kubectl("replace", "--subresource=status", "-f", "-", "-o", "name",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": created}), timeout=300)
    return sorted(created, key=lambda c: str(c["metadata"]["name"]))


async def prepare_each(socket: Path, claims: list[dict[str, Any]]) -> float:
    """Prepare and unprepare every claim in turn, as the kubelet would; seconds taken."""
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for claim in claims:
            meta = claim["metadata"]
            msg = dra_v1_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
            prepared = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[msg]))
            if prepared.claims[msg.uid].error:
                raise RuntimeError(f"prepare of {meta['name']} failed: {prepared.claims[msg.uid].error}")
            unprepared = await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[msg]))
            if unprepared.claims[msg.uid].error:
                raise RuntimeError(f"unprepare of {meta['name']} failed: {unprepared.claims[msg.uid].error}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepares", type=int, default=1000)
    parser.add_argument("--simulate", default="1xH100-80GB")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="add to the agent's environment (an allocator setting to compare); NAME= unsets")
    args = parser.parse_args()
    env: dict[str, str | None] = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env takes NAME=VALUE, not {item!r}")
        env[name] = value or None
    with tempfile.TemporaryDirectory(prefix="tm-", dir="/tmp") as tmp, LocalCluster.start() as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        cluster.add_node(NODE)
        processes = TesseraProcesses(cluster, Path(tmp))
        try:
            agent = processes.agent(NODE, args.simulate, env=env)
            socket = processes.node_folder(NODE) / "plugins" / "gpu.tessera.dev" / "dra.sock"
            wait(lambda: reported_gpus(cluster) > 0 and socket.is_socket(), 120, "the agent's first status", agent)
            time.sleep(IDLE_SECONDS)
            idle = memory(agent.popen.pid)
            claims = allocated_claims(cluster, args.prepares)
            seconds = asyncio.run(prepare_each(socket, claims))
            time.sleep(IDLE_SECONDS)
            after = memory(agent.popen.pid)
        finally:
            processes.stop_all()
    settings = "".join(f", {item}" for item in args.env)
    print(f"agent ({sys.executable} -m tessera agent, {args.simulate}, kubelet plugin on{settings})")
    def split(kib: dict[str, int]) -> str:
        return f"anon {mib(kib['RssAnon'])}, file {mib(kib['RssFile'])}; peak VmHWM {mib(kib['VmHWM'])}"

    print(f"  idle after start:             VmRSS {mib(idle['VmRSS'])}  ({split(idle)})")
    print(f"  after {len(claims)} prepare+unprepare: VmRSS {mib(after['VmRSS'])}  ({split(after)})"
          f"  [{len(claims) / seconds:.0f} prepares/s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
