"""kube-scheduler after an apiserver outage: does it allocate a device tainted NoSchedule just
after the apiserver came back? (Why the operator holds handovers after an outage:
``tessera.controller.handover``.)

    .venv/bin/python benchmarks/bench_stale_scheduler.py [--trials 6] [--down 1.0]
        [--free-after 0 5 15] [--waiting 3]

Starts its own control plane (no Tessera: the scheduler alone) with one node, one device and a
Pod holding it; ``--waiting`` Pods wait for a device of the same class. Each trial kills the
kube-apiserver, starts it again after ``--down`` seconds, at once publishes the device tainted
``NoSchedule``, waits ``--free-after`` seconds, then deletes the holding Pod (its claim goes,
the device is free). A waiting Pod bound within 20 s after that was allocated the tainted
device: the scheduler acted on the slice it saw before the outage. The same without the outage
is the control. Prints each trial and, per free-after, how many trials saw a stale allocation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator" / "src"))

from tessera.localcluster import LocalCluster  # noqa: E402
from tessera.localcluster.workloads import claim_template, pod_with_claim  # noqa: E402

DRIVER = "stale.bench.tessera.dev"
NODE = "stale-node"
NAMESPACE = "stale"


def device_slice(generation: int, tainted: bool) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "d0", "attributes": {"type": {"string": "gpu"}}}
    if tainted:
        device["taints"] = [{"key": "tessera.dev/handover", "effect": "NoSchedule"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "stale-bench"},
            "spec": {"driver": DRIVER, "nodeName": NODE, "devices": [device],
                     "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1}}}


def bound(cluster: LocalCluster, names: set[str]) -> set[str]:
    pods = cluster.get_json("pods", "-n", NAMESPACE)["items"]
    return {p["metadata"]["name"] for p in pods if p["metadata"]["name"] in names and p["spec"].get("nodeName")}


def create(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod_with_claim(name, NAMESPACE, "one")))


def trial(cluster: LocalCluster, number: int, generation: int, outage: bool, down: float, free_after: float,
          waiting: int) -> bool:
    """True if a waiting Pod was allocated the device after it was published tainted."""
    cluster.apply_objects([device_slice(generation, tainted=False)])
    holder = f"hold-{number}"
    create(cluster, holder)
    deadline = time.monotonic() + 60
    while holder not in bound(cluster, {holder}):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{holder} was not scheduled")
        time.sleep(0.2)
    names = {f"wait-{number}-{i}" for i in range(waiting)}
    for name in sorted(names):
        create(cluster, name)
    time.sleep(3)  # the waiting Pods are tried, found unschedulable, and parked
    if outage:
        cluster.kill_apiserver()
        time.sleep(down)
        cluster.start_apiserver()
    cluster.apply_objects([device_slice(generation + 1, tainted=True)])
    time.sleep(free_after)
    cluster.kubectl("delete", "pod", holder, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false")
    freed = time.monotonic()
    stale: set[str] = set()
    while time.monotonic() - freed < 20 and not stale:
        stale = bound(cluster, names)
        time.sleep(0.2)
    cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false")
    deadline = time.monotonic() + 60
    while cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"] and time.monotonic() < deadline:
        time.sleep(0.5)
    return bool(stale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6, help="trials per free-after, with and without the outage")
    parser.add_argument("--down", type=float, default=1.0, help="seconds the apiserver stays killed")
    parser.add_argument("--free-after", type=float, nargs="+", default=[0.0, 5.0, 15.0],
                        help="seconds from the taint's write to the device's release")
    parser.add_argument("--waiting", type=int, default=3, help="Pods waiting for the device")
    args = parser.parse_args()
    results: dict[tuple[float, bool], list[bool]] = {}
    with LocalCluster.start() as cluster:
        cluster.add_node(NODE)
        cluster.kubectl("create", "namespace", NAMESPACE)
        while cluster.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode:
            time.sleep(0.2)
        cluster.apply_objects([
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "stale-bench"},
             "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}},
            claim_template("one", NAMESPACE, "stale-bench"),
        ])
        generation, number = 1, 0
        for free_after in args.free_after:
            for _ in range(args.trials):
                for outage in (False, True):
                    stale = trial(cluster, number, generation, outage, args.down, free_after, args.waiting)
                    results.setdefault((free_after, outage), []).append(stale)
                    print(f"trial {number}: outage {'yes' if outage else 'no '} free after {free_after:4.1f} s: "
                          f"{'STALE allocation of the tainted device' if stale else 'not allocated'}", flush=True)
                    generation += 2
                    number += 1
    print("\nstale allocations of a device tainted just after the apiserver came back:")
    for (free_after, outage), runs in sorted(results.items()):
        print(f"  free after {free_after:4.1f} s, {'after an outage' if outage else 'no outage    '}: "
              f"{sum(runs)} of {len(runs)} trials")


if __name__ == "__main__":
    main()
