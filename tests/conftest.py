"""Shared fixtures: the real local control plane (built on first use, one per test session)
and a fresh namespace per test that needs one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback."""
    with LocalCluster.start() as local:
        yield local


@pytest.fixture
async def namespace(cluster: LocalCluster) -> str:
    """A new namespace whose default ServiceAccount exists (Pods can be created in it)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)

    def has_default_account() -> bool:
        out = cluster.kubectl("get", "serviceaccount", "default", "-n", name, "-o", "json", check=False)
        return out.returncode == 0 and json.loads(out.stdout)["metadata"]["name"] == "default"

    await wait_for(has_default_account, timeout=30, message=f"the default ServiceAccount in {name}")
    return name
