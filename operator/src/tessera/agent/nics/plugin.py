"""The NIC family's DRA kubelet plugin: driver ``nic.tessera.dev``, its own sockets beside the GPU
plugin's (``<registry>/nic.tessera.dev-reg.sock``, ``<plugins>/nic.tessera.dev/dra.sock``).

NodePrepareResources reads each claim (and the node's NIC slice, for the policy's ceiling the
device publishes), takes its results of our driver on this node (the device
names the NIC, ``consumedCapacity.bandwidth`` the rate, ``shareID`` the share; its interface
name comes from the claim's NicShareConfig or is ``net<N>``, numbered across the call's claims:
``naming``), has
``NicFamily`` make the shares (macvlan, classes, filters, checkpoint), and writes one CDI spec
per claim whose devices carry the ``createRuntime`` hook that attaches them to the Pod
(``tessera nic-attach``); the answer gives each device its CDI ID and share ID, and the claim's
``status.devices`` says Ready (or AttachFailed, from the hook's reports: ``report``). Unprepare
undoes all of it. Every claim gets its own answer; a claim that cannot be prepared leaves nothing made.
The same socket serves the kubelet's health stream (``NodeWatchResources``) from the NICs' link
health (``tessera.agent.nics.health``), with the GPU plugin's stream code.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from tessera import RESOURCE_GROUP, RESOURCE_VERSION
from tessera.agent.health import HealthSource
from tessera.agent.nics.family import NicFamily, ShareRequest, attach_hook
from tessera.agent.nics.naming import FIRST_AUTO, NamingError, configured_names, next_auto, share_names
from tessera.agent.nics.report import attach_failures, clear_attach_failure, share_status_entries
from tessera.agent.nics.shaping import Share
from tessera.agent.plugin.claims import ClaimError, ClaimReader, ClaimRef, ClaimStatusWriter
from tessera.agent.plugin.health import health_service
from tessera.agent.plugin.proto import dra_v1_pb2, pluginregistration_v1_pb2
from tessera.agent.plugin.rpc import Service, SocketServer, Unary, remove_socket, serve_on_socket
from tessera.agent.plugin.server import DRA_V1_SERVICE, REGISTRATION_SERVICE
from tessera.dra.nics import ADDRESSES_ATTRIBUTE, BANDWIDTH_CAPACITY, CEILING_ATTRIBUTE, NIC_DRIVER, nic_device_name
from tessera.kube.http import KubeClient, resource_path
from tessera.models.allocation import allocation_results
from tessera.models.nics import NicStatus
from tessera.models.quantity import parse_quantity
from tessera.tasks import cancel

log = structlog.get_logger("tessera.agent.nics")

CDI_KIND = f"{NIC_DRIVER}/share"
CDI_VERSION = "0.6.0"


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
    cidrs: Mapping[str, str] | None = None,
    first_auto: int = FIRST_AUTO,
) -> list[AllocatedShare]:
    """The NIC shares ``claim`` holds on ``node``, each with its device's ceiling (``ceilings``:
    device name -> bits per second), address network (``cidrs``: device name -> CIDR) and
    interface name (the claim's NicShareConfig, else ``net<N>`` counting from ``first_auto``:
    ``tessera.agent.nics.naming``); ClaimError says why there are none to make."""
    if claim.get("metadata", {}).get("uid") != ref.uid:
        raise ClaimError(f"ResourceClaim {ref} was deleted and created again; the Pod must be recreated")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated yet")
    results = allocation_results(claim, NIC_DRIVER, include_admin_access=True)  # the rules every family shares
    if not results:
        raise ClaimError(f"ResourceClaim {ref} has no device of driver {NIC_DRIVER}")
    try:
        interfaces = share_names([r.request for r in results], configured_names(claim, NIC_DRIVER), first_auto)
    except NamingError as error:
        raise ClaimError(f"ResourceClaim {ref}: {error}") from error
    by_device = {nic_device_name(n.interface): n for n in nics}
    shares = []
    for result, interface in zip(results, interfaces, strict=True):
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
            share_id, nic.interface, parse_quantity(bandwidth), ceil_bps=(ceilings or {}).get(result.device),
            cidr=(cidrs or {}).get(result.device), interface=interface,
        )  # fmt: skip
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


def device_cidrs(slices: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Device name -> the network its shares' addresses come from (``shareAddressCIDR``), for our driver's slices."""
    out: dict[str, str] = {}
    for resource_slice in slices:
        spec = resource_slice.get("spec") or {}
        if spec.get("driver") != NIC_DRIVER:
            continue
        for device in spec.get("devices") or []:
            cidr = (device.get("attributes") or {}).get(ADDRESSES_ATTRIBUTE, {}).get("string")
            if isinstance(cidr, str):
                out[str(device["name"])] = cidr
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
    hook_in_agent_namespace: bool = False  # the agent is a container: the hook enters its mount namespace
    health_refresh_s: float = 10.0  # the health stream repeats itself this often (the kubelet waits 30 s)

    @property
    def agent_pid_file(self) -> Path:
        return self.plugin_dir / "agent.pid"

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
        status: ClaimStatusWriter | None = None,
        failure_poll_seconds: float = 1.0,
        health: HealthSource | None = None,
    ) -> None:
        """``executor`` runs the blocking netlink work (default: asyncio's threads); tests give
        one whose threads live in the namespace that plays the host. ``status`` writes the claims'
        device status (Ready at prepare; AttachFailed from the hook's reports, polled). ``health``
        (the NICs' link health) is served as the kubelet's health stream on the DRA socket."""
        self._executor = executor
        self._slices = slices
        self._status = status
        self._poll = failure_poll_seconds
        # Claims prepared by this process: their ref, devices and shares, and the attach failure
        # last written on them (None: Ready).
        self._prepared: dict[str, tuple[ClaimRef, list[tuple[str, Share]]]] = {}
        self._reported: dict[str, str | None] = {}
        self._watcher: asyncio.Task[None] | None = None
        self.config = config
        self.family = family
        self.reader = reader
        self.nics = nics
        self._servers: list[SocketServer] = []
        self.health = health
        self._stopping = asyncio.Event()

    async def prepare(self, ref: ClaimRef, first_auto: int = FIRST_AUTO) -> tuple[list[AllocatedShare], str]:
        """The claim's shares made and its CDI spec written, or the reason (nothing left made).
        Shares the claim does not name are ``net<N>`` from ``first_auto`` on (see ``naming``)."""
        try:
            claim = await self.reader.read_claim(ref.namespace, ref.name)
            if claim is None:
                raise ClaimError(f"ResourceClaim {ref} does not exist")
            slices = await self._slices.node_slices(self.config.node_name) if self._slices else []
            shares = share_requests(
                claim, ref, self.config.node_name, self.nics(), device_ceilings(slices), device_cidrs(slices),
                first_auto,
            )
            made: list[Share] = await self._blocking(self.family.prepare, ref.uid, [s.share for s in shares])
            pid_file = self.config.agent_pid_file if self.config.hook_in_agent_namespace else None
            hook = attach_hook(ref.uid, self.config.checkpoint, self.config.hook_executable, pid_file)
            try:
                spec = nic_cdi_spec(ref.uid, shares, hook)
                await asyncio.to_thread(_write_json, cdi_spec_path(self.config.cdi_dir, ref.uid), spec)
            except OSError:
                await self._blocking(self.family.unprepare, ref.uid)
                raise
        except Exception as error:  # every claim gets an answer: the error is it
            log.warning("NIC claim not prepared", claim=str(ref), error=str(error))
            return [], str(error)
        by_id = {m.share_id: m for m in made}
        devices = [(s.device, by_id[s.share.share_id]) for s in shares if s.share.share_id in by_id]
        self._prepared[ref.uid] = (ref, devices)
        await self._write_status(ref.uid, None)
        return shares, ""

    def interfaces(self, claim_uid: str) -> list[str]:
        """The interface names of the claim's prepared shares (none: not prepared by this process)."""
        _, devices = self._prepared.get(claim_uid, (None, []))
        return [share.interface for _, share in devices]

    async def _write_status(self, claim_uid: str, attach_failure: str | None) -> None:
        """The claim's NIC entries in ``status.devices``: Ready, or AttachFailed with the reason."""
        if self._status is None or claim_uid not in self._prepared:
            return
        ref, devices = self._prepared[claim_uid]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            await self._status.write_device_status(
                ref, share_status_entries(self.config.node_name, devices, now, attach_failure)
            )
        except Exception as error:  # status is a report: the share itself is made, or not, regardless
            log.warning("NIC claim status not written", claim=str(ref), error=str(error))
            return
        self._reported[claim_uid] = attach_failure
        if attach_failure is not None:
            log.warning("NIC share attach failed", claim=str(ref), error=attach_failure)

    async def _report_attach_failures(self) -> None:
        """Turn the attach hook's failure files into the claims' device conditions, and back."""
        while True:
            failures = await asyncio.to_thread(attach_failures, self.config.checkpoint)
            for uid in list(self._prepared):
                if uid not in self._reported or self._reported[uid] != failures.get(uid):
                    await self._write_status(uid, failures.get(uid))
            await asyncio.sleep(self._poll)

    async def unprepare(self, ref: ClaimRef) -> str:
        try:
            await self._blocking(self.family.unprepare, ref.uid)
            await asyncio.to_thread(cdi_spec_path(self.config.cdi_dir, ref.uid).unlink, missing_ok=True)
            await asyncio.to_thread(clear_attach_failure, self.config.checkpoint, ref.uid)
        except Exception as error:
            return str(error)
        if self._prepared.pop(ref.uid, None) is not None and self._status is not None:
            self._reported.pop(ref.uid, None)
            with contextlib.suppress(Exception):  # the claim may be gone already
                await self._status.write_device_status(ref, [])
        return ""

    async def _blocking(self, work: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    # -- gRPC --

    async def start(self) -> None:
        await self._blocking(self.family.recover)
        if self.config.hook_in_agent_namespace:  # read by the attach hook (attach_hook)
            await asyncio.to_thread(self.config.agent_pid_file.parent.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(self.config.agent_pid_file.write_text, f"{os.getpid()}\n")
        if self._status is not None:
            self._watcher = asyncio.create_task(self._report_attach_failures(), name="nic-attach-failures")
        self._servers = [
            await serve_on_socket(self.config.dra_socket, [self._dra_service(), *self._health_services()]),
            await serve_on_socket(self.config.registration_socket, [self._registration_service()]),
        ]
        log.info("NIC kubelet plugin serving", dra_socket=str(self.config.dra_socket))

    def _health_services(self) -> list[Service]:
        if self.health is None:
            return []
        config = self.config
        return [health_service(self.health, config.node_name, config.health_refresh_s, self._stopping)]

    async def stop(self) -> None:
        self._stopping.set()  # health streams end now, not after the grace period
        await cancel(self._watcher)
        self._watcher = None
        for server, socket in zip(
            reversed(self._servers), (self.config.registration_socket, self.config.dra_socket), strict=False
        ):
            await server.stop(2)
            remove_socket(socket)
        self._servers = []

    def _dra_service(self) -> Service:
        pb = dra_v1_pb2

        async def prepare(request: Any) -> Any:
            response = pb.NodePrepareResourcesResponse()
            first_auto = FIRST_AUTO  # one call: one Pod's claims, in its order (see naming)
            for claim in request.claims:
                shares, error = await self.prepare(ClaimRef(claim.namespace, claim.name, claim.uid), first_auto)
                first_auto = max(first_auto, next_auto(self.interfaces(claim.uid)))
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

        async def unprepare(request: Any) -> Any:
            response = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                ref = ClaimRef(claim.namespace, claim.name, claim.uid)
                response.claims[claim.uid].error = await self.unprepare(ref)
            return response

        return Service(DRA_V1_SERVICE, {
            "NodePrepareResources": Unary(prepare, pb.NodePrepareResourcesRequest, pb.NodePrepareResourcesResponse),
            "NodeUnprepareResources": Unary(
                unprepare, pb.NodeUnprepareResourcesRequest, pb.NodeUnprepareResourcesResponse),
        })

    def _registration_service(self) -> Service:
        pb = pluginregistration_v1_pb2

        async def get_info(request: Any) -> Any:
            return pb.PluginInfo(
                type="DRAPlugin",
                name=NIC_DRIVER,
                endpoint=str(self.config.dra_socket),
                supported_versions=["v1.DRAPlugin"],
            )

        async def notify(request: Any) -> Any:
            if not request.plugin_registered:
                log.error("kubelet refused the NIC plugin's registration", error=request.error)
            return pb.RegistrationStatusResponse()

        return Service(REGISTRATION_SERVICE, {
            "GetInfo": Unary(get_info, pb.InfoRequest, pb.PluginInfo),
            "NotifyRegistrationStatus": Unary(notify, pb.RegistrationStatus, pb.RegistrationStatusResponse),
        })


def _write_json(path: Path, body: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(body, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
