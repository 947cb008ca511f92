"""``tessera demo``: Tessera's main job on an embedded default.

Builds (first time) and starts the local control plane, installs the CRDs and DeviceClasses,
runs the operator and three simulated GPU nodes (H100, A100, H200), applies sample
SharingPolicies and workloads, waits until the scheduler has placed them, and prints per node
and GPU: the layout, the published devices, and which claims got what. One policy is Adaptive:
a Pod asks for a 3g slice nothing publishes, waits, and the operator recuts that policy's idle
GPU for it (the demo prints the AdaptiveRecut Event and the GPU's adaptive layout and reason). Where the machine
allows real nodes (root, runc can run; ``tessera.localcluster.nodes``) the three nodes are
real: a kubelet and containerd each, the agents run as their DaemonSet would, the Pods really
run, and the picture ends with what each container printed (its device variables and
``/dev/nvidia*``, read with ``kubectl logs``). Elsewhere, or with ``--no-real-nodes``, it says
why in one line and plays the kubelet's part itself: it prepares the claims through each
agent's plugin and shows the CDI devices a runtime would get. It keeps running (with kubectl
instructions) until Ctrl-C, or stops at once with ``--exit``. With ``--kubeconfig`` it targets
an existing cluster instead, running simulated agents for nodes that already exist there
(``--node NAME=SPEC``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tessera import DRIVER_NAME
from tessera.cli.demo_nics import DemoNic, why_no_nic
from tessera.cli.kubelet_standin import ClaimRef, prepare
from tessera.dra.deviceclasses import device_classes
from tessera.localcluster import LocalCluster, LocalClusterError, ensure_binaries
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS, ExistingCluster, kubectl_for
from tessera.localcluster.fabric import FabricError
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.nodebuild import NodeBinaries, ensure_node_binaries
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.processes import TesseraProcesses
from tessera.localcluster.workloads import claim_template, pod_with_claim, show_devices_args
from tessera.models.allocation import allocation_results
from tessera.models.attributes import COMPUTE_CAPACITY, MEMORY_CAPACITY
from tessera.models.crd import crds
from tessera.models.quantity import format_bytes, parse_quantity

NAMESPACE = "tessera-demo"


@dataclass(frozen=True)
class DemoNode:
    name: str
    simulate: str
    labels: dict[str, str]


NODES = (
    DemoNode("demo-h100", "3xH100-80GB", {"pool": "inference"}),
    DemoNode("demo-a100", "1xA100-80GB", {"pool": "notebooks"}),
    DemoNode("demo-h200", "1xH200-141GB", {"pool": "training"}),
)

POLICIES = """
# GPU 0 of every inference node: MIG instances, each shared again by MPS.
apiVersion: tessera.dev/v1alpha1
kind: SharingPolicy
metadata: {name: inference-mig-mps}
spec:
  priority: 100
  nodeSelector: {matchLabels: {pool: inference}}
  gpuSelector: {cel: 'device.attributes["gpu.tessera.dev"].index == 0'}
  strategy: MIG
  mig:
    profiles: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    sharing: {strategy: MPS}
  mps:
    memory: {default: 4Gi, min: 1Gi, step: 1Gi}
    compute: {default: 25, values: [10, 25, 50, 100]}
---
# The other inference GPUs stay whole.
apiVersion: tessera.dev/v1alpha1
kind: SharingPolicy
metadata: {name: inference-whole}
spec:
  priority: 50
  nodeSelector: {matchLabels: {pool: inference}}
  strategy: Exclusive
---
# GPU 2 of every inference node follows demand: whole while nobody asks for less; recut to two
# 3g halves when a Pod waits for a 3g slice that nothing published can give it.
apiVersion: tessera.dev/v1alpha1
kind: SharingPolicy
metadata: {name: inference-adaptive}
spec:
  priority: 75
  nodeSelector: {matchLabels: {pool: inference}}
  gpuSelector: {cel: 'device.attributes["gpu.tessera.dev"].index == 2'}
  strategy: Adaptive
  adaptive:
    layouts:
      - name: whole
      - name: halves
        strategy: MIG
        mig: {profiles: {"3g.40gb": 2}}
    idle: whole
    cooldown: 10m
    maxRecuts: 1
    pendingAfter: 2s
---
# Notebook GPUs are shared by MPS: 10Gi and 10% of the SMs per notebook by default.
apiVersion: tessera.dev/v1alpha1
kind: SharingPolicy
metadata: {name: notebooks-mps}
spec:
  nodeSelector: {matchLabels: {pool: notebooks}}
  strategy: MPS
  mps:
    memory: {default: 10Gi, min: 1Gi, step: 1Gi}
    compute: {default: 10}
