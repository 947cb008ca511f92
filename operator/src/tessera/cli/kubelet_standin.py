"""A stand-in for the kubelet's side of DRA, for the demo on a control plane without kubelets:
register with a node agent's plugin the way the kubelet's plugin watcher does, then ask it to
prepare the ResourceClaims of the Pods bound to that node. Not for: production (the kubelet
does this) or tests (they speak gRPC themselves, to check every answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from tessera import DRIVER_NAME
from tessera.agent.plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Prepared:
    claim: ClaimRef
    cdi_devices: tuple[str, ...]
    error: str = ""


async def register(registry_dir: Path) -> str:
    """GetInfo + NotifyRegistrationStatus on the plugin's registration socket; the DRA endpoint."""
    socket = registry_dir / f"{DRIVER_NAME}-reg.sock"
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]  # generated
        info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=10)
        if info.type != "DRAPlugin" or "v1.DRAPlugin" not in info.supported_versions:
            raise RuntimeError(f"{socket} is not a DRA v1 plugin: {info}")
        await stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=10
        )
    return str(info.endpoint)


async def prepare(registry_dir: Path, claims: list[ClaimRef]) -> list[Prepared]:
    """NodePrepareResources for ``claims`` on the plugin registered in ``registry_dir``."""
    if not claims:
        return []
    endpoint = await register(registry_dir)
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]
    )
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]  # generated code
        response = await stub.NodePrepareResources(request, timeout=60)
    out = []
    for claim in claims:
        answer = response.claims[claim.uid]
        ids = tuple(i for d in answer.devices for i in d.cdi_device_ids)
        out.append(Prepared(claim, ids, answer.error))
    return out
