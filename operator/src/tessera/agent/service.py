"""The node agent's process: watch this node's NodeLayout, reconcile, write its status.

GPU health is kept by a ``HealthTracker`` (``tessera.agent.health``): events from the health
thread mark GPUs, each pass's probe clears the ones healthy again, and the kubelet plugin's
health stream reads the same tracker.

``NodeAgent.run`` ensures the NodeLayout exists (owned by the Node), then loops: a watch on
the object, a periodic resync (every ``resync_seconds``: the hardware is read again, and what
drifted is put right), and a thread waiting for GPU health events all wake one reconcile
pass. A pass runs ``apply_layout`` in a worker thread (backend calls block), builds the status
and writes it through the status subresource when it differs from the one the pass read. An
unchanged status is not written again: the apiserver would store nothing and tell no watcher,
yet spend 9-13 ms of CPU on it (decoding, validating, managedFields), which a 30 s rewrite from
each of 5,000 agents would make about 1.7 cores of the apiserver's at rest. It serves
Prometheus metrics on ``/metrics`` and liveness on ``/healthz`` (503 once no pass has finished
for three resync periods) through ``tessera.agent.metricsserver``.

Before an operation destroys or reshapes a published device, the reconciler asks a
``ClaimGuard``, which reads the claims naming this node's devices, proved current
(``tessera.agent.claimview``: the operator's answer to this agent's ask, or for a spec written
by hand the agent's own claim watch and fence, instead of a cluster-wide list per operation;
one proof per pass, ``tessera.agent.passclaims``), and refuses when an allocation names the
device (``tessera.agent.claimguard``).

The DRA kubelet plugin shares the backend; it calls ``request_resync()`` after it creates or
destroys an instance so the status follows at once.
Not for: deciding layouts, or talking to GPUs other than through the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from tessera import DRIVER_NAME, INSTALL_NAMESPACE
from tessera.agent.backends.base import BackendError, DeviceBackend
from tessera.agent.claimguard import ClaimGuard
from tessera.agent.claimview import ClaimView
from tessera.agent.health import HealthTracker
from tessera.agent.metrics import CONTENT_TYPE, Counter, Gauge, Histogram, MetricsRegistry
from tessera.agent.metricsserver import TEXT, MetricsServer
from tessera.agent.passclaims import PassClaimReads
from tessera.agent.reconciler import ApplyResult, apply_layout
from tessera.agent.status import build_status
from tessera.kube.http import ApiError, KubeClient, retry_delay
from tessera.kube.nodelayouts import (
    GROUP,
    PLURAL,
    VERSION,
    ensure_node_layout,
    get_node_layout,
    write_node_layout_status,
)
from tessera.kube.watch import ListWatch
from tessera.models.layout import ClaimCheck, NodeLayoutSpec, NodeLayoutStatus
from tessera.models.nics import NicStatus

AGENT_VERSION = "0.1.0"
log = structlog.get_logger("tessera.agent")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_name: str
    resync_seconds: float = 30.0
    metrics_host: str = "0.0.0.0"  # a DaemonSet's metrics port listens on the pod IP
    metrics_port: int | None = 9464  # None: no HTTP server
    health_poll_seconds: float = 5.0
    claim_check_timeout_seconds: float = 15.0  # proving the claims current before a destroy
    fence_namespace: str = INSTALL_NAMESPACE  # where the agent's fence claim lives (tessera.agent.claimview)
    # A pass's later claim reads reuse its first fence for this long (tessera.agent.passclaims); 0: a fence each.
    claim_reuse_seconds: float = 1.0
    health_recovery_seconds: float | None = 600.0  # an unhealthy GPU clears after this long quiet


class AgentMetrics:
    """The agent's Prometheus metrics (``tessera.agent.metrics``), in a registry of its own
    (several agents per test process)."""

    def __init__(self) -> None:
        self.registry = MetricsRegistry()
        r = self.registry
        self.passes = Counter("tessera_agent_reconcile_passes", "Reconcile passes, by result", ["result"], registry=r)
        self.operations = Counter(
            "tessera_agent_operations", "GPU operations run, by kind and result", ["kind", "result"], registry=r
        )
        self.pass_seconds = Histogram("tessera_agent_reconcile_seconds", "Time of one reconcile pass", registry=r)
        self.gpus = Gauge("tessera_agent_gpus", "GPUs on this node, by health", ["health"], registry=r)
        self.gpus_applied = Gauge("tessera_agent_gpus_applied", "GPUs whose layout matches the spec", registry=r)
        self.gpus_blocked = Gauge("tessera_agent_gpus_blocked", "GPUs blocked, by reason", ["reason"], registry=r)
        self.mig_instances = Gauge("tessera_agent_mig_instances", "MIG instances that exist", ["in_use"], registry=r)
        self.health_events = Counter("tessera_agent_health_events", "GPU health events", ["kind"], registry=r)
        self.mps_restarts = Counter(
            "tessera_agent_mps_daemon_restarts", "MPS control daemons found dead and started again", registry=r
        )
        self.health_recoveries = Counter(
            "tessera_agent_health_recoveries", "Unhealthy or lost GPUs found healthy again", registry=r
        )
        self.status_writes = Counter("tessera_agent_status_writes", "NodeLayout status writes", registry=r)
        self.claim_checks = Counter(
            "tessera_agent_claim_checks", "ResourceClaim reads before destroying or reshaping a device", registry=r
        )
        self.refusals = Counter(
            "tessera_agent_operations_refused", "Operations refused because a claim holds the device", ["reason"],
            registry=r,
        )
        self.last_pass = Gauge("tessera_agent_last_pass_timestamp_seconds", "End of the last pass", registry=r)
        self.claim_seconds = Histogram(
            "tessera_agent_claim_seconds", "Time the kubelet plugin took to prepare or unprepare one claim",
            ["operation", "result"], registry=r,
        )
        self.claim_proof_seconds = Histogram(
            "tessera_agent_claim_proof_seconds",
            "Time from the claim guard's ask (or fence) to the operator's answer (or the watch's echo)",
            ["way"], registry=r,
        )

    def observe_claim(self, operation: str, result: str, seconds: float) -> None:
        """The kubelet plugin's answer to one claim (its ``observe`` hook)."""
        self.claim_seconds.labels(operation, result).observe(seconds)

    def observe(self, result: ApplyResult, status: NodeLayoutStatus) -> None:
        for op in result.executed:
            self.operations.labels(op.kind.value, "ok").inc()
            if op.restart:
                self.mps_restarts.inc()
        for f in result.failures:
            self.operations.labels(f.operation.kind.value, f.error.reason).inc()
        for health in ("Healthy", "Unhealthy", "Lost"):
            self.gpus.labels(health).set(sum(1 for g in status.gpus if g.health.value == health))
        self.gpus_applied.set(sum(1 for g in status.gpus if g.applied))
        reasons: dict[str, int] = {}
        for p in result.plans:
            for b in {b.reason.value for b in p.blockers}:
                reasons[b] = reasons.get(b, 0) + 1
        self.gpus_blocked.clear()
        for reason, count in reasons.items():
            self.gpus_blocked.labels(reason).set(count)
        instances = [i for g in status.gpus for i in g.mig_instances]
        self.mig_instances.labels("true").set(sum(1 for i in instances if i.in_use))
        self.mig_instances.labels("false").set(sum(1 for i in instances if not i.in_use))
        self.last_pass.set(time.time())


