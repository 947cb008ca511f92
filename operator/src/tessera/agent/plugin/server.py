"""The DRA kubelet plugin's gRPC servers: registration and the DRA service, on unix sockets.

The kubelet's plugin watcher finds ``<registry>/<driver>-reg.sock``, asks it ``GetInfo``
(type ``DRAPlugin``, the driver name, the DRA socket, the DRA service versions offered) and
reports back with ``NotifyRegistrationStatus``. It then calls ``NodePrepareResources`` /
``NodeUnprepareResources`` on ``<plugins>/<driver>/dra.sock``, in version v1 or v1beta1 (the
same service; v1 adds a device's share ID). Every claim of a request gets an answer: its CDI
device IDs, or an error for that claim only. The same socket serves the device-health stream
``v1alpha1.DRAResourceHealth/NodeWatchResources`` (``tessera.agent.plugin.health``) from the
agent's ``HealthTracker``. The servers are ``tessera.agent.plugin.rpc``'s (grpclib).

``KubeletPlugin`` is what the agent process starts and stops; ``serve_plugin`` runs one until
told to stop. The DRA socket is served before the registration socket appears, so the kubelet
never registers a plugin that cannot answer yet; the sockets are removed on stop.
Not for: the work of preparing (``tessera.agent.plugin.prepare``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import structlog

from tessera import DRIVER_NAME
from tessera.agent.health import HealthTracker
from tessera.agent.metrics import MetricsRegistry
from tessera.agent.plugin.cdi import DEFAULT_CDI_DIR
from tessera.agent.plugin.checkpoint import PreparedClaim
from tessera.agent.plugin.claims import (
    ClaimError,
    ClaimReader,
    ClaimRef,
    ClaimStatusWriter,
    KubeClaimReader,
    KubeClaimStatusWriter,
)
from tessera.agent.plugin.hardware import PluginBackend
from tessera.agent.plugin.health import health_service
from tessera.agent.plugin.prepare import ClaimPreparer, PreparerSettings
from tessera.agent.plugin.proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)
from tessera.agent.plugin.rpc import RpcAbortError, Service, SocketServer, Unary, remove_socket, serve_on_socket
from tessera.agent.plugin.steps import PluginMetrics
from tessera.agent.plugin.watched import ClaimCopies
from tessera.kube.http import KubeClient

log = structlog.get_logger("tessera.agent.plugin")

PLUGIN_TYPE = "DRAPlugin"
DRA_V1_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
REGISTRATION_SERVICE = "pluginregistration.Registration"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # what GetInfo advertises
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
ObserveClaim = Callable[[str, str, float], None]  # (prepare | unprepare, ok | error, seconds) per claim


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Where the plugin listens and keeps its files. Defaults are the kubelet's."""

    node_name: str
    driver_name: str = DRIVER_NAME
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    plugin_dir: Path | None = None  # default: /var/lib/kubelet/plugins/<driver>
    cdi_dir: Path = DEFAULT_CDI_DIR
    checkpoint_path: Path | None = None  # default: <plugin_dir>/checkpoint.json
    proc_root: Path = Path("/proc")
    dev_root: Path | None = None  # host folder standing for /dev (simulated GPUs); None: /dev
    stop_grace_s: float = 5.0
    health_refresh_s: float = 10.0  # the health stream repeats itself this often (the kubelet waits 30 s)

    @property
    def plugin_folder(self) -> Path:
        return self.plugin_dir or DEFAULT_PLUGINS_DIR / self.driver_name

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugin_folder / "dra.sock"

    @property
    def checkpoint_file(self) -> Path:
        return self.checkpoint_path or self.plugin_folder / "checkpoint.json"


def status_field_manager(config: PluginConfig) -> str:
    """The field manager of one node's claim status writes: ``gpu.tessera.dev/<node>``."""
    return f"{config.driver_name}/{config.node_name}"[:128]


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """The answer for one claim: what was prepared, or why not."""

    claim: PreparedClaim | None = None
    error: str = ""


