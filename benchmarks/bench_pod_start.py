"""Benchmark: how long a Pod with a Tessera device takes to start, against the same Pod without one.

    .venv/bin/python benchmarks/bench_pod_start.py [--pods 30] [--simulate 4xH100-80GB]

Starts the local control plane, one real node (kubelet + containerd + runc) and its agent as
the DaemonSet would run it, with four simulated GPUs cut four ways by four SharingPolicies:
GPU 0 whole (Exclusive), GPU 1 in MIG instances (all-1g), GPU 2 in MPS shares, GPU 3 in
time-sliced shares. Then creates ``--pods`` Pods one after another, each with a claim on one
of those kinds in turn, each followed by the same Pod without a claim on the same node; each
Pod is deleted (and its claim gone) before the next is made, so no Pod waits for a device.

Time to start, per Pod: from its creation to its ``Ready`` condition turning True, both as
a watch of the namespace delivers them (one ``kubectl get -w`` stream, read as events come:
no polling). The Pods' own timestamps (``creationTimestamp``, the Ready condition's
``lastTransitionTime``) are whole seconds in the API (metav1.Time), too coarse for sub-second
starts; they are printed on a line of their own as a cross-check. Then the kubelet's own
``dra_operations_duration_seconds`` (PrepareResources, the growth Pods with a claim caused:
the kubelet records one for a Pod without claims too) from its ``/metrics`` through the
apiserver's node proxy, its gRPC histogram, and the agent's ``tessera_agent_plugin_step_seconds``
per step with its ``tessera_agent_plugin_claim_reads`` (which copy of each claim a prepare was
built from: the agent's watch, confirmed by a read alongside, or the read alone).

The kubelet's histograms start at 100 ms (buckets ``ExponentialBucketsRange(0.1, 40, 15)``), so
their p50 and p99 of calls faster than that are only "somewhere under 100 ms". The kubelet runs
at ``--v=4`` (``--kubelet-flag``), where it logs the start and end of each NodePrepareResources
call in microseconds; the benchmark reads those (``tessera.localcluster.kubeletlog``) and prints
the kubelet's own per-call times beside the histogram's line.

Prints, so that a script can compare runs:
``pod start with claim p50 <s> s p99 <s> s; without p50 <s> s p99 <s> s; ratio p50 <r>``
``kubelet prepare p50 <ms> ms p99 <ms> ms`` (from the histogram) and
``kubelet prepare from log p50 <ms> ms p99 <ms> ms (n <count>)``. Asserts nothing. Needs root
(real nodes).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_kubelet_prepare import histograms, quantile

from tessera import DRIVER_NAME
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.kubeletlog import dra_calls
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.processes import TesseraProcesses
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim

ROOT = Path(__file__).resolve().parents[1]
NODE = "bench-start"
NAMESPACE = "bench"
# A container that is Ready at once and leaves at once when asked.
ARGS = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
KINDS = ("whole", "mig", "mps", "timesliced")


def index_is(i: int) -> str:
    return f'device.attributes["{DRIVER_NAME}"].index == {i}'


def policies() -> list[dict[str, Any]]:
    selector = {"matchLabels": {"kubernetes.io/hostname": NODE}}
    specs = [
        {"strategy": "Exclusive"},
        {"strategy": "MIG", "mig": {"preset": "all-1g"}},
        {"strategy": "MPS", "mps": {"memory": {"default": "1Gi", "min": "1Gi", "step": "1Gi"},
                                    "compute": {"default": 10}}},
        {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}},
    ]
    return [{
        "apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": f"bench-{kind}"},
        "spec": {"nodeSelector": selector, "gpuSelector": {"cel": index_is(i)}, **spec},
    } for i, (kind, spec) in enumerate(zip(KINDS, specs, strict=True))]


def templates() -> list[dict[str, Any]]:
    return [
        claim_template("whole", NAMESPACE, "whole-gpu.tessera.dev", cel=index_is(0)),
        claim_template("mig", NAMESPACE, "mig.tessera.dev", cel=index_is(1)),
        claim_template("mps", NAMESPACE, "shared-gpu.tessera.dev", cel=index_is(2)),
        claim_template("timesliced", NAMESPACE, "shared-gpu.tessera.dev", cel=index_is(3)),
    ]


class PodWatch:
    """One ``kubectl get pods -w`` stream: when each Pod was first seen and first seen Ready,
    on this process's monotonic clock, as the events arrive."""

    FORMAT = ('jsonpath={.metadata.name} {.status.conditions[?(@.type=="Ready")].status} '
              '{.metadata.creationTimestamp} {.status.conditions[?(@.type=="Ready")].lastTransitionTime}{"\\n"}')

    def __init__(self, kubectl: list[str]) -> None:
        self.created: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.stamps: dict[str, tuple[str, str]] = {}  # name -> (creationTimestamp, Ready lastTransitionTime)
        self._changed = threading.Condition()
        self._process = subprocess.Popen(  # argv is ours
            [*kubectl, "get", "pods", "-n", NAMESPACE, "-w", "-o", self.FORMAT],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            now = time.monotonic()
            parts = line.split()
            if not parts:
                continue
            with self._changed:
                name = parts[0]
                self.created.setdefault(name, now)
                if len(parts) >= 4 and parts[1] == "True" and name not in self.ready:
                    self.ready[name] = now
                    self.stamps[name] = (parts[2], parts[3])
                self._changed.notify_all()

    def wait_ready(self, name: str, timeout: float) -> float:
        """Seconds from the Pod's first event (its creation) to its Ready event."""
        with self._changed:
            if not self._changed.wait_for(lambda: name in self.ready, timeout):
                raise TimeoutError(f"Pod {name} not Ready within {timeout:.0f} s")
            return self.ready[name] - self.created[name]

    def stamped_seconds(self, name: str) -> float:
        created, ready = (datetime.fromisoformat(s.replace("Z", "+00:00")) for s in self.stamps[name])
        return (ready - created).total_seconds()

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(10)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile, linearly interpolated between the nearest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def agent_steps(metrics_port: int) -> list[str]:
    """The agent's per-step and per-call histograms as lines ``operation step: count, p50, p99``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    buckets: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for line in text.splitlines():
        if not line.startswith(("tessera_agent_plugin_step_seconds_bucket{",
                                "tessera_agent_claim_seconds_bucket{")):
            continue
        labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
        if labels.get("result", '"ok"') != '"ok"':
            continue
        key = (labels["operation"].strip('"'), labels.get("step", '"(whole call)"').strip('"'))
        le = labels["le"].strip('"')
        buckets.setdefault(key, []).append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    return [f"  agent {operation:9} {step:13} count {b[-1][1]:4.0f}  p50 {quantile(0.5, sorted(b)) * 1000:7.1f} ms"
            f"  p99 {quantile(0.99, sorted(b)) * 1000:7.1f} ms" for (operation, step), b in sorted(buckets.items())]


def claim_reads(metrics_port: int) -> str:
    """The agent's ``tessera_agent_plugin_claim_reads_total`` by source, as ``source count, ...``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = [(line[line.index('source="') + 8:line.index('"}')], float(line.split()[-1]))
             for line in text.splitlines() if line.startswith("tessera_agent_plugin_claim_reads_total{")]
    return ", ".join(f"{source} {count:.0f}" for source, count in sorted(found)) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=30, help="Pods with a claim (as many again without)")
    parser.add_argument("--simulate", default="4xH100-80GB")
    parser.add_argument("--kubelet-flag", action="append", default=None,
                        help="extra kubelet flag (repeatable; default --v=4, which logs each DRA call's start and end)")
    parser.add_argument("--kubelet-log-copy", type=Path, default=None,
                        help="copy the kubelet's log here at the end (the cluster's folder is removed)")
    args = parser.parse_args()
    if why := real_nodes_possible():
        print(f"cannot run: {why}", file=sys.stderr)
        return 1
    with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        processes = TesseraProcesses(cluster, Path(tempfile.mkdtemp(prefix="bench-pod-start-")))
        kubelet_flags = args.kubelet_flag if args.kubelet_flag is not None else ["--v=4"]
        node = RealNode.start(cluster, NODE, kubelet_flags=kubelet_flags)
        watch: PodWatch | None = None
        try:
            processes.operator()
            agent = processes.agent_on(node, args.simulate)
            cluster.apply_objects(policies())
            cluster.kubectl("create", "namespace", NAMESPACE)
            cluster.apply_objects(templates())
            wait_published(cluster)
            watch = PodWatch([str(cluster.binaries.kubectl), f"--kubeconfig={cluster.kubeconfig}"])
            kubelet = KubeletPrepare(node)
            with_claim: dict[str, list[float]] = {kind: [] for kind in KINDS}
            without: list[float] = []
            stamped_with: list[float] = []
            stamped_without: list[float] = []
            for i in range(args.pods):
                kind = KINDS[i % len(KINDS)]
                claimed = pod_with_claim(f"c-{i}", NAMESPACE, kind, on_node(NODE), BUSYBOX_IMAGE, ARGS)
                plain = pod_with_claim(f"p-{i}", NAMESPACE, kind, on_node(NODE), BUSYBOX_IMAGE, ARGS)
                del plain["spec"]["resourceClaims"], plain["spec"]["containers"][0]["resources"]
                runs = ((claimed, with_claim[kind], stamped_with), (plain, without, stamped_without))
                for pod, into, stamped in runs:
                    name = pod["metadata"]["name"]
                    cluster.apply_objects([pod])
                    into.append(watch.wait_ready(name, 120))
                    stamped.append(watch.stamped_seconds(name))
                    kubelet.count_since_last(claimed=pod is claimed)
                    cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s")
                    wait_claims_gone(cluster)
            claimed_all = [s for values in with_claim.values() for s in values]
            p50_with, p50_without = percentile(claimed_all, 0.5), percentile(without, 0.5)
            for kind, values in with_claim.items():
                print(f"  {kind:10} with claim: n {len(values)}  p50 {percentile(values, 0.5):.3f} s"
                      f"  max {max(values):.3f} s")
            print(f"  agent claim reads: {claim_reads(agent.metrics_port)}")
            print(f"  condition timestamps (whole seconds): with claim p50 {percentile(stamped_with, 0.5):.0f} s"
                  f" p99 {percentile(stamped_with, 0.99):.0f} s; without p50 {percentile(stamped_without, 0.5):.0f} s"
                  f" p99 {percentile(stamped_without, 0.99):.0f} s")
            print(*agent_steps(agent.metrics_port), sep="\n")
            print(f"pod start with claim p50 {p50_with:.3f} s p99 {percentile(claimed_all, 0.99):.3f} s; "
                  f"without p50 {p50_without:.3f} s p99 {percentile(without, 0.99):.3f} s; "
                  f"ratio p50 {p50_with / p50_without:.2f}")
            found = histograms(node.kubelet_metrics(),
                               ("dra_operations_duration_seconds", "dra_grpc_operations_duration_seconds"))
            for (name, operation), buckets in sorted(found.items()):
                print(f"  kubelet {name}{{{operation}}}: count {buckets[-1][1]:.0f}"
                      f"  p50 {quantile(0.5, buckets) * 1000:.1f} ms  p99 {quantile(0.99, buckets) * 1000:.1f} ms")
            prepare = kubelet.claimed
            if not prepare or prepare[-1][1] == 0:
                print("kubelet prepare: the kubelet recorded no PrepareResources", file=sys.stderr)
                return 1
            print(f"kubelet prepare p50 {quantile(0.5, prepare) * 1000:.1f} ms "
                  f"p99 {quantile(0.99, prepare) * 1000:.1f} ms")
            with node.kubelet_log.open(errors="replace") as log:
                logged = [call.seconds for call in dra_calls(log, DRIVER_NAME)]
            if logged:
                print(f"kubelet prepare from log p50 {percentile(logged, 0.5) * 1000:.1f} ms "
                      f"p99 {percentile(logged, 0.99) * 1000:.1f} ms (n {len(logged)})")
            else:
                print("kubelet prepare from log: no NodePrepareResources call logged (the kubelet logs them "
                      "at --v=4)", file=sys.stderr)
        finally:
            if watch is not None:
                watch.stop()
            processes.stop_all()
            if args.kubelet_log_copy is not None:
                shutil.copyfile(node.kubelet_log, args.kubelet_log_copy)
            node.stop()
    return 0


