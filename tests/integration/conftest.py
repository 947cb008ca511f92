"""Fixtures of the integration tests that run Tessera's own processes: the operator (one per
test module) beside the session's control plane, with the CRDs and DeviceClasses installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.processes import TesseraProcesses

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _nodes_go_with_their_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """Nodes a module adds to the session's cluster are deleted when it ends (their NodeLayouts
    and ResourceSlices go with them): a later module's scheduler must not find an earlier
    module's GPUs. Modules with a cluster of their own are left alone."""
    if not any("cluster" in item.fixturenames for item in request.session.items if item.module is request.module):
        yield
        return
    cluster: LocalCluster = request.getfixturevalue("cluster")
    before = _node_names(cluster)
    yield
    added = sorted(_node_names(cluster) - before)
    if added:
        cluster.kubectl("delete", "nodes", *added, "--ignore-not-found", "--timeout=60s", check=False, timeout=90)


def _node_names(cluster: LocalCluster) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.get_json("nodes")["items"]}


@pytest.fixture(scope="module")
def tessera(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TesseraProcesses]:
    # The install's namespace holds each agent's fence claim (tessera.agent.claimview).
    cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml", ROOT / "manifests" / "namespace.yaml")
    processes = TesseraProcesses(cluster, tmp_path_factory.mktemp("tessera"))
    processes.operator()
    try:
        yield processes
    finally:
        # Leave the session's cluster as this module found it: later modules list every policy
        # and let the scheduler pick any node. The operator lifts the finalizers, so it still runs.
        cluster.kubectl("delete", "sharingpolicies", "--all", "--timeout=60s", check=False, timeout=90)
        processes.stop_all()  # the module's nodes go after it (_nodes_go_with_their_module)