---
# Training GPUs: MIG instances made when a claim needs one.
apiVersion: tessera.dev/v1alpha1
kind: SharingPolicy
metadata: {name: training-dynamic-mig}
spec:
  nodeSelector: {matchLabels: {pool: training}}
  strategy: DynamicMIG
"""


def _template(name: str, device_class: str, cel: str | None = None, capacity: dict[str, str] | None = None) -> Any:
    return claim_template(name, NAMESPACE, device_class, cel, capacity)


def _pod(name: str, template: str, pool: str, image: str, args: list[str], runnable: bool = False) -> Any:
    labels = {"app": name.rstrip("-0123456789")}
    if runnable:  # real nodes: a local image that prints what it got, then keeps running
        image, args = BUSYBOX_IMAGE, show_devices_args(RUN_SECONDS)
    return pod_with_claim(name, NAMESPACE, template, {"pool": pool}, image, args, labels)


RUN_SECONDS = 86400


def workloads(runnable: bool = False) -> list[Any]:
    # has() first: reading an attribute a device lacks is a CEL error, and the scheduler gives
    # up on the claim instead of skipping the device.
    attrs = 'device.attributes["gpu.tessera.dev"]'
    profile_is = f"has({attrs}.migProfile) && {attrs}.migProfile == "
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        _template(
            "mig-3g-20gi", "shared-gpu.tessera.dev", profile_is + '"3g.40gb"', {"memory": "20Gi", "compute": "50"}
        ),
        _template("whole-gpu", "whole-gpu.tessera.dev"),
        _template("notebook-10gi", "shared-gpu.tessera.dev", capacity={"memory": "10Gi"}),
        _template("mig-3g-71gb", "mig.tessera.dev", profile_is + '"3g.71gb"'),
        _template("mig-3g-40gb", "mig.tessera.dev", profile_is + '"3g.40gb"'),
        _pod("vllm-0", "mig-3g-20gi", "inference", "vllm/vllm-openai:latest", ["--model", "Qwen/Qwen2.5-7B-Instruct"],
             runnable),
        _pod("llama-70b-0", "whole-gpu", "inference", "vllm/vllm-openai:latest",
             ["--model", "meta-llama/Llama-3.1-70B"], runnable),
        *(_pod(f"notebook-{i}", "notebook-10gi", "notebooks", "jupyter/pytorch-notebook:latest", [], runnable)
          for i in range(3)),
        # No published device is a plain 3g.40gb instance: this Pod waits until the adaptive
        # policy recuts its idle GPU for it.
        _pod("slice-0", "mig-3g-40gb", "inference", "nvcr.io/nvidia/pytorch:25.01-py3", ["python", "eval.py"],
             runnable),
        _pod("trainer-0", "mig-3g-71gb", "training", "nvcr.io/nvidia/pytorch:25.01-py3", ["python", "train.py"],
             runnable),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exit", action="store_true", help="print the picture and stop (default: keep running)")
    parser.add_argument("--kubeconfig", help="use this existing cluster instead of starting a local one")
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="with --kubeconfig: run a simulated agent for this existing node, e.g. gpu-1=2xH100-80GB",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the workloads to be placed")
    parser.add_argument(
        "--no-real-nodes",
        action="store_true",
        help="never start real nodes (kubelet + containerd): play the kubelet's part instead",
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (LocalClusterError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _say(text: str) -> None:
    print(text, flush=True)


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="tessera-demo-"))
    cluster: LocalCluster | None = None
    real_nodes: list[RealNode] = []
    node_binaries: NodeBinaries | None = None
    target: LocalCluster | ExistingCluster
    why_not = "" if args.kubeconfig else ("--no-real-nodes" if args.no_real_nodes else real_nodes_possible() or "")
    if args.kubeconfig:
        nodes = [DemoNode(n.partition("=")[0], n.partition("=")[2], {}) for n in args.node]
        if not nodes or any(not n.simulate for n in nodes):
            raise LocalClusterError(
                "with --kubeconfig, name the nodes to simulate: --node NAME=SPEC (e.g. 2xH100-80GB)"
            )
        target = kubectl_for(Path(args.kubeconfig), ensure_binaries())
    else:
        _say("Starting a local Kubernetes control plane (the first run builds it: a few minutes)...")
        control_plane = ensure_binaries()
        if not why_not:
            try:
                node_binaries = ensure_node_binaries()  # the first run builds the kubelet and containerd
            except LocalClusterError as error:
                why_not = f"the kubelet or containerd could not be built: {str(error).splitlines()[0]}"
        cluster = LocalCluster.start(control_plane, controllers=CONTROLLERS + WORKLOAD_CONTROLLERS)
        target = cluster
        nodes = list(NODES)
        if why_not:
            _say(f"No real nodes ({why_not}): the demo plays the kubelet's part, no container starts.")
            for node in nodes:
                cluster.add_node(node.name, labels=node.labels)
    processes = TesseraProcesses(target, folder)
    real = cluster is not None and not why_not
    nic: DemoNic | None = None
    why_no_shared_nic = why_no_nic(real)
    try:
        if why_no_shared_nic is None:
            try:
                nic = DemoNic.start()
            except FabricError as error:
                why_no_shared_nic = f"its fabric could not be made: {error}"
        if real and cluster is not None:
            _say("Starting 3 real nodes: a kubelet, containerd and runc each...")
            for node in nodes:
                real_nodes.append(RealNode.start(cluster, node.name, labels=node.labels, binaries=node_binaries))
        _say("Installing the CRDs and DeviceClasses...")
        target.apply_objects([*crds().values(), *device_classes()])
        target.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/sharingpolicies.tessera.dev",
            "crd/nodelayouts.tessera.dev",
            "--timeout=60s",
        )
        _say(f"Starting the operator and {len(nodes)} node agents (simulated GPUs)...")
        processes.operator()
        for index, node in enumerate(nodes):
            if real:
                processes.agent_on(real_nodes[index], node.simulate, nic.agent_flags(node.name) if nic else None)
            else:
                processes.agent(node.name, node.simulate)
        _say("Applying SharingPolicies and workloads...")
        target.apply_objects(list(yaml.safe_load_all(POLICIES)))
        pods = [w for w in workloads(real) if w["kind"] == "Pod"]
        target.apply_objects([w for w in workloads(real) if w["kind"] != "Pod"])
        if nic is not None:  # its Pods start beside the GPU ones
            target.apply_objects(nic.objects(NAMESPACE))
        _wait_ready(target, [p["metadata"]["name"] for p in yaml.safe_load_all(POLICIES)], args.timeout, processes)
        target.apply_objects(pods)
        _wait_placed(target, [p["metadata"]["name"] for p in pods], args.timeout)
        for line in recut_events(target):
            _say(f"Recut for a waiting Pod: {line}")
        prepared: list[str] = []
        if real:
            _say("Waiting for the kubelets to prepare the claims and run the Pods...")
            _wait_running(target, [p["metadata"]["name"] for p in pods], args.timeout)
        else:
            _say("Preparing the claims with each node's kubelet plugin, as a kubelet would...")
            prepared = _prepare_like_the_kubelet(target, processes, [n.name for n in nodes])
        _wait_agents_caught_up(target, [n.name for n in nodes], args.timeout)
        _say("")
        _say(picture(target, [n.name for n in nodes]))
        if nic is not None:
            _say("Measuring the shared NIC: both Pods send flat out for a few seconds...")
            for line in nic.show(target, NAMESPACE, args.timeout):
                _say(line)
        else:
            _say(f"No shared NIC in this run: {why_no_shared_nic}")
        if real:
            _say("What each container printed (kubectl logs): its device variables and /dev/nvidia* nodes")
            for line in container_output(target, sorted(p["metadata"]["name"] for p in pods)):
                _say(f"  {line}")
        else:
            _say("CDI devices the kubelet plugins returned (what the container runtime would inject):")
            for line in prepared:
                _say(f"  {line}")
        _say(f"Ready in {time.monotonic() - started:.0f}s. Logs of the operator and agents: {folder}")
        if args.exit:
            return 0
        _say("\nThe cluster keeps running. In another shell:")
        _say(f"  export KUBECONFIG={target.kubeconfig}")
        _say(f"  alias kubectl={target.binaries.kubectl}")
        _say("  kubectl get sharingpolicies; kubectl get nodelayouts; kubectl get resourceslices")
        _say(f"  kubectl get resourceclaims -n {NAMESPACE} -o wide")
        _say("Press Ctrl-C to stop.")
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        if real_nodes:
            target.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False)
        processes.stop_all()
        for real_node in real_nodes:
            real_node.stop()
        if nic is not None:
            nic.stop()
        if cluster is not None:
            cluster.stop()


def _wait_ready(target: Any, policies: list[str], timeout: float, processes: TesseraProcesses) -> None:
    deadline = time.monotonic() + timeout
    while True:
        items = {p["metadata"]["name"]: p for p in target.get_json("sharingpolicies")["items"]}
        ready = [
            n
            for n in policies
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in items.get(n, {}).get("status", {}).get("conditions", [])
            )
        ]
        if len(ready) == len(policies):
            return
        dead = [p.name for p in processes.processes if not p.alive()]
        if dead:
            raise LocalClusterError(f"{', '.join(dead)} stopped; see the logs in {processes.folder}")
        if time.monotonic() > deadline:
            missing = sorted(set(policies) - set(ready))
            raise TimeoutError(f"policies not Ready after {timeout:.0f}s: {', '.join(missing)}")
        time.sleep(0.5)


def _wait_placed(target: Any, pods: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        items = {p["metadata"]["name"]: p for p in target.get_json("pods", "-n", NAMESPACE)["items"]}
        placed = [n for n in pods if items.get(n, {}).get("spec", {}).get("nodeName")]
        if len(placed) == len(pods):
            return
        if time.monotonic() > deadline:
            why = []
            for name in sorted(set(pods) - set(placed)):
                conditions = items.get(name, {}).get("status", {}).get("conditions", [])
                message = next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"), "")
                why.append(f"{name}: {message or 'not scheduled'}")
            raise TimeoutError(f"Pods not scheduled after {timeout:.0f}s:\n  " + "\n  ".join(why))
        time.sleep(0.5)


def recut_events(target: Any) -> list[str]:
    """The AdaptiveRecut Events on the demo's claims: which GPU was recut, for which claim."""
    events = target.get_json("events", "-n", NAMESPACE, "--field-selector", "reason=AdaptiveRecut")["items"]
    return sorted(f"{e['involvedObject']['name']}: {e.get('message', '')}" for e in events)