@dataclass(slots=True)
class RegistrationState:
    """What the kubelet said in its last NotifyRegistrationStatus."""

    registered: bool = False
    error: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class KubeletPlugin:
    """The DRA kubelet plugin of one node: start it, stop it, ask it what is in use."""

    def __init__(
        self,
        config: PluginConfig,
        backend: PluginBackend,
        reader: ClaimReader,
        on_change: Callable[[], None] | None = None,
        health: HealthTracker | None = None,
        status_writer: ClaimStatusWriter | None = None,
        observe: ObserveClaim | None = None,
        registry: MetricsRegistry | None = None,
        claim_view: ClaimCopies | None = None,
    ) -> None:
        self.config = config
        self.on_change = on_change  # e.g. the agent's request_resync: its status follows at once
        self.observe = observe  # e.g. the agent's metrics: (operation, result, seconds) per claim
        self.health = health or HealthTracker()  # the agent's; a plugin alone reports no device
        self._stopping = asyncio.Event()
        self.preparer = ClaimPreparer(
            backend,
            reader,
            PreparerSettings(
                driver=config.driver_name,
                node=config.node_name,
                cdi_dir=config.cdi_dir,
                checkpoint_path=config.checkpoint_file,
                proc_root=config.proc_root,
                dev_root=config.dev_root,
            ),
            status_writer,
            PluginMetrics(registry),
            claim_view,
        )
        self.registration = RegistrationState()
        self._dra_server: SocketServer | None = None
        self._registration_server: SocketServer | None = None
        self._log = log.bind(node=config.node_name, driver=config.driver_name)

    @property
    def stopping(self) -> asyncio.Event:
        """Set once ``stop()`` began: open health streams end."""
        return self._stopping

    # -- what the agent asks --

    def in_use_device_uuids(self) -> frozenset[str]:
        """``GPU-…``/``MIG-…`` UUIDs of every device a prepared (or half-unprepared) claim holds;
        the reconciler must not change them."""
        return self.preparer.in_use_device_uuids()

    def in_use_gpu_uuids(self) -> frozenset[str]:
        """UUIDs of the physical GPUs under those devices (a MIG instance's parent included)."""
        return self.preparer.in_use_gpu_uuids()

    # -- the work, transport aside --

    async def prepare_claims(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        """Prepare every claim concurrently; one claim's failure is that claim's answer only."""
        outcomes = await asyncio.gather(*(self._guard("prepare", r, self.preparer.prepare(r)) for r in refs))
        self._changed()
        return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

    async def unprepare_claims(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        outcomes = await asyncio.gather(*(self._guard("unprepare", r, self.preparer.unprepare(r)) for r in refs))
        self._changed()
        return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def _guard(self, what: str, ref: ClaimRef, work: Awaitable[PreparedClaim | None]) -> ClaimOutcome:
        started = time.monotonic()
        outcome = await self._answer(what, ref, work)
        if self.observe is not None:
            self.observe(what, "error" if outcome.error else "ok", time.monotonic() - started)
        return outcome

    async def _answer(self, what: str, ref: ClaimRef, work: Awaitable[PreparedClaim | None]) -> ClaimOutcome:
        try:
            return ClaimOutcome(claim=await work)
        except ClaimError as error:
            self._log.warning(f"{what} failed", claim=str(ref), uid=ref.uid, error=str(error))
            return ClaimOutcome(error=str(error))
        except Exception as error:  # a bug or an API outage: answer this claim, keep serving
            self._log.exception(f"{what} failed unexpectedly", claim=str(ref), uid=ref.uid)
            return ClaimOutcome(error=f"{what} of ResourceClaim {ref} failed: {type(error).__name__}: {error}")

    # -- gRPC --

    async def start(self) -> None:
        """Restore state from the checkpoint, serve the DRA socket, then the registration socket."""
        await self.preparer.restore()
        self._dra_server = await serve_on_socket(
            self.config.dra_socket,
            [
                _dra_service(DRA_V1_SERVICE, dra_v1_pb2, self, with_share_id=True),
                _dra_service(DRA_V1BETA1_SERVICE, dra_v1beta1_pb2, self, with_share_id=False),
                health_service(self.health, self.config.node_name, self.config.health_refresh_s, self.stopping),
            ],
        )
        self._registration_server = await serve_on_socket(
            self.config.registration_socket, [_registration_service(self)]
        )
        self._log.info(
            "kubelet plugin serving",
            registration_socket=str(self.config.registration_socket),
            dra_socket=str(self.config.dra_socket),
        )

    async def stop(self) -> None:
        """Stop serving; the registration socket goes first so the kubelet stops calling."""
        self._stopping.set()  # health streams end now, not after the grace period
        for server, socket in (
            (self._registration_server, self.config.registration_socket),
            (self._dra_server, self.config.dra_socket),
        ):
            if server is not None:
                await server.stop(self.config.stop_grace_s)
            remove_socket(socket)
        self._registration_server = self._dra_server = None
        await self.preparer.close(self.config.stop_grace_s)
        self._log.info("kubelet plugin stopped")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- registration RPCs --

    async def get_info(self, request: Any) -> pluginregistration_v1_pb2.PluginInfo:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.config.driver_name,
            endpoint=str(self.config.dra_socket),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def notify_registration_status(
        self, status: pluginregistration_v1_pb2.RegistrationStatus
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        self.registration.registered = status.plugin_registered
        self.registration.error = status.error
        self.registration.changed.set()
        if not status.plugin_registered:
            self._log.error("kubelet refused the plugin's registration", error=status.error)
            raise RpcAbortError(f"failed registration process: {status.error}")
        self._log.info("registered with the kubelet")
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _dra_service(name: str, pb: Any, plugin: KubeletPlugin, with_share_id: bool) -> Service:
    """The DRA service in one API version; ``pb`` is that version's generated module."""

    async def prepare(request: Any) -> Any:
        outcomes = await plugin.prepare_claims(_refs(request))
        response = pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error or outcome.claim is None:
                entry.error = outcome.error or "not prepared"
                continue
            for device in outcome.claim.devices:
                answer = entry.devices.add(
                    request_names=[device.request.split("/", 1)[0]],
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=[device.cdi_device_id],
                )
                if with_share_id and device.share_id:
                    answer.share_id = device.share_id
        return response

    async def unprepare(request: Any) -> Any:
        outcomes = await plugin.unprepare_claims(_refs(request))
        response = pb.NodeUnprepareResourcesResponse()
        for uid, outcome in outcomes.items():
            response.claims[uid].error = outcome.error
        return response

    return Service(name, {
        "NodePrepareResources": Unary(prepare, pb.NodePrepareResourcesRequest, pb.NodePrepareResourcesResponse),
        "NodeUnprepareResources": Unary(
            unprepare, pb.NodeUnprepareResourcesRequest, pb.NodeUnprepareResourcesResponse),
    })


def _registration_service(plugin: KubeletPlugin) -> Service:
    pb = pluginregistration_v1_pb2
    return Service(REGISTRATION_SERVICE, {
        "GetInfo": Unary(plugin.get_info, pb.InfoRequest, pb.PluginInfo),
        "NotifyRegistrationStatus": Unary(
            plugin.notify_registration_status, pb.RegistrationStatus, pb.RegistrationStatusResponse),
    })


async def serve_plugin(
    config: PluginConfig,
    backend: PluginBackend,
    api: KubeClient,
    stop: asyncio.Event | None = None,
    started: Callable[[KubeletPlugin], None] | None = None,
    on_change: Callable[[], None] | None = None,
    health: HealthTracker | None = None,
    observe: ObserveClaim | None = None,
    registry: MetricsRegistry | None = None,
    claim_view: ClaimCopies | None = None,
) -> None:
    """Run the kubelet plugin until ``stop`` is set (or the task is cancelled).

    ``started`` gets the running plugin, e.g. to let the reconciler ask
    ``plugin.in_use_device_uuids()``; ``registry`` is the agent's, for the plugin's metrics;
    ``claim_view`` the agent's claim view, whose copy of a claim a prepare starts from (it
    has copies only while the agent watches every claim itself)."""
    writer = KubeClaimStatusWriter(api, status_field_manager(config))
    plugin = KubeletPlugin(config, backend, KubeClaimReader(api), on_change, health, writer, observe, registry,
                           claim_view)
    async with plugin:
        if started is not None:
            started(plugin)
        await (stop or asyncio.Event()).wait()
