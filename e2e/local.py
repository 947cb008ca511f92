"""Tessera's install on real local nodes, without Docker or a registry (run by e2e/local.sh).

Builds the image from the Dockerfile with buildah (on a Debian-made python:3.11-slim), starts
the local control plane and one real node (kubelet + containerd + runc), imports the image,
``kubectl apply -f manifests/install.yaml``, switches the agents to simulated GPUs with the
patch ``e2e/local/simulated-agent.yaml``, applies the sample policies and the sample workloads
(``e2e/local/samples``: same claims, a local image), waits until they run, and prints the Pods
and what the workloads printed. Keeps running until Ctrl-C unless ``--exit``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tessera.localcluster import LocalCluster, LocalClusterError
from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS
from tessera.localcluster.nodes import RealNode, real_nodes_possible
from tessera.localcluster.ownimage import build_own_image, own_image_possible

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "tessera-samples"
SAMPLES = ("vllm-mig-3g", "vllm-shared-10gi")


def wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise LocalClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


def running(cluster: LocalCluster, namespace: str, names: tuple[str, ...] | None = None) -> bool:
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    if names is not None:
        pods = [p for p in pods if p["metadata"]["name"] in names]
        if len(pods) != len(names):
            return False
    return bool(pods) and all(
        p.get("status", {}).get("phase") == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
        for p in pods
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exit", action="store_true", help="stop once the samples run")
    args = parser.parse_args()
    if why := real_nodes_possible() or own_image_possible():
        print(f"e2e/local.sh cannot run here: {why}", file=sys.stderr)
        return 1
    image = build_own_image(ROOT)
    with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster:
        node = RealNode.start(cluster, "local-gpu-0", labels={"pool": "inference", "nvidia.com/gpu.present": "true"})
        try:
            print(f"== importing {image.name} into {node.name}")
            node.import_image(image)
            print("== kubectl apply -f manifests/install.yaml, agents patched to simulated GPUs")
            cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "install.yaml"))
            cluster.kubectl("-n", "tessera-system", "patch", "daemonset", "tessera-agent", "--patch-file",
                            str(ROOT / "e2e" / "local" / "simulated-agent.yaml"))
            wait("the operator and agent Pods", lambda: running(cluster, "tessera-system"), 300)
            print("== sample policies and workloads")
            cluster.kubectl("apply", "-f", str(ROOT / "manifests" / "samples" / "sharingpolicies.yaml"))
            cluster.kubectl("create", "namespace", NAMESPACE)
            cluster.kubectl("apply", "-n", NAMESPACE, "-k", str(ROOT / "e2e" / "local" / "samples"))
            wait("the sample workloads", lambda: running(cluster, NAMESPACE, SAMPLES), 300)
            print(cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout)
            print(cluster.kubectl("get", "sharingpolicies").stdout)
            for sample in SAMPLES:
                print(f"== kubectl logs {sample}")
                print(cluster.kubectl("logs", sample, "-n", NAMESPACE).stdout)
            if not args.exit:
                print(f"export KUBECONFIG={cluster.kubeconfig}; kubectl is {cluster.binaries.kubectl}")
                print("Press Ctrl-C to stop.")
                signal.sigwait({signal.SIGINT, signal.SIGTERM})
        finally:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
            node.stop()
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except LocalClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from error