def _wait_running(target: Any, pods: list[str], timeout: float) -> None:
    """Until every Pod runs and has printed its devices (its last line is "ready")."""
    deadline = time.monotonic() + timeout
    while True:
        items = {p["metadata"]["name"]: p for p in target.get_json("pods", "-n", NAMESPACE)["items"]}
        running = [n for n in pods if items.get(n, {}).get("status", {}).get("phase") == "Running"]
        if len(running) == len(pods) and all(_printed(target, n).endswith("ready") for n in pods):
            return
        if time.monotonic() > deadline:
            why = [f"{n}: {json.dumps(items.get(n, {}).get('status', {}).get('containerStatuses', []))[:300]}"
                   for n in sorted(set(pods) - set(running))]
            raise TimeoutError(f"Pods not Running after {timeout:.0f}s:\n  " + "\n  ".join(why))
        time.sleep(0.5)


def _printed(target: Any, pod: str) -> str:
    proc = target.kubectl("logs", pod, "-n", NAMESPACE, check=False)
    return str(proc.stdout).strip() if proc.returncode == 0 else ""


def container_output(target: Any, pods: list[str]) -> list[str]:
    """Per Pod, one line of what its container printed: device variables and device nodes."""
    lines = []
    for pod in pods:
        env, devices = [], []
        for line in _printed(target, pod).splitlines():
            if line.startswith("device "):
                devices.append(line.removeprefix("device /dev/"))
            elif "=" in line:
                env.append(line)
        shown = [e for e in env if not e.startswith("CUDA_VISIBLE_DEVICES=")]  # the same as NVIDIA_VISIBLE_DEVICES
        lines.append(f"{pod:<12} " + "  ".join(shown))
        lines.append(f"{'':<12} /dev: {' '.join(devices)}")
    return lines


