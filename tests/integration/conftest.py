"""Fixtures of the integration tests that run Tessera's own processes: the operator (one per
test module) beside the session's control plane, with the CRDs and DeviceClasses installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.processes import TesseraProcesses

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tessera(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TesseraProcesses]:
    cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
    processes = TesseraProcesses(cluster, tmp_path_factory.mktemp("tessera"))
    processes.operator()
    try:
        yield processes
    finally:
        # Leave the session's cluster as this module found it: later modules list every policy
        # and let the scheduler pick any node. The operator lifts the finalizers, so it still runs.
        cluster.kubectl("delete", "sharingpolicies", "--all", "--timeout=60s", check=False, timeout=90)
        nodes = processes.agent_nodes()
        processes.stop_all()
        if nodes:  # their NodeLayouts and ResourceSlices go with them (owner references)
            cluster.kubectl("delete", "nodes", *nodes, "--ignore-not-found", "--timeout=60s", check=False, timeout=90)
