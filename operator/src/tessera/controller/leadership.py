"""Two operator replicas, one writer: how the Lease elector, the write fence, Kopf and the
Controller fit together.

Design (the short version of DESIGN.md's "Two operators, one leader"):

- **Every replica reads, one writes.** Both replicas run Kopf and the Controller's list-watches
  all the time, so a standby's view (policies, claims, Nodes, NodeLayouts, our slices) is as
  warm as the leader's. Only the replica holding the ``coordination.k8s.io`` Lease
  (``tessera.kube.lease``) reconciles nodes and writes policy status: the Controller's workers
  wait on :meth:`Controller.lead` / :meth:`Controller.follow`.
- **Kopf is a watch source, not a writer.** Kopf's peering is not leader election (equal
  priorities freeze every peer, and a dead peer is passed over only after its lifetime), and
  Kopf's own writes — finalizers, progress and diff-base annotations, events — go through its
  own HTTP session, which no fence of ours can stop. So Kopf runs standalone in every replica
  with event handlers only (``kopf.on.event``: nothing stored on the objects), posts no events,
  and its finalizer setting names one that no object carries, so it never adds or removes one.
  Kopf writes nothing at all; every write of the operator goes through ``tessera.kube.http``.
- **No two writers, ever: a fence, not a hope.** That one client carries a
  :class:`~tessera.kube.fence.WriteFence`, checked when each mutating request is about to
  reach the wire. The elector opens it after each renewal for the renew deadline (10 s),
  measured on the monotonic clock from before the renewal was sent; a standby cannot take the
  lease sooner than the lease duration (15 s) after it saw that renewal. A leader that cannot
  renew, or a process frozen by SIGSTOP that wakes late, meets a shut fence on its first
  write, whatever its loops were doing; it writes again only after it acquires the lease again.
- **Failover.** The standby watches the Lease, so it knows to the millisecond when the lease
  was last renewed, and tries to take it the moment a whole lease duration has passed; then its
  Controller reconciles every node from the view it already holds. A clean shutdown releases
  the lease (empty holder), so a rolling update hands over at once.

- **The Lease does not wait on the work.** The elector runs on an event loop of its own, in a
  thread, with its own client: a stretch of CPU-bound work on the operator's loop (a restart's
  reconciles at 5,000 nodes held it for longer than the renew deadline, so the leader lost its
  own lease, dropped its work, took the lease back, and began again, for as long as we watched)
  cannot hold a renewal back. The fence is a deadline read at each write, so it needs no
  handing over; the elector's callbacks (lead, follow) are passed to the operator's loop.

This module builds the pieces for one process (the fenced client, the elector and its own
client and thread, the metrics, ``/readyz``) and connects the elector's callbacks to the
Controller.
Not for: the election's rules (``tessera.kube.lease``), the fence (``tessera.kube.fence``), or
what a leader does (``tessera.controller.runtime``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import structlog
from aiohttp import web
from prometheus_client import Counter, Gauge

from tessera.controller.runtime import Controller
from tessera.kube.fence import WriteFence
from tessera.kube.http import KubeClient
from tessera.kube.lease import LeaseElector, LeaseTiming, default_identity
from tessera.tasks import cancel

log = structlog.get_logger("tessera.operator")

LEADER = Gauge("tessera_operator_leader", "1 while this replica holds the operator's Lease, else 0")
LEASE_TRANSITIONS = Gauge("tessera_operator_lease_transitions",
                          "leaseTransitions of the operator's Lease as this replica last saw it")
FENCED_WRITES = Gauge("tessera_operator_fenced_writes",
                      "Writes the fence refused since start (this replica did not hold the lease)")
LEADERSHIP_CHANGES = Counter("tessera_operator_leadership_changes_total",
                             "Times this replica started or stopped leading", ["change"])

DEFAULT_LEASE_NAME = "tessera-operator"
DEFAULT_LEASE_NAMESPACE = "tessera-system"


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str = DEFAULT_LEASE_NAMESPACE
    name: str = DEFAULT_LEASE_NAME
    identity: str = ""  # empty: <pod or host name>_<random>
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    write_log: str = ""  # tests only: a file that records every write as it goes out (see WriteLog)


class WriteLog:
    """Tests only: one line per mutating request as it goes onto the wire, ``<monotonic ns>
    <method> <url>``, and ``<monotonic ns> LEADING`` when this replica starts to lead.
    ``time.monotonic`` is one clock for every process on a Linux machine, so a test can set
    these lines against the moments it froze and woke this process, and against other replicas'."""

    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)

    def __call__(self, method: str, url: str) -> None:
        self._file.write(f"{time.monotonic_ns()} {method} {url}\n")

    def leading(self) -> None:
        self._file.write(f"{time.monotonic_ns()} LEADING\n")