def _prepare_like_the_kubelet(target: Any, processes: TesseraProcesses, nodes: list[str]) -> list[str]:
    """For each node, prepare the claims of the demo Pods bound to it through its agent's plugin."""
    pods = target.get_json("pods", "-n", NAMESPACE)["items"]
    claims = {c["metadata"]["name"]: c for c in target.get_json("resourceclaims", "-n", NAMESPACE)["items"]}
    lines = []
    for node in nodes:
        refs: dict[str, ClaimRef] = {}
        for pod in pods:
            if pod["spec"].get("nodeName") != node:
                continue
            for status in pod.get("status", {}).get("resourceClaimStatuses", []):
                claim = claims.get(status.get("resourceClaimName", ""))
                if claim is not None:
                    meta = claim["metadata"]
                    refs[pod["metadata"]["name"]] = ClaimRef(NAMESPACE, meta["name"], meta["uid"])
        registry = processes.node_folder(node) / "plugins_registry"
        results = asyncio.run(prepare(registry, list(refs.values())))
        for pod_name, result in zip(refs, results, strict=True):
            answer = ", ".join(result.cdi_devices) if not result.error else f"error: {result.error}"
            lines.append(f"{pod_name:<12} {answer}")
    return sorted(lines)


def _wait_agents_caught_up(target: Any, nodes: list[str], timeout: float) -> None:
    """Until the agents report every DynamicMIG instance their plugins made at prepare time."""
    claims = target.get_json("resourceclaims", "-n", NAMESPACE)["items"]
    wanted = sum("-dyn-" in r.device for c in claims for r in allocation_results(c, DRIVER_NAME))
    deadline = time.monotonic() + timeout
    while True:
        layouts = [n for n in target.get_json("nodelayouts")["items"] if n["metadata"]["name"] in nodes]
        made = sum(
            bool(i.get("dynamic"))
            for n in layouts
            for g in n.get("status", {}).get("gpus", [])
            for i in g.get("migInstances", [])
        )
        if made >= wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the agents report {made} of {wanted} DynamicMIG instances after {timeout:.0f}s")
        time.sleep(0.3)


