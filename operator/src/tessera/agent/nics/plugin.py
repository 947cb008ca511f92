"""The NIC family's DRA kubelet plugin: driver ``nic.tessera.dev``, its own sockets beside the GPU
plugin's (``<registry>/nic.tessera.dev-reg.sock``, ``<plugins>/nic.tessera.dev/dra.sock``).

NodePrepareResources reads each claim (and the node's NIC slice, for the policy's ceiling the
device publishes), takes its results of our driver on this node (the device
names the NIC, ``consumedCapacity.bandwidth`` the rate, ``shareID`` the share), has
``NicFamily`` make the shares (macvlan, classes, filters, checkpoint), and writes one CDI spec
per claim whose devices carry the ``createRuntime`` hook that attaches them to the Pod
(``tessera nic-attach``); the answer gives each device its CDI ID and share ID. Unprepare undoes
both. Every claim gets its own answer; a claim that cannot be prepared leaves nothing made.

Pure parts (``share_requests``, ``nic_cdi_spec``) take values and return values.
Not for: GPUs (``tessera.agent.plugin``) or the netlink work (``tessera.agent.nics.shaping``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import structlog

from tessera import RESOURCE_GROUP, RESOURCE_VERSION
from tessera.agent.nics.family import NicFamily, ShareRequest, attach_hook
from tessera.agent.plugin.claims import ClaimError, ClaimReader, ClaimRef
from tessera.agent.plugin.proto import dra_v1_pb2, pluginregistration_v1_pb2
from tessera.dra.nics import BANDWIDTH_CAPACITY, CEILING_ATTRIBUTE, NIC_DRIVER, nic_device_name
from tessera.kube.http import KubeClient, resource_path
from tessera.models.allocation import allocation_results
from tessera.models.nics import NicStatus
from tessera.models.quantity import parse_quantity

log = structlog.get_logger("tessera.agent.nics")

CDI_KIND = f"{NIC_DRIVER}/share"
CDI_VERSION = "0.6.0"
DRA_V1_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
REGISTRATION_SERVICE = "pluginregistration.Registration"


@dataclass(frozen=True, slots=True)
class AllocatedShare:
    """One result of our driver in a claim, and the share it asks for."""

    request: str
    device: str
    share: ShareRequest

    @property
    def cdi_name(self) -> str:
        return f"{self.device}-{self.share.share_id}"


def share_requests(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    node: str,
    nics: Sequence[NicStatus],
    ceilings: Mapping[str, int] | None = None,
) -> list[AllocatedShare]:
    """The NIC shares ``claim`` holds on ``node``, each with its device's ceiling (``ceilings``:
    device name -> bits per second); ClaimError says why there are none to make."""
    if claim.get("metadata", {}).get("uid") != ref.uid:
        raise ClaimError(f"ResourceClaim {ref} was deleted and created again; the Pod must be recreated")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated yet")
    results = allocation_results(claim, NIC_DRIVER, include_admin_access=True)  # the rules every family shares
    if not results:
        raise ClaimError(f"ResourceClaim {ref} has no device of driver {NIC_DRIVER}")
    by_device = {nic_device_name(n.interface): n for n in nics}
    shares = []
    for result in results:
        if result.pool != node:
            raise ClaimError(f"ResourceClaim {ref} holds a NIC of node {result.pool}, but this is node {node}")
        nic = by_device.get(result.device)
        if nic is None:
            raise ClaimError(f"ResourceClaim {ref}: no NIC {result.device} on node {node}")
        bandwidth = result.consumed_capacity.get(BANDWIDTH_CAPACITY)
        if bandwidth is None:
            raise ClaimError(f"ResourceClaim {ref}: the allocation of {result.device} books no bandwidth")
        share_id = result.share_id or result.request
        request = ShareRequest(
            share_id, nic.interface, parse_quantity(bandwidth), ceil_bps=(ceilings or {}).get(result.device)
        )
        shares.append(AllocatedShare(result.request.split("/", 1)[0], result.device, request))
    return shares


def device_ceilings(slices: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Device name -> the ceiling its slice publishes (``shareCeilingBps``), for our driver's slices."""
    out: dict[str, int] = {}
    for resource_slice in slices:
        spec = resource_slice.get("spec") or {}
        if spec.get("driver") != NIC_DRIVER:
            continue
        for device in spec.get("devices") or []:
            ceiling = (device.get("attributes") or {}).get(CEILING_ATTRIBUTE, {}).get("int")
            if isinstance(ceiling, int):
                out[str(device["name"])] = ceiling
    return out


class SliceReader(Protocol):
    """This node's ResourceSlices of our driver, as the API has them."""

    async def node_slices(self, node: str) -> list[dict[str, Any]]: ...


class KubeSliceReader:
    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def node_slices(self, node: str) -> list[dict[str, Any]]:
        path = resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")
        return await self._api.list(path, field_selector=f"spec.nodeName={node},spec.driver={NIC_DRIVER}")


