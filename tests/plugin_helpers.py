"""Builders for the kubelet plugin's tests: simulated GPUs in every strategy the plugin
prepares, ResourceClaims as the API returns them, and a claim reader that serves them."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import DRIVER_NAME
from tessera.agent.backends.base import GpuInfo
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.plugin.claims import ClaimStatusWriter
from tessera.agent.plugin.prepare import ClaimPreparer, PreparerSettings
from tessera.agent.plugin.watched import ClaimCopies
from tessera.models.devices import dynamic_mig_device_name, gpu_device_name, mig_device_name

NODE = "gpu-node-1"
NAMESPACE = "team-a"
# GPU 0: static MIG (3g.40gb@0, 2g.20gb@4, 1g.10gb@6); GPU 1: MPS; GPU 2: DynamicMIG (MIG mode
# on, no instances); GPU 3: a whole GPU (Exclusive or time-sliced).
GPU_SPEC = "4xH100-80GB"
STATIC_MIG = (("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6))


def make_backend(state_file: Path | None = None, node: str = NODE) -> SimulatedBackend:
    backend = SimulatedBackend.from_spec(node, GPU_SPEC, state_file=state_file, mps_root="/run/tessera/mps")
    gpus = backend.inventory().gpus
    backend.set_mig_mode(gpus[0].uuid, True)
    for profile, start in STATIC_MIG:
        backend.create_instance(gpus[0].uuid, profile, start)
    backend.start_mps(gpus[1].uuid)
    backend.set_mig_mode(gpus[2].uuid, True)
    return backend


def gpu(backend: SimulatedBackend, index: int) -> GpuInfo:
    return backend.inventory().gpus[index]


def result(
    device: str,
    request: str = "gpu",
    *,
    pool: str = NODE,
    driver: str = DRIVER_NAME,
    share_id: str | None = None,
    consumed: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One allocation result as kube-scheduler writes it."""
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id is not None:
        out["shareID"] = share_id
    if consumed is not None:
        out["consumedCapacity"] = consumed
    return out


def claim(name: str, *results: dict[str, Any], uid: str | None = None, allocated: bool = True) -> dict[str, Any]:
    """A ResourceClaim as the API returns it."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": []}},
        "status": {},
    }
    if allocated:
        body["status"]["allocation"] = {"devices": {"results": list(results)}}
    return body


WHOLE = gpu_device_name(3)
MPS = gpu_device_name(1)
STATIC = mig_device_name(0, "3g.40gb", 0)


def dynamic(profile: str = "1g.10gb", start: int = 0) -> str:
    return dynamic_mig_device_name(2, profile, start)


@dataclass
class FakeClaimReader:
    """Serves claims from memory; counts reads; can make every read wait (to overlap them)."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0
    delay_s: float = 0.0

    def add(self, *bodies: dict[str, Any]) -> None:
        for body in bodies:
            meta = body["metadata"]
            self.claims[(meta["namespace"], meta["name"])] = body

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.claims.get((namespace, name))


@dataclass
class PluginDirs:
    root: Path

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def checkpoint(self) -> Path:
        return self.root / "plugin" / "checkpoint.json"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def registry(self) -> Path:
        return self.root / "reg"

    @property
    def plugin(self) -> Path:
        return self.root / "plugin"


def short_tmp_dir() -> Iterator[Path]:
    """A short folder under /tmp: unix socket paths must stay under 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="tp-", dir="/tmp") as tmp:
        yield Path(tmp)


def preparer(
    backend: SimulatedBackend, reader: FakeClaimReader, dirs: PluginDirs,
    status_writer: ClaimStatusWriter | None = None, view: ClaimCopies | None = None,
) -> ClaimPreparer:
    settings = PreparerSettings(
        driver=DRIVER_NAME, node=NODE, cdi_dir=dirs.cdi, checkpoint_path=dirs.checkpoint, proc_root=dirs.proc
    )
    return ClaimPreparer(backend, reader, settings, status_writer, view=view)
