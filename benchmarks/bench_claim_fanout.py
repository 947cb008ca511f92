"""What the agents' claim watches cost the apiserver: every agent watching every ResourceClaim
(the claim guard's own watch, for a spec that does not say ``claimCheck: Operator``) against
every agent watching only its fence claim (the operator answers its checks:
``tessera.controller.claimchecks``), on a real local control plane.

    .venv/bin/python benchmarks/bench_claim_fanout.py [--watchers 200] [--writes 1000]

Each phase opens ``--watchers`` watches (one per simulated agent) and then makes ``--writes``
annotation writes to 50 claims, 8 in flight, measuring the apiserver's CPU (user + system from
/proc) over the writes. The watches consume their events (as an agent's ``ListWatch`` does),
all in this process. Per event and watcher = (CPU with watchers - CPU with none) / (writes x
watchers), and what each claim event costs at 5,000 nodes follows from it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from tessera import INSTALL_NAMESPACE, RESOURCE_GROUP, RESOURCE_VERSION
from tessera.agent.claimview import fence_claim_name
from tessera.kube.claims import write_claim_fence
from tessera.kube.http import KubeClient, load_kubeconfig, resource_path
from tessera.kube.watch import ListWatch
from tessera.localcluster import LocalCluster
from tessera.log import configure_logging

NAMESPACE = "bench-fanout"
CLAIMS = 50
FLEET_NODES = 5000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def claim(i: int) -> dict[str, Any]:
    return {"apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}", "kind": "ResourceClaim",
            "metadata": {"name": f"c-{i:03d}", "namespace": NAMESPACE}, "spec": {"devices": {}}}


async def writes(api: KubeClient, count: int) -> None:
    semaphore = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with semaphore:
            await api.patch(resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", f"c-{i % CLAIMS:03d}",
                                          namespace=NAMESPACE),
                            {"metadata": {"annotations": {"bench/n": str(i)}}})

    await asyncio.gather(*(one(i) for i in range(count)))


async def phase(api: KubeClient, pid: int, watchers: list[ListWatch], count: int, seen: list[int]) -> float:
    """Apiserver CPU seconds over ``count`` writes while ``watchers`` watch."""
    for watch in watchers:
        watch.start()
    for watch in watchers:
        await watch.listed.wait()
    await asyncio.sleep(1.0)
    seen[0] = 0
    before = cpu_seconds(pid)
    await writes(api, count)
    await asyncio.sleep(1.0)  # the last events reach the watchers
    spent = cpu_seconds(pid) - before
    for watch in watchers:
        await watch.stop()
    return spent


async def run(watchers: int, count: int, rounds: int) -> int:
    cluster = await asyncio.to_thread(LocalCluster.start)
    try:
        api = KubeClient.from_environment(str(cluster.kubeconfig))
        # The watchers' own client, with a connection each (as each agent has its own).
        watching = KubeClient(load_kubeconfig(str(cluster.kubeconfig)), connections=watchers + 4)
        cluster.kubectl("create", "namespace", NAMESPACE)
        cluster.kubectl("create", "namespace", INSTALL_NAMESPACE)
        for i in range(CLAIMS):
            await api.create(resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", namespace=NAMESPACE),
                             claim(i))
        for w in range(watchers):  # each agent's fence claim, as the agents make them
            await write_claim_fence(api, INSTALL_NAMESPACE, fence_claim_name(f"node-{w}"), "0", node=f"node-{w}")
        pid = cluster.pid("kube-apiserver")
        seen = [0]

        def count_event(kind: str, body: dict[str, Any]) -> None:
            seen[0] += 1

        def every_claim() -> list[ListWatch]:
            return [ListWatch(watching, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", count_event)
                    for _ in range(watchers)]

        def own_fence() -> list[ListWatch]:
            return [ListWatch(watching, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", count_event,
                              field_selector=f"metadata.name={fence_claim_name(f'node-{w}')},"
                                             f"metadata.namespace={INSTALL_NAMESPACE}")
                    for w in range(watchers)]

        results: dict[str, list[tuple[float, int]]] = {"none": [], "every claim": [], "own fence claim": []}
        for _ in range(rounds):  # alternated, so that the machine's drift touches each alike
            for name, make in (("none", list), ("every claim", every_claim), ("own fence claim", own_fence)):
                spent = await phase(api, pid, make(), count, seen)
                results[name].append((spent, seen[0]))
                print(f"{name:>16}: {spent:6.2f} s apiserver CPU, {seen[0]} events delivered", flush=True)
        await api.close()
        await watching.close()
    finally:
        await asyncio.to_thread(cluster.stop)

    base = sorted(s for s, _ in results["none"])[len(results["none"]) // 2]
    print(f"\n{count} claim writes, {watchers} watchers; median apiserver CPU over {rounds} round(s):")
    for name, runs in results.items():
        spent = sorted(s for s, _ in runs)[len(runs) // 2]
        per = (spent - base) / (count * watchers) * 1e6 if name != "none" else 0.0
        print(f"{name:>16}: {spent:6.2f} s; {per:5.2f} µs per event per watcher; "
              f"at {FLEET_NODES} agents {per * FLEET_NODES / 1000:6.1f} ms per claim event")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=200, help="agents watching (default 200)")
    parser.add_argument("--writes", type=int, default=1000, help="claim writes per phase (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (default 3)")
    args = parser.parse_args()
    configure_logging("warning")
    return asyncio.run(run(args.watchers, args.writes, args.rounds))


if __name__ == "__main__":
    raise SystemExit(main())