class Leadership:
    """The fence, the fenced client for every write, and the elector that opens the fence."""

    def __init__(self, settings: LeaseSettings, kubeconfig: str | None = None) -> None:
        self.settings = settings
        self.fence = WriteFence()
        FENCED_WRITES.set_function(lambda: self.fence.refused)
        self.write_log = WriteLog(settings.write_log) if settings.write_log else None
        self.client = KubeClient.from_environment(kubeconfig, fence=self.fence, on_write=self.write_log)
        self._lease_client = KubeClient.from_environment(kubeconfig)  # never fenced, never queued behind writes
        identity = settings.identity or default_identity(os.environ.get("POD_NAME"), socket.gethostname())
        self.elector = LeaseElector(self._lease_client, settings.namespace, settings.name, identity, self.fence,
                                    timing=settings.timing, on_started_leading=self._on_loop(self._started),
                                    on_stopped_leading=self._on_loop(self._stopped), on_observed=self._observed)
        self.controller: Controller | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the operator's
        self._thread: threading.Thread | None = None  # the elector's, with its loop and client
        self._halt = threading.Event()
        self._site: web.AppRunner | None = None
        LEADER.set(0)

    @property
    def identity(self) -> str:
        return self.elector.identity

    def start(self, controller: Controller) -> None:
        """Campaign for the lease (in the elector's thread); the Controller leads while this
        replica holds it."""
        self.controller = controller
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=asyncio.run, args=(self._campaign(),),
                                        name="tessera-leader-election", daemon=True)
        self._thread.start()

    async def _campaign(self) -> None:
        """The elector's thread: run it until ``stop``, then hand the lease over."""
        election = asyncio.create_task(self.elector.run(), name="tessera-leader-election")
        halt = asyncio.ensure_future(asyncio.to_thread(self._halt.wait))
        try:
            await asyncio.wait({election, halt}, return_when=asyncio.FIRST_COMPLETED)
            if election.done() and not election.cancelled() and election.exception() is not None:
                log.error("the leader election ended", error=repr(election.exception()))
        finally:
            await cancel(election)
            await self.elector.release()
            await self._lease_client.close()
            self._halt.set()  # so that the waiting thread ends when the election did first
            await halt

    def _on_loop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """``callback``, called from the elector's thread, run on the operator's loop (in order)."""

        def call() -> None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(callback)

        return call

    async def stop(self) -> None:
        """Stop campaigning and hand the lease over (the fence shuts first)."""
        self.fence.shut()
        self._halt.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        else:
            await self._lease_client.close()  # never started: the thread would have closed it
        if self._site is not None:
            await self._site.cleanup()
        await self.client.close()

    def role(self) -> str:
        return "leader" if self.elector.leading and self.fence.is_open() else "standby"

    def _started(self) -> None:
        if self.write_log is not None:
            self.write_log.leading()
        LEADER.set(1)
        LEADERSHIP_CHANGES.labels("started").inc()
        if self.controller is not None:
            self.controller.lead()

    def _stopped(self) -> None:
        LEADER.set(0)
        LEADERSHIP_CHANGES.labels("stopped").inc()
        if self.controller is not None:
            self.controller.follow()

    def _observed(self, lease: dict[str, Any]) -> None:
        LEASE_TRANSITIONS.set(int((lease.get("spec") or {}).get("leaseTransitions") or 0))

    # -- /readyz ----------------------------------------------------------------------------

    async def serve_readiness(self, port: int) -> None:
        """``/readyz`` on ``port``: 503 ``starting`` until the view is read, then 200 with
        ``leader`` or ``standby`` (a warm standby is ready: a PodDisruptionBudget counts it, and
        a drain of the leader's node must not wait for the standby to become leader first)."""
        app = web.Application()
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", port).start()  # probed by the kubelet on the pod IP
        self._site = runner

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.controller is None or not self.controller.ready.is_set():
            return web.Response(status=503, text="starting\n")
        return web.Response(text=f"{self.role()}\n", headers={"X-Tessera-Role": self.role()})