def nic_cdi_spec(claim_uid: str, shares: Sequence[AllocatedShare], hook: Mapping[str, Any]) -> dict[str, Any]:
    """One CDI spec per claim: a device per share, each running the attach hook."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {"name": f"{claim_uid}-{s.cdi_name}", "containerEdits": {"hooks": [dict(hook)]}} for s in shares
        ],
    }


def cdi_spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{CDI_KIND.replace('/', '-')}-claim_{claim_uid}.json"


@dataclass(frozen=True, slots=True)
class NicPluginConfig:
    node_name: str
    registry_dir: Path
    plugin_dir: Path
    cdi_dir: Path
    hook_executable: str = "/usr/local/bin/tessera"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{NIC_DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "nic-checkpoint.json"


class NicKubeletPlugin:
    """Serves ``nic.tessera.dev`` to the kubelet."""

    def __init__(
        self,
        config: NicPluginConfig,
        family: NicFamily,
        reader: ClaimReader,
        nics: Callable[[], Sequence[NicStatus]],
        executor: Executor | None = None,
        slices: SliceReader | None = None,
    ) -> None:
        """``executor`` runs the blocking netlink work (default: asyncio's threads); tests give
        one whose threads live in the namespace that plays the host."""
        self._executor = executor
        self._slices = slices
        self.config = config
        self.family = family
        self.reader = reader
        self.nics = nics
        self._servers: list[Any] = []

    async def prepare(self, ref: ClaimRef) -> tuple[list[AllocatedShare], str]:
        """The claim's shares made and its CDI spec written, or the reason (nothing left made)."""
        try:
            claim = await self.reader.read_claim(ref.namespace, ref.name)
            if claim is None:
                raise ClaimError(f"ResourceClaim {ref} does not exist")
            ceilings = device_ceilings(await self._slices.node_slices(self.config.node_name)) if self._slices else {}
            shares = share_requests(claim, ref, self.config.node_name, self.nics(), ceilings)
            await self._blocking(self.family.prepare, ref.uid, [s.share for s in shares])
            hook = attach_hook(ref.uid, self.config.checkpoint, self.config.hook_executable)
            try:
                spec = nic_cdi_spec(ref.uid, shares, hook)
                await asyncio.to_thread(_write_json, cdi_spec_path(self.config.cdi_dir, ref.uid), spec)
            except OSError:
                await self._blocking(self.family.unprepare, ref.uid)
                raise
        except Exception as error:  # every claim gets an answer: the error is it
            log.warning("NIC claim not prepared", claim=str(ref), error=str(error))
            return [], str(error)
        return shares, ""

    async def unprepare(self, ref: ClaimRef) -> str:
        try:
            await self._blocking(self.family.unprepare, ref.uid)
            await asyncio.to_thread(cdi_spec_path(self.config.cdi_dir, ref.uid).unlink, missing_ok=True)
        except Exception as error:
            return str(error)
        return ""

    async def _blocking(self, work: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    # -- gRPC --

    async def start(self) -> None:
        await self._blocking(self.family.recover)
        self._servers = [
            await _serve(self.config.dra_socket, [self._dra_handler()]),
            await _serve(self.config.registration_socket, [self._registration_handler()]),
        ]
        log.info("NIC kubelet plugin serving", dra_socket=str(self.config.dra_socket))

    async def stop(self) -> None:
        for server, socket in zip(
            reversed(self._servers), (self.config.registration_socket, self.config.dra_socket), strict=False
        ):
            await server.stop(2)
            _make_way(socket)
        self._servers = []

    def _dra_handler(self) -> Any:
        pb = dra_v1_pb2

        async def prepare(request: Any, context: Any) -> Any:
            response = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                shares, error = await self.prepare(ClaimRef(claim.namespace, claim.name, claim.uid))
                entry = response.claims[claim.uid]
                if error:
                    entry.error = error
                for share in shares:
                    entry.devices.add(
                        request_names=[share.request],
                        pool_name=self.config.node_name,
                        device_name=share.device,
                        cdi_device_ids=[f"{CDI_KIND}={claim.uid}-{share.cdi_name}"],
                        share_id=share.share.share_id,
                    )
            return response

        async def unprepare(request: Any, context: Any) -> Any:
            response = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                ref = ClaimRef(claim.namespace, claim.name, claim.uid)
                response.claims[claim.uid].error = await self.unprepare(ref)
            return response

        return grpc.method_handlers_generic_handler(
            DRA_V1_SERVICE,
            {
                "NodePrepareResources": _unary(
                    prepare, pb.NodePrepareResourcesRequest, pb.NodePrepareResourcesResponse
                ),
                "NodeUnprepareResources": _unary(
                    unprepare, pb.NodeUnprepareResourcesRequest, pb.NodeUnprepareResourcesResponse
                ),
            },
        )

    def _registration_handler(self) -> Any:
        pb = pluginregistration_v1_pb2

        async def get_info(request: Any, context: Any) -> Any:
            return pb.PluginInfo(
                type="DRAPlugin",
                name=NIC_DRIVER,
                endpoint=str(self.config.dra_socket),
                supported_versions=["v1.DRAPlugin"],
            )

        async def notify(request: Any, context: Any) -> Any:
            if not request.plugin_registered:
                log.error("kubelet refused the NIC plugin's registration", error=request.error)
            return pb.RegistrationStatusResponse()

        return grpc.method_handlers_generic_handler(
            REGISTRATION_SERVICE,
            {
                "GetInfo": _unary(get_info, pb.InfoRequest, pb.PluginInfo),
                "NotifyRegistrationStatus": _unary(notify, pb.RegistrationStatus, pb.RegistrationStatusResponse),
            },
        )


def _unary(handler: Callable[[Any, Any], Any], request_type: Any, response_type: Any) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=request_type.FromString, response_serializer=response_type.SerializeToString
    )


def _make_way(socket: Path) -> None:
    socket.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()


async def _serve(socket: Path, handlers: list[Any]) -> Any:
    _make_way(socket)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(handlers)
    if not server.add_insecure_port(f"unix://{socket}"):
        raise OSError(f"cannot listen on {socket}")
    await server.start()
    return server


def _write_json(path: Path, body: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(body, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