class NodeAgent:
    """One node's agent. ``run()`` until ``stop()``."""

    def __init__(
        self,
        config: AgentConfig,
        backend: DeviceBackend,
        api: KubeClient,
        health: HealthTracker | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.api = api
        self.health = health or HealthTracker(config.health_recovery_seconds)
        self.metrics = AgentMetrics()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._halt = threading.Event()  # the same, for the health thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status: NodeLayoutStatus | None = None
        self._reporting: int | None = None  # the generation of the status being written now
        # The NodeLayout as this agent's watch last delivered it (None: not yet, or deleted): a
        # pass the watch woke works from it instead of reading it again (``reconcile_once``).
        self._seen: dict[str, Any] | None = None
        # The NIC family's inventory (tessera.agent.nics), reported beside the GPUs; None: no NICs.
        self.nic_inventory: Callable[[], Sequence[NicStatus]] | None = None
        self._last_pass_done: float | None = None
        self.http_port: int | None = None  # the bound port, once serving
        self.claims = ClaimView(api, driver=DRIVER_NAME, node=config.node_name,
                                fence_namespace=config.fence_namespace,
                                timeout_s=config.claim_check_timeout_seconds)
        self.claims.observe = lambda way, seconds: self.metrics.claim_proof_seconds.labels(way).observe(seconds)
        self.passes = 0

    # -- for the kubelet plugin and tests --

    def request_resync(self) -> None:
        """Reconcile soon. Safe to call from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    @property
    def stopping(self) -> asyncio.Event:
        """Set once the agent is stopping; what it runs beside it (the kubelet plugin) stops too."""
        return self._stopping

    def stop(self) -> None:
        self._halt.set()
        self._stopping.set()
        self._wake.set()

    @property
    def healthy(self) -> bool:
        if self._last_pass_done is None:
            return True  # starting
        return time.monotonic() - self._last_pass_done < 3 * self.config.resync_seconds + 30

    # -- the loop --

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        port = self.config.metrics_port
        http = await self._serve_http(port) if port is not None else None
        health_thread = threading.Thread(target=self._health_events, name="gpu-health-events", daemon=True)
        health_thread.start()
        watcher = ListWatch(self.api, GROUP, VERSION, PLURAL, self._layout_event,
                            field_selector=f"metadata.name={self.config.node_name}")
        watcher.start()
        try:
            await self._ensure_layout()
            await self.claims.ensure_fence()  # made now, so a pass's fence is one write
            failures, fresh = 0, True
            while not self._stopping.is_set():
                self._wake.clear()
                failures = 0 if await self.reconcile_once(fresh=fresh) is not None else failures + 1
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.next_pass_in(failures))
                    fresh = failures > 0
                except TimeoutError:
                    fresh = True  # the resync, and a retry, read the NodeLayout whatever the watch says
        finally:
            await watcher.stop()
            await self.claims.stop()
            self._stopping.set()
            self._halt.set()
            await asyncio.to_thread(health_thread.join, 1.0)  # a daemon thread: a blocked wait does not hold exit
            if http is not None:
                await http.close()

    def next_pass_in(self, failures: int) -> float:
        """Seconds until the next pass when nothing wakes the agent: the resync, or after
        ``failures`` failed passes in a row a short backoff (an apiserver back from an outage
        sends no event that would wake the agent, so waiting a whole resync would leave the
        status it could not write stale for that long)."""
        if not failures:
            return self.config.resync_seconds
        return min(retry_delay(failures - 1), self.config.resync_seconds)

    async def _ensure_layout(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            try:
                await ensure_node_layout(self.api, self.config.node_name)
                return
            except (LookupError, ApiError, OSError) as e:  # OSError: no apiserver (yet), or it went away
                log.warning("cannot get or create the NodeLayout yet", node=self.config.node_name, error=repr(e))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=retry_delay(attempt))
                attempt += 1

    async def reconcile_once(self, *, fresh: bool = True) -> NodeLayoutStatus | None:
        """One pass: read the spec, apply it, write the status. Errors are logged, not raised.

        Not ``fresh``: the pass works from the NodeLayout the watch last delivered, when it has
        one, rather than reading it (a request per pass, at fleet scale a few ms of the
        apiserver's CPU each). That is no less safe than a read: a read too is old by the time
        the GPUs change, and what keeps a partition in use from going is the claim guard's
        proof, taken after, not the spec's age. An old copy costs a conflict at most: the
        status is written over the resourceVersion the pass worked from, so the write of a pass
        that missed a newer spec fails, reads again, and the newer generation wakes a pass of
        its own. The resync and every retry after a failed pass read afresh."""
        started = time.monotonic()
        try:
            obj = None if fresh else self._seen
            if obj is None:
                obj = await get_node_layout(self.api, self.config.node_name)
            if obj is None:
                await self._ensure_layout()
                obj = await get_node_layout(self.api, self.config.node_name)
                if obj is None:
                    return None
            try:
                spec = NodeLayoutSpec.from_kube(obj.get("spec"))
            except ValidationError as e:
                # A spec this agent cannot read (a newer operator?) changes nothing on the GPUs.
                log.error("cannot read NodeLayout.spec; leaving the GPUs as they are", error=str(e))
                self.metrics.passes.labels("error").inc()
                return None
            try:
                previous = NodeLayoutStatus.from_kube(obj["status"]) if obj.get("status") else None
            except ValidationError:
                previous = None  # rewritten from what the hardware says
            generation = obj["metadata"].get("generation")
            await self.claims.use(asking=spec.claim_check is ClaimCheck.OPERATOR)
            self.health.seed(previous)
            guard = self._claim_guard(spec, previous)
            result = await asyncio.to_thread(apply_layout, self.backend, spec, guard=guard)
            self.metrics.claim_checks.inc(guard.checks)
            for _, refusal in result.refusals:
                self.metrics.refusals.labels(refusal.reason.value).inc()
            marked_before = self.health.marked()
            inventory = self.health.observe(result.inventory)
            recovered = sorted(set(marked_before) - set(self.health.marked()))
            if recovered:
                self.metrics.health_recoveries.inc(len(recovered))
                log.info("GPUs healthy again", gpus=recovered, were=[marked_before[u].value for u in recovered])
            status = build_status(
                inventory,
                spec,
                result.plans,
                backend=self.backend.name,
                agent_version=AGENT_VERSION,
                observed_generation=generation,
                previous=previous,
            )
            if self.nic_inventory is not None:
                status = status.model_copy(update={"nics": list(self.nic_inventory())})
            if previous != status:
                # The watch often brings this write's echo before its answer: it is no news.
                self._reporting = generation
                # Over the version this pass read: one request, not a read and a write (a
                # conflict, when the spec changed meanwhile, reads again).
                await write_node_layout_status(self.api, self.config.node_name, status.to_kube(), read=obj)
                self.metrics.status_writes.inc()
            self._status = status
            self.health.publish(status)
            self.metrics.observe(result, status)
            self.metrics.passes.labels("ok").inc()
            self._last_pass_done = time.monotonic()
            self.passes += 1
            for op in result.executed:
                if op.restart:
                    log.warning("an MPS daemon had died; restarted it", operation=op.describe())
            if result.executed or result.failures:
                log.info(
                    "reconciled",
                    executed=len(result.executed),
                    failed=len(result.failures),
                    blocked=[b.message for p in result.plans for b in p.blockers],
                )
            return status
        except (ApiError, BackendError, LookupError, OSError) as e:
            log.warning("reconcile pass failed; will retry", error=str(e))
            self.metrics.passes.labels("error").inc()
            return None
        finally:
            self.metrics.pass_seconds.observe(time.monotonic() - started)

    def _claim_guard(self, spec: NodeLayoutSpec, previous: NodeLayoutStatus | None) -> ClaimGuard:
        """The reconciler's last line: this node's claims, proved current, before each destroy;
        one fence per pass while it is young enough (``tessera.agent.passclaims``). The
        reconciler runs in a worker thread; the read runs on this loop and the thread waits."""
        loop = asyncio.get_running_loop()
        timeout = self.config.claim_check_timeout_seconds
        reads = PassClaimReads(self.claims.fresh, self.claims.held, self.config.claim_reuse_seconds)

        def list_claims() -> list[dict[str, Any]]:
            future = asyncio.run_coroutine_threadsafe(reads.read(), loop)
            return future.result(2 * timeout + 5)  # the fence's write, then its echo

        return ClaimGuard(list_claims, driver=DRIVER_NAME, node=self.config.node_name, spec=spec, published=previous)

    def _layout_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Wake the loop when the NodeLayout changes (or goes), not for the echo of the status
        it wrote itself. ``ListWatch`` keeps the watch going: resumed where the server ended it,
        a fresh list after 410 Gone, other failures retried on ``retry_delay``'s schedule."""
        if self.layout_seen(kind, obj):
            self._wake.set()

    def layout_seen(self, kind: str, obj: dict[str, Any]) -> bool:
        """Keep the NodeLayout a watch delivered, for the next pass to work from, and say
        whether it asks for a pass (``wants_pass``)."""
        self._seen = None if kind == "DELETED" else obj
        return self.wants_pass(kind, obj)

    def wants_pass(self, kind: str, obj: dict[str, Any]) -> bool:
        """Whether a NodeLayout watch event asks for a pass: a deletion, or a generation (a
        spec) that no status of this agent reports or is being written to report."""
        generation = (obj.get("metadata") or {}).get("generation")
        reported = {self._reporting, self._status.observed_generation if self._status is not None else None}
        return kind == "DELETED" or generation is None or generation not in reported

    def _health_events(self) -> None:
        """Thread: block on the backend's health events, count them, wake the loop."""
        while not self._halt.is_set():
            try:
                events = self.backend.wait_health_events(self.config.health_poll_seconds)
            except BackendError as e:
                log.warning("GPU health events unavailable", error=str(e))
                self._halt.wait(self.config.health_poll_seconds)
                continue
            for event in events:
                self.metrics.health_events.labels(event.kind.value).inc()
                log.warning(
                    "GPU health event", gpu=event.gpu_uuid, kind=event.kind.value, xid=event.xid, fatal=event.fatal
                )
            if events:
                self.health.record_events(events)  # the kubelet's health stream hears it now
                self.request_resync()  # the status and the slices follow with the next pass

    # -- HTTP --

    async def _serve_http(self, port: int) -> MetricsServer:
        def healthz() -> tuple[int, str, bytes]:
            if self.healthy:
                return 200, TEXT, b"ok\n"
            return 503, TEXT, b"no reconcile pass lately\n"

        def metrics() -> tuple[int, str, bytes]:
            return 200, CONTENT_TYPE, self.metrics.registry.exposition()

        server = MetricsServer({"/healthz": healthz, "/metrics": metrics})
        self.http_port = await server.start(self.config.metrics_host, port)
        log.info("serving metrics and health", port=self.http_port)
        return server
