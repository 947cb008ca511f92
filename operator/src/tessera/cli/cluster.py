"""``tessera cluster``: build (first time) and start the local control plane, print how to
reach it, and keep it running until Ctrl-C (or stop at once with ``--exit``)."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from tessera.localcluster import LocalCluster, LocalClusterError, ensure_binaries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exit", action="store_true", help="stop the cluster again once it is ready")


def run(args: argparse.Namespace) -> int:
    try:
        binaries = ensure_binaries()
        started = time.monotonic()
        with LocalCluster.start(binaries) as cluster:
            print(f"Kubernetes {binaries.kubernetes_version} control plane ready in "
                  f"{time.monotonic() - started:.1f}s at {cluster.server}")
            print(f"  export KUBECONFIG={cluster.kubeconfig}")
            print(f"  {binaries.kubectl} get --raw /version")
            if args.exit:
                return 0
            print("Press Ctrl-C to stop it.")
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except LocalClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
