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
        processes.stop_all()