def _memory(device: dict[str, Any]) -> str:
    value = device.get("capacity", {}).get(MEMORY_CAPACITY, {}).get("value")
    if value is None:
        return ""
    gib = parse_quantity(str(value)) / 2**30
    return f"{gib:.1f}Gi"


def picture(target: Any, nodes: list[str]) -> str:
    """Per node and GPU: layout, published devices, and the claims each device serves."""
    layouts = {n["metadata"]["name"]: n for n in target.get_json("nodelayouts")["items"]}
    adaptive = {
        row["gpu"]: row
        for p in target.get_json("sharingpolicies")["items"]
        for row in (p.get("status") or {}).get("adaptive") or ()
    }
    slices = target.get_json("resourceslices")["items"]
    claims = target.get_json("resourceclaims", "-n", NAMESPACE)["items"]
    pods = {p["metadata"]["name"]: p for p in target.get_json("pods", "-n", NAMESPACE)["items"]}
    users: dict[tuple[str, str], list[str]] = {}
    for claim in claims:
        owner = next((r["name"] for r in claim["metadata"].get("ownerReferences", []) if r["kind"] == "Pod"), "?")
        for result in allocation_results(claim, DRIVER_NAME, include_admin_access=True):
            consumed = result.consumed_capacity
            extra = ", ".join(f"{k} {_quantity_text(k, v)}" for k, v in sorted(consumed.items()))
            users.setdefault(result.key, []).append(
                f"{owner}" + (f" ({extra})" if extra else "")
            )
    lines = []
    for node in nodes:
        layout = layouts.get(node, {})
        gpus = layout.get("status", {}).get("gpus", [])
        devices = {
            d["name"]: d
            for s in slices
            if s["spec"].get("pool", {}).get("name") == node
            for d in s["spec"].get("devices") or []
        }
        lines.append(f"node {node}")
        for gpu in gpus:
            policy = gpu.get("policy") or "(no policy)"
            lines.append(
                f"  GPU {gpu['index']}  {gpu['productName']}  {gpu['memoryMib'] / 1024:.0f}GiB"
                f"  strategy {gpu['strategy']}  policy {policy}"
            )
            chosen = adaptive.get(gpu.get("uuid", ""))
            if chosen is not None:
                lines.append(f"      adaptive layout: {chosen['layout']} ({chosen.get('reason') or 'no reason given'})")
            if gpu.get("migInstances"):
                cut = "  ".join(f"{i['profile']}@{i['start']}" for i in gpu["migInstances"])
                lines.append(f"      MIG instances: {cut}")
            mine = sorted(n for n in devices if n == f"gpu-{gpu['index']}" or n.startswith(f"gpu-{gpu['index']}-"))
            shown = [n for n in mine if "-dyn-" not in n or (node, n) in users]
            hidden = len(mine) - len(shown)
            for name in shown:
                device = devices[name]
                kind = device.get("attributes", {}).get("type", {}).get("string", "")
                shared = " shared" if device.get("allowMultipleAllocations") else ""
                who = users.get((node, name), [])
                lines.append(
                    f"      {name:<28} {kind}{shared:<8} {_memory(device):>8}  "
                    + (("<- " + "; ".join(who)) if who else "free")
                )
            if hidden:
                lines.append(f"      + {hidden} DynamicMIG placements published (made when a claim needs one)")
    placed = sorted(f"{n} on {p['spec'].get('nodeName', '?')}" for n, p in pods.items())
    lines.append("Pods: " + ", ".join(placed))
    return "\n".join(lines)


def _quantity_text(name: str, value: str) -> str:
    if name == MEMORY_CAPACITY:
        return format_bytes(parse_quantity(value))
    return f"{value}%" if name == COMPUTE_CAPACITY else value
