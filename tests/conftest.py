"""Shared fixtures: the real local control plane (built on first use, one per test session)
and a fresh namespace per test that needs one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for


@pytest.fixture(scope="session", autouse=True)
def no_mps_daemon_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """MPS daemons outlive their agent by design; the ones this session's tests started (their
    pipe folders lie under its temporary folder) end with the session."""
    yield
    marker = f"CUDA_MPS_PIPE_DIRECTORY={tmp_path_factory.getbasetemp()}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(entry.startswith(marker) for entry in environ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


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