class KubeletPrepare:
    """The kubelet's ``dra_operations_duration_seconds{PrepareResources}``, counted for Pods with
    a claim only: the kubelet records a PrepareResources for every Pod (one without claims in
    next to no time), so the histogram is read after each Pod and only the growth a Pod with a
    claim caused is kept."""

    def __init__(self, node: RealNode) -> None:
        self._node = node
        self._last = self._read()
        self.claimed: list[tuple[float, float]] = [(le, 0.0) for le, _ in self._last]

    def _read(self) -> list[tuple[float, float]]:
        found = histograms(self._node.kubelet_metrics(), ("dra_operations_duration_seconds",))
        return found.get(("dra_operations_duration_seconds", "PrepareResources"), [])

    def count_since_last(self, claimed: bool) -> None:
        now = self._read()
        if claimed:
            last = dict(self._last)
            mine = dict(self.claimed)
            self.claimed = [(le, mine.get(le, 0.0) + count - last.get(le, 0.0)) for le, count in now]
        self._last = now


def wait_published(cluster: LocalCluster, timeout: float = 180) -> None:
    """Until the node publishes a device on each of its four GPUs (setup, not measured)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        slices = cluster.get_json("resourceslices")["items"]
        names = {d["name"] for s in slices if s["spec"].get("nodeName") == NODE
                 for d in s["spec"].get("devices", [])}
        if {"gpu-0", "gpu-2", "gpu-3"} <= names and any(n.startswith("gpu-1-mig-1g") for n in names):
            return
        time.sleep(0.5)
    raise TimeoutError("the node's four GPUs were not published in time")


def wait_claims_gone(cluster: LocalCluster, timeout: float = 120) -> None:
    """Until the last Pod's claim is gone, so the next Pod of its kind finds the device free."""
    deadline = time.monotonic() + timeout
    while cluster.get_json("resourceclaims", "-n", NAMESPACE)["items"]:
        if time.monotonic() > deadline:
            raise TimeoutError("claims left behind")
        time.sleep(0.2)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
