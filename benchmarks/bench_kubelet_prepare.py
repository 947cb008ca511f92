"""Benchmark: prepare latency as the kubelet itself records it, on a real node.

    .venv/bin/python benchmarks/bench_kubelet_prepare.py [--pods 30] [--batch 5] [--simulate 1xA100-80GB]

Starts the local control plane, one real node (kubelet + containerd + runc) and its agent
running as the DaemonSet would, one MPS SharingPolicy on the node's GPU, then runs ``--pods``
Pods in batches of ``--batch``, each with a claim of an MPS share (1Gi, 10% compute), each
printing its devices and exiting; every batch is deleted before the next. Then reads the
kubelet's own ``/metrics`` (through the apiserver's node proxy): the histograms
``dra_operations_duration_seconds`` (the whole PrepareResources / UnprepareResources step of
a Pod, by the kubelet's DRA manager) and ``dra_grpc_operations_duration_seconds`` (the gRPC
call to the plugin), and prints count, p50 and p99 of each (interpolated in the histogram's
buckets as Prometheus' ``histogram_quantile`` does), plus wall time per batch. Prints
figures; asserts nothing. Needs root (real nodes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.processes import TesseraProcesses
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim, show_devices_args

ROOT = Path(__file__).resolve().parents[1]
NODE = "bench-real"
_SAMPLE = re.compile(r'^(?P<name>[a-z_]+)_bucket\{(?P<labels>[^}]*)\} (?P<value>\S+)$')


def histograms(metrics: str, names: tuple[str, ...]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(metric, operation) -> sorted [(le, cumulative count)] from Prometheus text."""
    out: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if not match or match["name"] not in names:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("is_error") == "true":
            continue
        operation = labels.get("operation_name") or labels.get("method_name") or "?"
        out[(match["name"], operation)].append((float(labels["le"]), float(match["value"])))
    return {key: sorted(values) for key, values in out.items()}


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """``histogram_quantile``: linear interpolation inside the bucket that holds rank q*total."""
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    previous_le, previous_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return previous_le
            return previous_le + (le - previous_le) * (rank - previous_count) / max(count - previous_count, 1e-9)
        previous_le, previous_count = le, count
    return previous_le


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--simulate", default="1xA100-80GB")
    args = parser.parse_args()
    if why := real_nodes_possible():
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        processes = TesseraProcesses(cluster, Path(tempfile.mkdtemp(prefix="bench-kubelet-")))
        started = time.monotonic()
        node = RealNode.start(cluster, NODE)
        print(f"real node Ready in {time.monotonic() - started:.1f}s")
        try:
            processes.operator()
            processes.agent_on(node, args.simulate)
            cluster.apply_objects([{
                "apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "bench-mps"},
                "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE}}, "strategy": "MPS",
                         "mps": {"memory": {"default": "1Gi", "min": "1Gi", "step": "1Gi"},
                                 "compute": {"default": 10}}},
            }])
            cluster.kubectl("create", "namespace", "bench")
            template = claim_template("share", "bench", "shared-gpu.tessera.dev", capacity={"memory": "1Gi"})
            cluster.apply_objects([template])
            done = 0
            while done < args.pods:
                names = [f"p-{i}" for i in range(done, min(done + args.batch, args.pods))]
                batch_started = time.monotonic()
                cluster.apply_objects([pod_with_claim(n, "bench", "share", on_node(NODE), BUSYBOX_IMAGE,
                                                      show_devices_args(0), restart_policy="Never") for n in names])
                while True:
                    pods = cluster.get_json("pods", "-n", "bench")["items"]
                    phases = [p.get("status", {}).get("phase") for p in pods]
                    if phases.count("Succeeded") == len(names):
                        break
                    if "Failed" in phases or time.monotonic() - batch_started > 300:
                        print(json.dumps(cluster.get_json("pods", "-n", "bench")["items"][0].get("status"))[:2000])
                        return 1
                    time.sleep(0.2)
                print(f"batch of {len(names)} Pods: created -> Succeeded in {time.monotonic() - batch_started:.1f}s")
                cluster.kubectl("delete", "pods", "--all", "-n", "bench", "--wait=true", "--timeout=120s")
                done += len(names)
            metrics = node.kubelet_metrics()
            found = histograms(metrics, ("dra_operations_duration_seconds", "dra_grpc_operations_duration_seconds"))
            if not found:
                print("the kubelet exported no DRA histograms; its metrics mention:",
                      sorted(set(re.findall(r"^(dra_\w+)", metrics, re.M))))
            for (name, operation), buckets in sorted(found.items()):
                print(f"{name}{{{operation}}}: count {buckets[-1][1]:.0f}  p50 {quantile(0.5, buckets) * 1000:.1f} ms"
                      f"  p99 {quantile(0.99, buckets) * 1000:.1f} ms")
        finally:
            processes.stop_all()
            node.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
