"""Benchmark: adaptive layouts end to end on a real node: from a Pod whose claim fits no
published device to that Pod Running on the partition a recut made for it.

    .venv/bin/python benchmarks/bench_adaptive_e2e.py [--tries 20] [--pending-after 1s]

A real node (kubelet, containerd, runc, CNI, as ``tests/integration/test_real_nodes.py`` runs
them) with one simulated H100 under an Adaptive policy: idle layout ``whole``, menu
``whole`` and ``halves`` (two 3g.40gb), cooldown 1 s. Each try applies a Pod whose claim asks
for a 3g slice; the GPU is published whole, so the Pod is Unschedulable until the operator's
demand room recuts the GPU (debounce ``--pending-after``, handover grace 1 s, the agent's apply,
the publish, the scheduler's retry, the kubelet's prepare and the container start). The time
is from the Pod's creation to its ``Running`` phase. The Pod is then deleted, and the next try
waits for the GPU to be back to whole (the cooldown, then the idle layout: with one GPU there
is no whole GPU to spare, so it goes back). Prints p50 and p99 over the tries.
Needs real nodes on this machine (``tessera.localcluster.nodes.real_nodes_possible``).
Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.processes import TesseraProcesses
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim, show_devices_args

ROOT = Path(__file__).resolve().parents[1]
NODE = "adaptive-real"
NAMESPACE = "adaptive-e2e"
THREE_G = 'device.attributes["gpu.tessera.dev"].migProfile == "3g.40gb"'


def policy(pending_after: str) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "adaptive-e2e"},
        "spec": {
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE}},
            "strategy": "Adaptive",
            "adaptive": {
                "layouts": [{"name": "whole"},
                            {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}}],
                "idle": "whole", "cooldown": "1s", "maxRecuts": 1, "pendingAfter": pending_after,
            },
        },
    }


def wait(what: str, check: Any, timeout: float = 120.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def devices(cluster: LocalCluster) -> list[str]:
    items = cluster.get_json("resourceslices", "--field-selector", f"spec.nodeName={NODE}")["items"]
    return sorted(d["name"] for s in items for d in s["spec"].get("devices") or [])


def phase(cluster: LocalCluster, pod: str) -> str:
    out = cluster.kubectl("get", "pod", pod, "-n", NAMESPACE, "-o", "json", check=False)
    return str(json.loads(out.stdout)["status"].get("phase", "")) if out.returncode == 0 else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--pending-after", default="1s")
    args = parser.parse_args(argv)
    why_not = real_nodes_possible()
    if why_not:
        print(f"no real nodes on this machine: {why_not}")
        return 2
    times: list[float] = []
    with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster, \
            tempfile.TemporaryDirectory(prefix="tessera-adaptive-e2e-") as folder:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        processes = TesseraProcesses(cluster, Path(folder))
        node = RealNode.start(cluster, NODE)
        try:
            processes.operator()
            processes.agent_on(node, "1xH100-80GB")
            cluster.kubectl("create", "namespace", NAMESPACE)
            cluster.apply_objects([policy(args.pending_after),
                                   claim_template("three-g", NAMESPACE, "mig.tessera.dev", THREE_G)])
            wait("the GPU published whole", lambda: devices(cluster) == ["gpu-0"])
            for i in range(args.tries):
                pod = f"slice-{i}"
                started = time.monotonic()
                cluster.apply_objects([pod_with_claim(pod, NAMESPACE, "three-g", on_node(NODE), BUSYBOX_IMAGE,
                                                      show_devices_args(600))])
                wait(f"{pod} Running", lambda pod=pod: phase(cluster, pod) == "Running", interval=0.05)
                times.append(time.monotonic() - started)
                print(f"try {i}: Running after {times[-1]:.1f} s", flush=True)
                cluster.kubectl("delete", "pod", pod, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=true")
                wait("the GPU back to whole", lambda: devices(cluster) == ["gpu-0"])
        finally:
            processes.stop_all()
            node.stop()
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"adaptive e2e (pendingAfter {args.pending_after}, real node): {len(times)} tries, "
          f"p50 {statistics.median(times):.1f} s, p99 {p99:.1f} s, max {times[-1]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
