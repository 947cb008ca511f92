"""Benchmark: the operator over N simulated nodes x 8 GPUs on a real local control plane.

    .venv/bin/python benchmarks/bench_operator.py [--nodes 10,100,500] [--simulate 8xH100-80GB]
        [--concurrency 64] [--timeout 900] [--history] [--profile DIR]
    .venv/bin/python benchmarks/bench_operator.py --nodes 1000,2000,5000   # as far as the machine holds
    .venv/bin/python benchmarks/bench_operator.py --nodes 1000,2000 --restart-only
    .venv/bin/python benchmarks/bench_operator.py --nodes 5000 --restart-only --restart-layout mig

``--restart-only`` runs only the first start (every GPU Exclusive; with ``--restart-layout mig``
the policy is applied before it, so every GPU is cut to MIG all-balanced at once, without the
rollout's handover) and the no-op restart, and prints
``restart N=<n>: <w> writes, <c> objects changed, ready <s>, peak RSS <m> MiB (<k> KiB/node)``.

Per N it also prints two lines a script can compare across runs:
``rollout/floor N=<n>: <ratio>x (rollout <s> s, floor <s> s)`` and
``agent requests per pass N=<n>: <k>`` (the API requests an agent pass makes, averaged over the
rollout's passes: the status write and the claim guard's ask (or fence) writes, and a read of
the NodeLayout only where the pass could not work from what the watch delivered (the first, a
retry); the watches' streams are not requests per pass and are not counted).

For each N: start etcd, kube-apiserver, controller manager and scheduler on loopback; apply
``crds/`` and ``manifests/deviceclasses.yaml``; create N Nodes in one ``kubectl create``; start
an in-process *agent fleet*; start the operator as a real ``python -m tessera operator``
process; wait until it has published every node's Exclusive slices and gone quiet; apply one
SharingPolicy selecting every node (static MIG, preset ``all-balanced``); time until every
node's pool (one shared slice) holds the 4 MIG devices of each of its 8 GPUs and the policy is Ready with
``gpusApplied == 8N``; count the API writes the operator made for it (its own
``tessera_operator_api_writes_total`` counters, by kind). Then a no-op resync: stop the
operator, start a new one, wait until it has reconciled N nodes and made a SharingPolicy
status pass, and report its writes (must be 0) and how many objects changed
(resourceVersions of NodeLayouts, ResourceSlices and SharingPolicies before and after, so
Kopf's own writes would show too). Peak RSS (VmHWM) of each operator process and of this
process (the agent fleet plus the slice watcher), and CPU seconds per component during the
rollout, are printed too.

Then the raw floor: what the same writes cost without the operator, at the apiserver's own
speed. Watches record every write the rollout made to ResourceSlices and NodeLayout specs (the
bodies, in resourceVersion order per node). With the operators and the agent fleet stopped,
every node is put back, untimed, as it was before the policy; then the recorded writes are made
again directly with ``KubeClient``, one node after another on N workers, each node's writes in
order. That is timed for each N of ``--floor-concurrency`` (8, 16 and 32 by default; the node
is put back before each); the fastest, plus one handover grace (the operator's default, 1 s:
every node's GPUs must be published tainted for a grace before their new layout, and a rollout
can at best share one grace among all nodes), is the floor, as issue 22 defines it. Printed:
each time, and the rollout (policy -> all slices show the MIG layout) divided by the floor. The
floor leaves out what a rollout cannot: the agents' status writes, the watches' traffic. So a
second floor replays the agents' writes too, in their places (each node's status write after
its new spec, and the claim guard's check before it: its ask and the operator's answer), and prints
``rollout/floor with the agents' writes N=<n>: <ratio>x``: what the operator's orchestration
(the waits, the queue, the watches) adds to the writes a rollout must make.

The agent fleet: 500 agent processes do not fit a 2-core machine, so one process runs every
node's agent. Each node has a real ``tessera.agent.service.NodeAgent`` over its own in-memory
``SimulatedBackend``, and its pass is the agent's own ``NodeAgent.reconcile_once`` (ensure
the NodeLayout owned by the Node, take the spec as the watch delivered it, ``apply_layout`` on the simulated GPUs,
``build_status``, write the status through the status subresource when it changed) with its own
``ClaimView`` (the claim guard's ask is the agent's own write, answered by the operator under
test). Only the per-process plumbing
differs: one watch on all NodeLayouts and one on all ResourceClaims instead of one each per node
(each node's ClaimView is fed from the shared claim watch), a bounded
pool of passes (``--concurrency``, 64 by default: a pass spends most of its time waiting for
the operator's answer to its claim check, and with 16 the fleet's own queue, not Tessera, set the
pace of a 100-node rollout), no health thread, no HTTP server and no 30 s resync (a
resync pass that finds nothing new writes nothing). One process holding every agent's state
also has one heap of them all, whose full garbage collections cost per fleet what a real
agent's cost per node: so the benchmark collects its own garbage as the operator does
(``tessera.gctuning``) and freezes the fleet's heap once it is up (``gc.freeze``). It prints
the collector's seconds in the rollout, the operator's and its own.

On a machine of few cores the rollout is bound by CPU: the apiserver, etcd, the operator and
the fleet's agents share the cores (real agents would run on their own nodes). So it also prints
every process's CPU seconds from the policy to the last slice over the cores, a wall time no
orchestration can beat on this machine, and ``rollout/cpu-bound N=<n>: <ratio>x``: how far the
rollout is from it (the replays print their CPU too).

For the rollout and the fastest replay with the agents' writes it also prints the apiserver's
own counts (its /metrics: requests by verb and resource, watch events sent by kind) and its CPU
seconds in each replay: whether the rollout costs the apiserver more than the writes it must
make (extra reads, watchers), or only the same writes at another moment.

``--apiserver-pprof SECONDS`` turns the apiserver's profiling on and takes its Go CPU profile
for that long from the policy's apply, and again from the start of the fastest-concurrency
replay with the agents' writes (kept as ``/tmp/apiserver-{rollout,replay}-n<N>.pprof``), and
prints the hottest functions of each (``go tool pprof -top -cum``): where the rollout costs the
apiserver more than the same writes replayed.

``--history`` prints every SharingPolicy status the rollout went through (as a watch saw it).
``--profile DIR`` runs the first and the restarted operator of each N under cProfile and prints
their hottest functions (the profiles also land in DIR; cProfile slows them, so their figures
are not the benchmark's). Not a test: it prints figures and asserts nothing,
but says "FAIL" where a no-op resync wrote something.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import gc
import io
import itertools
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from tessera import DRIVER_NAME, INSTALL_NAMESPACE, RESOURCE_GROUP, RESOURCE_VERSION, gctuning
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.claimview import ClaimView, fence_claim_name
from tessera.agent.service import AgentConfig, NodeAgent
from tessera.controller.runtime import DEFAULT_HANDOVER_GRACE
from tessera.kube.claims import ASK_ANNOTATION, write_claim_check_answer, write_claim_fence
from tessera.kube.http import ApiError, KubeClient, resource_path
from tessera.kube.nodelayouts import GROUP, PLURAL, VERSION
from tessera.kube.watch import ListWatch
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import _die_with_parent, free_port
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tessera.log import configure_logging
from tessera.models.claimcheck import ClaimCheckAnswer
from tessera.tasks import cancel

ROOT = Path(__file__).resolve().parents[1]
LABEL = "tessera.dev/bench"
POLICY = "bench-all-balanced"
GPUS_PER_NODE = 8
EXCLUSIVE: tuple[str, ...] = ("gpu",)
ALL_BALANCED: tuple[str, ...] = ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")
MIG_POLICY = {  # what the rollout applies: every node, static MIG all-balanced
    "apiVersion": "tessera.dev/v1alpha1",
    "kind": "SharingPolicy",
    "metadata": {"name": POLICY},
    "spec": {"nodeSelector": {"matchLabels": {LABEL: "fleet"}}, "strategy": "MIG", "mig": {"preset": "all-balanced"}},
}
WRITES = "tessera_operator_api_writes_total"
CHECKS = "tessera_operator_claim_check_seconds"  # the agents' claim checks the operator answered
RECONCILED = 'tessera_operator_reconciles_total{result="ok"}'
FAILED = 'tessera_operator_reconciles_total{result="error"}'
PASSES = "tessera_operator_policy_status_passes_total"
SLICES = ("resource.k8s.io", "v1", "resourceslices")
PPROF_DIR = Path(tempfile.gettempdir())  # --apiserver-pprof's profiles stay here, for go tool pprof
MANAGED = "app.kubernetes.io/managed-by=tessera"

log = structlog.get_logger("bench")
T = TypeVar("T")
PASS_OF: contextvars.ContextVar[str | None] = contextvars.ContextVar("bench_agent_pass", default=None)


# -- helpers ----------------------------------------------------------------------------------


async def wait_until(predicate: Callable[[], Awaitable[T | None] | T | None], timeout: float, what: str,
                     interval: float = 0.25) -> T:
    """Poll ``predicate`` until it returns something truthy; TimeoutError names ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def watch_forever(api: KubeClient, group: str, version: str, plural: str,
                        on_event: Callable[[str, dict[str, Any]], None], label_selector: str | None = None) -> None:
    """Call ``on_event(type, object)`` for every watch event, restarting the watch when it ends
    from the last resourceVersion it passed on (at 1,000 nodes the apiserver ends a watch whose
    reader falls behind; begun afresh, it would pass every object on again as ADDED, which the
    floor's recording would take for writes). Only past a 410 Gone does it begin afresh."""
    last: str | None = None
    while True:
        try:
            async for kind, obj in api.watch(resource_path(group, version, plural), label_selector=label_selector,
                                             timeout_seconds=1800, resource_version=last):
                last = (obj.get("metadata") or {}).get("resourceVersion") or last
                on_event(kind, obj)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken watch is restarted, as the agent's is
            log.debug("watch ended; restarting it", plural=plural, error=str(exc))
            await asyncio.sleep(1.0)


def gc_seconds(metrics: dict[str, float] | None = None) -> float:
    """Seconds in the garbage collector (``tessera_gc_seconds_total``, every generation): of a
    process from its metrics, or of this one."""
    if metrics is None:
        return sum(sample.value for family in gctuning.GC_SECONDS.collect() for sample in family.samples
                   if sample.name.endswith("_total"))
    return sum(v for k, v in metrics.items() if k.startswith("tessera_gc_seconds_total{"))


def proc_status(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmHWM, VmRSS) in bytes; 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_by_child() -> dict[str, float]:
    """CPU seconds (user + system) of this process's children by name, and of this process."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        comm_end = stat.rindex(")")
        fields = stat[comm_end + 2:].split()
        if int(fields[1]) != me:
            continue
        name = stat[stat.index("(") + 1:comm_end]
        if name.startswith("python"):
            name = "operator" if b"operator" in cmdline else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    times = os.times()
    out["bench (fleet)"] = times.user + times.system
    return out


def apiserver_cpu(before: dict[str, float]) -> float:
    """kube-apiserver's CPU seconds since ``before`` (a :func:`cpu_by_child`)."""
    return cpu_by_child().get("kube-apiserver", 0.0) - before.get("kube-apiserver", 0.0)


def all_cpu(before: dict[str, float]) -> float:
    """CPU seconds since ``before`` of every process the benchmark runs (the control plane,
    the operators, this process with its fleet): on a machine of few cores, a phase cannot take
    less wall time than this over the cores."""
    after = cpu_by_child()
    return sum(after.get(k, 0.0) - before.get(k, 0.0) for k in after)


def writes_of(metrics: dict[str, float]) -> dict[str, int]:
    """``{'resourceslice/update': 800, ...}`` from the operator's counters (zeros left out)."""
    out: dict[str, int] = {}
    for key, value in metrics.items():
        if key.startswith(WRITES + "{") and value:
            out[key.split('what="', 1)[1].split('"', 1)[0]] = int(value)
    return out


def minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


def put_writes(fig: dict[str, str], title: str, writes: dict[str, int]) -> None:
    """A total row, then one row per kind of write."""
    fig[title] = str(sum(writes.values()))
    section = title.split(":", 1)[0]
    for kind, count in sorted(writes.items()):
        fig[f"  {section}: {kind}"] = str(count)


def apiserver_counts(cluster: LocalCluster) -> dict[str, float]:
    """The apiserver's own counters: requests by verb and resource (``PATCH nodelayouts/status``)
    and watch events sent by kind (``watch events ResourceSlice``), from its /metrics."""
    out: dict[str, float] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            key = f"{labels.get('verb', '?')} {labels.get('resource', '?')}{sub}"
        elif line.startswith("apiserver_watch_events_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
            key = f"watch events {labels.get('kind') or labels.get('resource', '?')}"
        else:
            continue
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def put_counts(fig: dict[str, str], title: str, after: dict[str, float], before: dict[str, float],
               top: int = 12) -> None:
    """The largest differences of :func:`apiserver_counts`, one row each."""
    changed = {k: int(v - before.get(k, 0.0)) for k, v in after.items() if v - before.get(k, 0.0) >= 1}
    fig[title] = f"{sum(v for k, v in changed.items() if not k.startswith('watch'))} requests"
    for key, count in sorted(changed.items(), key=lambda kv: -kv[1])[:top]:
        fig[f"  {title.split(':', 1)[0]}: {key}"] = str(count)


def fetch_profile(cluster: LocalCluster, seconds: int, out: Path) -> None:
    """The apiserver's Go CPU profile over the next ``seconds`` (it answers when they have passed)."""
    subprocess.run(["curl", "-sSf", "--cacert", str(cluster.ca_file), "-H", "@-",  # the token off argv
                    "-o", str(out), f"{cluster.server}/debug/pprof/profile?seconds={seconds}"],
                   input=f"Authorization: Bearer {cluster.token}\n", text=True, check=True, timeout=seconds + 60)


def print_pprof(cluster: LocalCluster, profile: Path, title: str, nodes: int = 40) -> None:
    """The hottest functions of a Go CPU profile, cumulative (``go tool pprof -top -cum``)."""
    top = subprocess.run(["go", "tool", "pprof", "-top", "-cum", f"-nodecount={nodes}",
                          str(cluster.binaries.kube_apiserver), str(profile)],
                         capture_output=True, text=True, check=True, timeout=120)
    print(f"-- {title} --\n{top.stdout}", flush=True)


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


# -- the agent fleet --------------------------------------------------------------------------


class AgentFleet:
    """Every node's agent in this one process: a real NodeAgent per node, one shared watch."""

    def __init__(self, api: KubeClient, nodes: list[str], simulate: str, concurrency: int) -> None:
        self.api = api
        self.agents = {
            name: NodeAgent(AgentConfig(name, metrics_port=None), SimulatedBackend.from_spec(name, simulate, None),
                            api)
            for name in nodes
        }
        for name, agent in self.agents.items():  # fed by the one claim watch below, not a watch each
            agent.claims = ClaimView(api, driver=DRIVER_NAME, node=name, fence_namespace=INSTALL_NAMESPACE,
                                     own_watch=False, relisting=lambda: self.claim_watch.relisting)
        self.claim_watch = ListWatch(api, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", self._on_claim,
                                     on_listed=self._relisted)
        self.passes = 0
        self.requests = 0  # API requests made inside agent passes (PASS_OF set), counted by count_requests
        self.recording = False
        self.observed: dict[str, int | None] = {}  # generation each node's last good pass reported
        self.gpus: dict[str, int] = {}
        self.failed_passes = 0
        self.concurrency = concurrency
        self.writes: RolloutWrites | None = None  # told every NodeLayout event, when set
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._retrying: set[str] = set()  # nodes whose last pass failed: the next reads afresh
        self._tasks: list[asyncio.Task[None]] = []

    def enqueue(self, name: str) -> None:
        if name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"fleet-{i}") for i in range(self.concurrency)]
        self._tasks.append(asyncio.create_task(self._watch(), name="fleet-watch"))
        self.claim_watch.start()
        for name in self.agents:
            self.enqueue(name)  # the first pass creates the NodeLayout (owned by its Node)

    async def stop(self) -> None:
        await self.claim_watch.stop()
        await cancel(*self._tasks)

    def _on_claim(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        name = str(meta.get("name", ""))
        if meta.get("namespace") == INSTALL_NAMESPACE and name.startswith("tessera-fence-"):
            agent = self.agents.get(name.removeprefix("tessera-fence-"))
            if agent is not None:
                agent.claims.feed(kind, body)
            return
        for agent in self.agents.values():
            agent.claims.feed(kind, body)

    def _relisted(self) -> None:
        for agent in self.agents.values():
            agent.claims.relisted()

    def count_requests(self) -> None:
        """Count every request the shared client sends from inside an agent pass."""
        send = self.api._send

        async def counted(*args: Any, **kwargs: Any) -> Any:
            if self.recording and PASS_OF.get() is not None:
                self.requests += 1
            return await send(*args, **kwargs)

        self.api._send = counted  # type: ignore[method-assign]

    def reported(self) -> int:
        """Nodes whose NodeLayout status lists every GPU."""
        return sum(1 for n in self.agents if self.gpus.get(n) == GPUS_PER_NODE)

    def status_writes(self) -> int:
        total = 0.0
        for agent in self.agents.values():
            total += agent.metrics.registry.get_sample_value("tessera_agent_status_writes_total") or 0.0
        return int(total)

    async def _work(self) -> None:
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            token = PASS_OF.set(name)  # the guard's fence runs on the loop in a task that copies this
            try:
                # The agent's own pass (it logs its errors), from the NodeLayout the watch
                # delivered, as NodeAgent.run's woken passes; a retry reads it afresh.
                status = await self.agents[name].reconcile_once(fresh=name in self._retrying)
            finally:
                PASS_OF.reset(token)
            if self.recording:
                self.passes += 1
            if status is None:
                self.failed_passes += 1
                self._retrying.add(name)
                asyncio.get_running_loop().call_later(1.0, self.enqueue, name)
                continue
            self._retrying.discard(name)
            self.observed[name] = status.observed_generation
            self.gpus[name] = len(status.gpus)

    async def _watch(self) -> None:
        await watch_forever(self.api, GROUP, VERSION, PLURAL, self._on_event)

    def _on_event(self, kind: str, body: dict[str, Any]) -> None:
        """One watch on every NodeLayout: a spec change (a new generation) wakes that node's
        agent, a status-only change (its own write) does not, as in ``NodeAgent._watch``."""
        meta = body.get("metadata", {})
        name = meta.get("name")
        if self.writes is not None:
            self.writes.layout_event(kind, body)
        if name in self.agents and self.agents[name].layout_seen(kind, body):  # as NodeAgent._layout_event
            self.enqueue(name)


# -- what the operator published --------------------------------------------------------------


@dataclass(frozen=True)
class SliceSummary:
    """One of our slices as the benchmark keeps it: its pool, the pool's generation and slice
    count as it states them, and its devices as (GPU index, kind: MIG profile or ``gpu``)."""

    pool: str
    generation: int
    count: int
    devices: tuple[tuple[int, str], ...]


class Published:
    """What the operator published, kept by watches: every ResourceSlice of ours summarised as
    (pool, sorted device kinds), and when the SharingPolicy last turned Ready with every GPU
    applied. ``last_slice_event`` times the slice that completed a rollout."""

    def __init__(self, api: KubeClient, policy: str, gpus: int) -> None:
        self.api = api
        self.policy, self.gpus = policy, gpus
        self.slices: dict[str, SliceSummary] = {}
        # Per ``expected`` asked of ``complete``: the nodes complete for it, and the pools whose
        # slices changed since (polled every 0.25 s over every node's slices, it took a sixth of
        # this process's CPU at 1,000 nodes, in the rollout it measures).
        self._by_pool: dict[str, dict[str, SliceSummary]] = {}
        self._done: dict[tuple[str, ...], set[str]] = {}
        self._changed: dict[tuple[str, ...], set[str]] = {}
        self.last_slice_event = 0.0
        self.policy_ready_at: float | None = None
        self.policy_history: list[tuple[float, str]] = []  # (when, "Ready=... reason gpusApplied/gpus")
        self.writes: RolloutWrites | None = None  # told every slice event, when set
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(watch_forever(self.api, *SLICES, self._on_slice, MANAGED)),
            asyncio.create_task(watch_forever(self.api, "tessera.dev", "v1alpha1", "sharingpolicies",
                                              self._on_policy)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel(task)

    def _on_slice(self, kind: str, body: dict[str, Any]) -> None:
        self.last_slice_event = time.monotonic()
        if self.writes is not None:
            self.writes.slice_event(kind, body)
        name = body.get("metadata", {}).get("name", "")
        before = self.slices.pop(name, None)
        if before is not None:
            self._by_pool.get(before.pool, {}).pop(name, None)
            for changed in self._changed.values():
                changed.add(before.pool)
        if kind == "DELETED":
            return
        spec = body.get("spec", {})
        pool = spec.get("pool", {})
        devices = tuple(
            (int(str(d["name"]).split("-")[1]), str(d.get("attributes", {}).get("migProfile", {}).get("string", "gpu")))
            for d in spec.get("devices") or []
        )
        summary = SliceSummary(str(pool.get("name", "")), int(pool.get("generation", 0)),
                               int(pool.get("resourceSliceCount", 0)), devices)
        self.slices[name] = summary
        self._by_pool.setdefault(summary.pool, {})[name] = summary
        for changed in self._changed.values():
            changed.add(summary.pool)

    def _on_policy(self, kind: str, body: dict[str, Any]) -> None:
        if body.get("metadata", {}).get("name") != self.policy:
            return
        status = body.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        summary = " ".join(
            f"{c.get('type')}={c.get('status')}/{c.get('reason')}" for c in status.get("conditions", [])
        ) + f" applied {status.get('gpusApplied')}/{status.get('gpus')}"
        if not self.policy_history or self.policy_history[-1][1] != summary:
            self.policy_history.append((time.monotonic(), summary))
        if kind != "DELETED" and ready and status.get("gpusApplied") == self.gpus and status.get("gpus") == self.gpus:
            if self.policy_ready_at is None:
                self.policy_ready_at = time.monotonic()
        else:
            self.policy_ready_at = None

    def complete(self, nodes: list[str], expected: tuple[str, ...]) -> int:
        """Nodes whose pool is whole (every slice of one generation, as many as each counts)
        and publishes, on each of its 8 GPUs, devices of exactly the kinds ``expected``."""
        done = self._done.get(expected)
        if done is None:
            done = self._done[expected] = set()
            pools = set(self._by_pool)
        else:
            pools = self._changed[expected]
        self._changed[expected] = set()
        for pool in pools:
            if self._pool_complete(list(self._by_pool.get(pool, {}).values()), expected):
                done.add(pool)
            else:
                done.discard(pool)
        return sum(1 for node in nodes if node in done)

    @staticmethod
    def _pool_complete(have: list[SliceSummary], expected: tuple[str, ...]) -> bool:
        if not have or {(s.generation, s.count) for s in have} != {(have[0].generation, len(have))}:
            return False
        per_gpu: dict[int, list[str]] = {}
        for s in have:
            for gpu, kind in s.devices:
                per_gpu.setdefault(gpu, []).append(kind)
        return sorted(per_gpu) == list(range(GPUS_PER_NODE)) and all(
            tuple(sorted(kinds)) == expected for kinds in per_gpu.values())


# -- the operator -----------------------------------------------------------------------------


OPERATOR_ENV: dict[str, str] = {}  # --operator-env: added to every operator's environment


def start_operator(processes: TesseraProcesses, name: str, profile: Path | None) -> TesseraProcess:
    """``python -m tessera operator`` as TesseraProcesses starts it, optionally under cProfile."""
    if profile is None:
        return processes.operator(name, env=OPERATOR_ENV)
    processes.folder.mkdir(parents=True, exist_ok=True)
    log_file = processes.folder / f"{name}.log"
    metrics, health = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(processes.cluster.kubeconfig), "TESSERA_LOG_JSON": "1",
           "TESSERA_LEASE_NAMESPACE": "default", **OPERATOR_ENV}
    argv = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "tessera", "operator",
            "--metrics-port", str(metrics), "--health-port", str(health)]
    with log_file.open("ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 preexec_fn=_die_with_parent)
    process = TesseraProcess(name, popen, log_file, metrics, health)
    processes.processes.append(process)
    return process


async def settle(process: TesseraProcess, quiet: float, timeout: float) -> dict[str, float]:
    """The operator's metrics once reconciles, status passes and writes stopped moving for ``quiet`` s."""
    def moving(m: dict[str, float]) -> tuple[float, ...]:
        return (m.get(RECONCILED, 0), m.get(FAILED, 0), m.get(PASSES, 0), sum(writes_of(m).values()))

    deadline = time.monotonic() + timeout
    last = await asyncio.to_thread(process.metrics)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await asyncio.to_thread(process.metrics)
        if moving(now) != moving(last) or not now:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return now
    raise TimeoutError(f"the operator did not go quiet within {timeout:.0f}s")


def stop_operator(processes: TesseraProcesses, process: TesseraProcess) -> None:
    process.stop(timeout=30)
    processes.processes.remove(process)
    print(stall_report(process), flush=True)


def print_profile(path: Path, top: int = 30) -> None:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    print(out.getvalue())


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Result:
    nodes: int
    figures: dict[str, str] = field(default_factory=dict)
    noop_ok: bool = True


def node_list(names: list[str]) -> str:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    items = [{
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, LABEL: "fleet"}},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "simulated node (no kubelet)", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
        },
    } for name in names]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


async def versions(api: KubeClient) -> dict[str, str]:
    out: dict[str, str] = {}
    for group, version, plural in (("tessera.dev", "v1alpha1", "nodelayouts"),
                                   ("resource.k8s.io", "v1", "resourceslices"),
                                   ("tessera.dev", "v1alpha1", "sharingpolicies")):
        for item in await api.list(resource_path(group, version, plural)):
            out[f"{plural}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


# -- the raw floor ----------------------------------------------------------------------------

Write = tuple[int, str, dict[str, Any]]  # (resourceVersion, "create" | "replace" | "delete" | "spec", body)


def slice_body(body: dict[str, Any]) -> dict[str, Any]:
    """A slice as a writer sends it: what the operator wrote, without the server's bookkeeping."""
    meta = body["metadata"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {k: meta[k] for k in ("name", "labels", "ownerReferences") if k in meta},
            "spec": body["spec"]}


class RolloutWrites:
    """The writes made to our ResourceSlices and to NodeLayout specs while ``recording``, as the
    watches saw them: one entry per write (a watch passes every write on), by node. Apart, in
    ``agents_by_node``, the agents' writes: each NodeLayout status write after the node's new
    spec, and the claim guard's check the pass made before it (replayed as its ask and the
    operator's answer: ``write_one``'s "fence")."""

    def __init__(self) -> None:
        self.recording = False
        self.by_node: dict[str, list[Write]] = {}
        self.agents_by_node: dict[str, list[Write]] = {}
        self._generations: dict[str, int] = {}
        self._slices: dict[str, int] = {}  # slice name -> the highest resourceVersion seen
        # When each node's GPUs were first seen tainted, its spec written, its status reported:
        # the rollout's phases (the last write of each, per node).
        self.phases: dict[str, dict[str, float]] = {"tainted": {}, "spec": {}, "status": {}, "published": {}}

    def slice_event(self, kind: str, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        version = int(body["metadata"]["resourceVersion"])
        known = self._slices.get(name)
        self._slices[name] = max(version, known or 0)
        if not self.recording or (known is not None and version <= known):
            return  # not recording, or a version seen already (a watch begun afresh passes it on again)
        node = str(body.get("spec", {}).get("pool", {}).get("name", ""))
        verb = {"ADDED": "create", "MODIFIED": "replace", "DELETED": "delete"}[kind]
        if verb == "create" and known is not None:
            verb = "replace"  # an ADDED for a slice that exists: a watch begun afresh after 410 Gone
        self.by_node.setdefault(node, []).append((version, verb, slice_body(body)))
        devices = body.get("spec", {}).get("devices") or []
        if any(d.get("taints") for d in devices):
            self.phases["tainted"][node] = time.monotonic()
        elif any("migProfile" in (d.get("attributes") or {}) for d in devices):
            self.phases["published"][node] = time.monotonic()  # the new layout, untainted

    def layout_event(self, kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata", {})
        name, generation = str(meta.get("name")), int(meta.get("generation") or 0)
        before = self._generations.get(name)
        self._generations[name] = generation
        if self.recording and kind == "MODIFIED" and before is not None and generation > before:
            self.by_node.setdefault(name, []).append((int(meta["resourceVersion"]), "spec", {"spec": body["spec"]}))
            self.phases["spec"][name] = time.monotonic()
        elif self.recording and kind == "MODIFIED" and name in self.phases["spec"]:
            self.phases["status"][name] = time.monotonic()
            version = int(meta["resourceVersion"])
            self.agents_by_node.setdefault(name, []).extend(
                [(version, "fence", {}), (version, "status", {"status": body.get("status") or {}})])

    def timeline(self, t0: float) -> str:
        """Seconds after ``t0`` by which half and all of the nodes were through each phase."""
        out = []
        for phase, times in self.phases.items():
            ordered = sorted(times.values())
            if ordered:
                out.append(f"{phase} {ordered[len(ordered) // 2] - t0:.1f}/{ordered[-1] - t0:.1f}")
        return ", ".join(out)

    def gaps(self) -> str:
        """Per node, the seconds between its phases, as median/90th percentile/max: tainted ->
        spec (the grace, its wave and the operator's queue), spec -> status (the agent's pass),
        status -> published (the operator's answer to it)."""
        out = []
        names = list(self.phases)
        for before, after in itertools.pairwise(names):
            gaps = sorted(self.phases[after][n] - self.phases[before][n]
                          for n in self.phases[after] if n in self.phases[before])
            if gaps:
                out.append(f"{before}->{after} {gaps[len(gaps) // 2]:.1f}/{gaps[len(gaps) * 9 // 10]:.1f}/"
                           f"{gaps[-1]:.1f}")
        return ", ".join(out)

    def count(self, with_agents: bool = False) -> dict[str, int]:
        out: dict[str, int] = {}
        for writes in self.writes(with_agents).values():
            for _, verb, _ in writes:
                out[verb] = out.get(verb, 0) + 1
        return out

    def writes(self, with_agents: bool = False) -> dict[str, list[Write]]:
        """Each node's writes in the order they were made (a fence just before its status write)."""
        nodes = self.by_node.keys() | (self.agents_by_node.keys() if with_agents else set())
        return {node: sorted(self.by_node.get(node, []) + (self.agents_by_node.get(node, []) if with_agents else []),
                             key=lambda w: (w[0], w[1] != "fence"))
                for node in nodes}


State = tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]  # (slices by name, NodeLayouts by node)


async def cluster_state(api: KubeClient) -> State:
    """(our slices by name, NodeLayout spec and status by node) as they are now."""
    slices = {s["metadata"]["name"]: slice_body(s) for s in await api.list(resource_path(*SLICES),
                                                                          label_selector=MANAGED)}
    layouts = {n["metadata"]["name"]: {"spec": n.get("spec") or {}, "status": n.get("status") or {}}
               for n in await api.list(resource_path(GROUP, VERSION, PLURAL))}
    return slices, layouts


async def write_one(api: KubeClient, verb: str, body: dict[str, Any], node: str) -> None:
    if verb == "spec":
        await api.patch(resource_path(GROUP, VERSION, PLURAL, node), body)
    elif verb == "status":
        await api.patch(resource_path(GROUP, VERSION, PLURAL, node, subresource="status"), body)
    elif verb == "fence":  # the claim guard's check: its ask on the node's fence claim, and the operator's answer
        token = f"floor-{time.monotonic_ns()}"
        await write_claim_fence(api, INSTALL_NAMESPACE, fence_claim_name(node), token, node=node, key=ASK_ANNOTATION)
        await write_claim_check_answer(api, INSTALL_NAMESPACE, fence_claim_name(node),
                                       ClaimCheckAnswer.of(token, node, ()).encode())
    elif verb == "create":
        await api.create(resource_path(*SLICES), body)
    elif verb == "replace":  # no resourceVersion: an unconditional update, as a sole owner may make
        await api.replace(resource_path(*SLICES, body["metadata"]["name"]), body)
    else:
        try:
            await api.delete(resource_path(*SLICES, body["metadata"]["name"]))
        except ApiError as exc:
            if exc.status != 404:
                raise


async def on_workers(concurrency: int, nodes: list[str], one: Callable[[str], Awaitable[None]]) -> None:
    """``one(node)`` for every node, ``concurrency`` nodes at a time."""
    queue = list(reversed(nodes))

    async def worker() -> None:
        while queue:
            await one(queue.pop())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def restore(api: KubeClient, state: State, concurrency: int) -> None:
    """Put every slice, NodeLayout spec and status back as they were in ``state``."""
    slices, layouts = state
    now, _ = await cluster_state(api)
    by_node: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, body in slices.items():
        by_node.setdefault(body["spec"]["pool"]["name"], []).append(("replace" if name in now else "create", body))
    for name, body in now.items():
        if name not in slices:
            by_node.setdefault(body["spec"]["pool"]["name"], []).append(("delete", body))
    for node, layout in layouts.items():
        by_node.setdefault(node, []).extend([("spec", {"spec": layout["spec"]}),
                                             ("status", {"status": layout["status"]})])

    async def one(node: str) -> None:
        for verb, body in by_node[node]:
            await write_one(api, verb, body, node)

    await on_workers(concurrency, sorted(by_node), one)


async def replay(api: KubeClient, writes: dict[str, list[Write]], concurrency: int) -> float:
    """Make the recorded writes again, each node's in order; seconds taken."""
    async def one(node: str) -> None:
        for _, verb, body in writes[node]:
            await write_one(api, verb, body, node)

    t = time.monotonic()
    await on_workers(concurrency, sorted(writes), one)
    return time.monotonic() - t


async def measure_restart(n: int, kube: KubeClient, processes: TesseraProcesses, operator: TesseraProcess,
                          profile: Path | None, phase_timeout: float, result: Result) -> None:
    """The no-op resync: stop ``operator``, start a new one, and count what it writes (must be
    nothing), how long until it has reconciled every node and made a status pass, and its peak RSS."""
    fig = result.figures
    rv_before = await versions(kube)
    stop_operator(processes, operator)
    if profile is not None:
        print(f"-- cProfile of the first operator (N={n}), {profile} --")
        print_profile(profile)
    t1 = time.monotonic()
    restart_profile = profile.with_name(f"operator-restarted-n{n}.prof") if profile is not None else None
    restarted = start_operator(processes, "operator-restarted", restart_profile)

    def reconciled() -> dict[str, float] | None:
        m = restarted.metrics()
        return m if m.get(RECONCILED, 0) >= n and m.get(PASSES, 0) >= 1 else None

    await wait_until(reconciled, phase_timeout, "the restarted operator to reconcile every node")
    fig["resync: start -> N reconciled + status pass"] = f"{time.monotonic() - t1:.1f}s"
    resynced = await settle(restarted, quiet=3.0, timeout=phase_timeout)
    rv_after = await versions(kube)
    changed = sorted(k for k in rv_after.keys() | rv_before.keys() if rv_after.get(k) != rv_before.get(k))
    writes = writes_of(resynced)
    result.noop_ok = not writes and not changed
    put_writes(fig, "resync: operator API writes (must be 0)", writes)
    if writes:
        fig["resync: operator API writes (must be 0)"] += " FAIL"
    fig["resync: objects changed (resourceVersion)"] = (
        f"{len(changed)} of {len(rv_after)}" + (f"  FAIL: {', '.join(changed[:5])}" if changed else "")
    )
    fig["resync: reconciles"] = f"{int(resynced.get(RECONCILED, 0))}"
    fig["operator peak RSS (VmHWM), restarted"] = mib(proc_status(restarted.popen.pid, "VmHWM"))
    fig["operator RSS once quiet (VmRSS), restarted"] = mib(proc_status(restarted.popen.pid, "VmRSS"))
    rss = proc_status(restarted.popen.pid, "VmHWM")
    print(f"restart N={n}: {sum(writes.values()):.0f} writes, {len(changed)} objects changed, ready "
          f"{fig['resync: start -> N reconciled + status pass']}, peak RSS {rss / 2**20:.0f} MiB "
          f"({rss / 1024 / n:.0f} KiB/node)", flush=True)
    stop_operator(processes, restarted)
    if restart_profile is not None:
        print(f"-- cProfile of the restarted operator (N={n}), {restart_profile} --")
        print_profile(restart_profile)


async def run_one(n: int, args: argparse.Namespace, workdir: Path) -> Result:
    result = Result(n)
    fig = result.figures
    phase_timeout = float(args.timeout)
    nodes = [f"bench-{i:05d}" for i in range(n)]  # 1,000 to 5,000 and more sort as they count
    gpus = n * GPUS_PER_NODE
    print(f"\n== N={n} nodes x {GPUS_PER_NODE} GPUs ({args.simulate}) ==", flush=True)

    started = time.monotonic()
    pprof = int(args.apiserver_pprof or 0)
    cluster = await asyncio.to_thread(LocalCluster.start, apiserver_args=("--profiling=true",) if pprof else ())
    processes = TesseraProcesses(cluster, workdir / f"n{n}")
    kube = KubeClient.from_environment(str(cluster.kubeconfig))  # for the fleet, the watches and the floor
    fleet: AgentFleet | None = None
    published = Published(kube, POLICY, gpus)
    rollout_writes = RolloutWrites()
    try:
        print(f"control plane up in {time.monotonic() - started:.1f}s", flush=True)
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml", ROOT / "manifests" / "namespace.yaml")
        t = time.monotonic()
        cluster.kubectl("create", "-o", "name", "-f", "-", input=node_list(nodes), timeout=phase_timeout)
        fig["create N Nodes (one kubectl create)"] = f"{time.monotonic() - t:.1f}s"

        t = time.monotonic()
        fleet = agents = AgentFleet(kube, nodes, args.simulate, args.concurrency)
        agents.writes = published.writes = rollout_writes
        agents.count_requests()
        agents.start()
        await wait_until(lambda: agents.reported() == n, phase_timeout,
                         "every NodeLayout to report its GPUs")
        # As each agent does at start (NodeAgent.run): its fence claim exists before its first pass.
        await asyncio.gather(*(a.claims.ensure_fence() for a in agents.agents.values()))
        fig["agent fleet: N NodeLayouts with 8 GPUs"] = f"{time.monotonic() - t:.1f}s"
        print(f"agent fleet ready: {n} NodeLayouts report {GPUS_PER_NODE} GPUs", flush=True)
        gc.collect()
        gc.freeze()  # the fleet's state is long-lived: no later collection walks it (unfrozen at the end)
        published.start()

        # The operator's first start: no policy, so every GPU becomes Exclusive and is published
        # (with --restart-layout mig, the policy is there first and every GPU is cut at once).
        first_layout, first_name = (ALL_BALANCED, "MIG") if args.restart_layout == "mig" else (EXCLUSIVE, "Exclusive")
        if args.restart_layout == "mig":
            cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(MIG_POLICY))
        profile = Path(args.profile) / f"operator-n{n}.prof" if args.profile else None
        t = time.monotonic()
        operator = start_operator(processes, "operator", profile)
        await wait_until(lambda: published.complete(nodes, first_layout) == n, phase_timeout,
                         f"the operator to publish every node's {first_name} GPUs")
        fig[f"first start: all {first_name} slices published"] = f"{time.monotonic() - t:.1f}s"
        before = await settle(operator, quiet=3.0, timeout=phase_timeout)
        put_writes(fig, "first start: operator API writes", writes_of(before))
        print(f"operator published {n * GPUS_PER_NODE} {first_name} GPUs", flush=True)
        if args.restart_only:  # no rollout, no floor: restart over the fleet as it is
            fig["operator peak RSS (VmHWM), first start"] = mib(proc_status(operator.popen.pid, "VmHWM"))
            await measure_restart(n, kube, processes, operator, profile, phase_timeout, result)
            fig["bench process peak RSS (fleet + watch)"] = mib(proc_status(os.getpid(), "VmHWM"))
            fig["fleet failed passes"] = f"{fleet.failed_passes}"
            return result
        print("applying the policy", flush=True)

        # The policy rollout.
        state_before = await cluster_state(kube)
        counts_before = apiserver_counts(cluster)
        cpu_before = cpu_by_child()
        gc_before = gc_seconds()
        fleet_writes = fleet.status_writes()
        rollout_writes.recording = True
        fleet.recording = True
        profiles: list[tuple[str, Path, asyncio.Task[None]]] = []  # (what, where, its fetch)

        def profile_apiserver(what: str, path: Path) -> None:
            profiles.append((what, path, asyncio.create_task(asyncio.to_thread(fetch_profile, cluster, pprof, path))))

        if pprof:
            profile_apiserver("the rollout", PPROF_DIR / f"apiserver-rollout-n{n}.pprof")
        t0 = time.monotonic()
        cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(MIG_POLICY))
        published_at: float | None = None
        cpu_to_published: float | None = None

        def rolled_out() -> bool:
            nonlocal published_at, cpu_to_published
            if published_at is None and published.complete(nodes, ALL_BALANCED) == n:
                published_at = published.last_slice_event  # the event that completed it
                cpu_to_published = all_cpu(cpu_before)  # polled: up to a poll's CPU after it
            return published_at is not None and published.policy_ready_at is not None

        await wait_until(rolled_out, phase_timeout, "every node to publish the MIG layout and the policy to be Ready")
        ready_at = published.policy_ready_at
        assert published_at is not None
        assert ready_at is not None
        after = await settle(operator, quiet=3.0, timeout=phase_timeout)
        rollout_writes.recording = False
        fleet.recording = False
        fences = sum(a.claims.fences for a in fleet.agents.values())
        asks = sum(a.claims.asks for a in fleet.agents.values())
        per_pass = fleet.requests / fleet.passes if fleet.passes else 0.0
        fig["policy: agent passes / requests in them"] = (f"{fleet.passes} / {fleet.requests} "
                                                          f"({asks} claim checks asked, {fences} fences)")
        fig["agent requests per pass"] = f"{per_pass:.1f}"
        proofs = asks + fences
        proof_s = sum(a.claims.proof_seconds for a in fleet.agents.values())
        fig["policy: agent claim check, ask -> answer (or fence -> echo), mean"] = (
            f"{proof_s / proofs * 1000:.0f} ms over {proofs}" if proofs else "none")
        print(f"agent requests per pass N={n}: {per_pass:.1f}", flush=True)
        quiet_at = time.monotonic() - 3.0
        cpu_after = cpu_by_child()
        put_counts(fig, "policy: apiserver requests and watch events", apiserver_counts(cluster), counts_before)
        fig["policy -> all 8N slices show MIG layout"] = f"{published_at - t0:.1f}s"
        fig["policy -> Ready, gpusApplied == 8N"] = f"{ready_at - t0:.1f}s"
        fig["policy -> operator quiet"] = f"{quiet_at - t0:.1f}s"
        fig["policy: phases, s to half/all nodes"] = rollout_writes.timeline(t0)
        fig["policy: per-node gaps, s p50/p90/max"] = rollout_writes.gaps()
        put_writes(fig, "policy: operator API writes", minus(writes_of(after), writes_of(before)))
        answered = after.get(CHECKS + "_count", 0) - before.get(CHECKS + "_count", 0)
        answer_s = after.get(CHECKS + "_sum", 0) - before.get(CHECKS + "_sum", 0)
        fig["policy: operator, ask arrived -> answer written, mean"] = (
            f"{answer_s / answered * 1000:.0f} ms over {answered:.0f}" if answered else "none")
        fig["policy: operator reconciles (ok/error)"] = (
            f"{int(after.get(RECONCILED, 0) - before.get(RECONCILED, 0))}"
            f"/{int(after.get(FAILED, 0) - before.get(FAILED, 0))}"
        )
        events = json.loads(cluster.kubectl("get", "events", "-n", "default", "-o", "json").stdout)["items"]
        reasons: dict[str, int] = {}
        for event in events:
            if event.get("involvedObject", {}).get("kind") == "SharingPolicy":
                reason = str(event.get("reason", ""))
                reasons[reason] = reasons.get(reason, 0) + int(event.get("count") or 1)
        if args.history:
            print("SharingPolicy status as the watch saw it (s after applying):")
            for when, summary in published.policy_history:
                print(f"  {when - t0:7.2f}  {summary}")
        fig["policy: Events by reason"] = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "0"
        fig["policy: SharingPolicy status passes"] = f"{int(after.get(PASSES, 0) - before.get(PASSES, 0))}"
        fig["policy: agent status writes (fleet)"] = f"{fleet.status_writes() - fleet_writes}"
        cpu = {k: cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0) for k in cpu_after}
        fig["policy: garbage collector CPU s (operator/fleet)"] = (
            f"{gc_seconds(after) - gc_seconds(before):.1f}/{gc_seconds() - gc_before:.1f}")
        fig["policy: CPU s (operator/apiserver/etcd/fleet)"] = (
            f"{cpu.get('operator', 0):.1f}/{cpu.get('kube-apiserver', 0):.1f}/{cpu.get('etcd', 0):.1f}"
            f"/{cpu.get('bench (fleet)', 0):.1f}"
        )
        # What the machine's cores allow: every process's CPU from the policy to the last slice
        # over the cores is a wall time no orchestration can beat here (the fleet's agents, whose
        # work real nodes would do elsewhere, run on these cores too).
        assert cpu_to_published is not None
        cores = os.cpu_count() or 1
        bound = cpu_to_published / cores
        fig["policy -> last slice: CPU s of every process / cores"] = (
            f"{cpu_to_published:.1f} / {cores} = {bound:.1f}s (rollout {(published_at - t0) / bound:.2f}x that)")
        fig["operator peak RSS (VmHWM), first run"] = mib(proc_status(operator.popen.pid, "VmHWM"))

        # The no-op resync: a new operator process finds everything as it should be.
        await measure_restart(n, kube, processes, operator, profile, phase_timeout, result)
        fig["bench process peak RSS (fleet + watch)"] = mib(proc_status(os.getpid(), "VmHWM"))
        fig["fleet failed passes"] = f"{fleet.failed_passes}"

        # The raw floor: the rollout's slice and spec writes again, with nothing else running.
        await published.stop()
        await fleet.stop()
        counted = rollout_writes.count()
        fig["floor: rollout's writes replayed"] = (
            f"{sum(counted.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(counted.items())) + ")"
        )
        floors = []
        concurrencies = [int(c) for c in str(args.floor_concurrency).split(",")]
        for concurrency in concurrencies:
            await restore(kube, state_before, concurrency)
            cpu_before = cpu_by_child()
            floors.append(await replay(kube, rollout_writes.writes(), concurrency))
            fig[f"floor: same writes raw, {concurrency} nodes at once"] = (
                f"{floors[-1]:.1f}s (apiserver CPU {apiserver_cpu(cpu_before):.1f} s, all {all_cpu(cpu_before):.1f} s)")
        # The floor as issue 22 defines it: the minimal writes, plus one handover grace (a rollout
        # can share one grace among every node, never skip it).
        floor = min(floors) + DEFAULT_HANDOVER_GRACE
        fig["floor: fastest + one handover grace"] = f"{floor:.1f}s"
        ratio = (published_at - t0) / floor
        fig["rollout (all slices MIG) / floor"] = f"{ratio:.2f}x"
        # The same with the agents' writes, which no rollout can leave out (each node's status
        # write and the fence before it): what the operator's orchestration adds on top of both.
        counted = rollout_writes.count(with_agents=True)
        fig["floor+agents: writes replayed"] = (
            f"{sum(counted.values())} (" + ", ".join(f"{k} {v}" for k, v in sorted(counted.items())) + ")"
        )
        with_agents = []
        for concurrency in concurrencies:
            await restore(kube, state_before, concurrency)
            cpu_before, counts_before = cpu_by_child(), apiserver_counts(cluster)
            if pprof and concurrency == max(concurrencies):
                profile_apiserver("the replay with the agents' writes", PPROF_DIR / f"apiserver-replay-n{n}.pprof")
            with_agents.append(await replay(kube, rollout_writes.writes(with_agents=True), concurrency))
            fig[f"floor+agents: raw, {concurrency} nodes at once"] = (
                f"{with_agents[-1]:.1f}s (apiserver CPU {apiserver_cpu(cpu_before):.1f} s, "
                f"all {all_cpu(cpu_before):.1f} s)")
            if concurrency == concurrencies[-1]:
                put_counts(fig, "floor+agents: apiserver requests and watch events", apiserver_counts(cluster),
                           counts_before)
        floor_agents = min(with_agents) + DEFAULT_HANDOVER_GRACE
        fig["rollout / floor with the agents' writes"] = f"{(published_at - t0) / floor_agents:.2f}x"
        print(f"rollout/floor N={n}: {ratio:.2f}x (rollout {published_at - t0:.1f} s, floor {floor:.1f} s)",
              flush=True)
        print(f"rollout/floor with the agents' writes N={n}: {(published_at - t0) / floor_agents:.2f}x "
              f"(floor {floor_agents:.1f} s)", flush=True)
        print(f"rollout/cpu-bound N={n}: {(published_at - t0) / bound:.2f}x "
              f"({cpu_to_published:.1f} CPU s of every process over {cores} cores = {bound:.1f} s)", flush=True)
        for what, path, task in profiles:
            await task
            print_pprof(cluster, path, f"the apiserver's CPU over {pprof} s of {what}, N={n}")
        return result
    except BaseException:
        for process in processes.processes:
            print(f"-- {process.name} log ends --\n{process.tail(20)}", file=sys.stderr)
        raise
    finally:
        for process in processes.processes:
            print(stall_report(process), flush=True)
        await published.stop()
        if fleet is not None:
            await fleet.stop()
        processes.stop_all()
        await kube.close()
        await asyncio.to_thread(cluster.stop)
        gc.unfreeze()


def stall_report(process: TesseraProcess) -> str:
    """The operator's event-loop stalls (``tessera.controller.stallwatch``) from its log: how
    many, the longest, and the stack the watch saw during the longest that was caught in time."""
    ended: list[float] = []
    stacks: list[tuple[float, str]] = []
    with contextlib.suppress(OSError):
        for line in process.log.read_text(errors="replace").splitlines():
            if "event loop stall" not in line:
                continue
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "event loop stall ended":
                    ended.append(float(entry["seconds"]))
                elif entry.get("event") == "event loop stalled":
                    stacks.append((float(entry["seconds"]), str(entry.get("stack", ""))))
    if not ended:
        return f"{process.name}: no event-loop stall over the watch's threshold"
    text = (f"{process.name}: {len(ended)} event-loop stalls, longest {max(ended):.1f} s, "
            f"{sum(ended):.1f} s in all")
    if stacks:
        text += "\n  stack seen during a stall (innermost last):\n" + "\n".join(
            "    " + row for row in max(stacks)[1].splitlines()[-24:])
    return text


def print_table(results: list[Result]) -> None:
    if not results:
        return
    rows = list(dict.fromkeys(k for r in results for k in r.figures))
    head = ["N nodes (x 8 GPUs)"] + [str(r.nodes) for r in results]
    width0 = max(len(head[0]), *(len(k) for k in rows))
    widths = [max(len(head[i + 1]), *(len(r.figures.get(k, "-")) for k in rows)) for i, r in enumerate(results)]
    print()
    print(f"{head[0]:<{width0}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(head[1:], widths, strict=True)))
    print("-" * (width0 + sum(w + 2 for w in widths)))
    for key in rows:
        cells = [r.figures.get(key, "-") for r in results]
        print(f"{key:<{width0}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))


async def run(args: argparse.Namespace) -> int:
    # A fleet pass applies its layout in a worker thread (``asyncio.to_thread``), as the agent
    # does: a thread for each concurrent pass, or the default pool (a few threads) caps the
    # fleet. Set before anything starts and never replaced: the control plane's processes die
    # with the thread that started them (PR_SET_PDEATHSIG), and a replaced pool's threads end.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max(8, args.concurrency) + 4))
    counts = [int(x) for x in str(args.nodes).split(",") if x.strip()]
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        for n in counts:
            try:
                results.append(await asyncio.wait_for(run_one(n, args, Path(tmp)), timeout=args.timeout * 6))
            except (TimeoutError, RuntimeError, OSError) as exc:
                print(f"N={n} did not finish: {exc}", file=sys.stderr)
                break
    print("\nAgents: one in-process fleet running the real NodeAgent.reconcile_once per node (apply_layout on a")
    print("SimulatedBackend, build_status, status subresource write); only the per-process plumbing differs.")
    print("Operator: a real `python -m tessera operator` process; writes are its own api_writes counters.")
    print_table(results)
    return 0 if results and all(r.noop_ok for r in results) and len(results) == len(counts) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10,100,500", help="comma-separated node counts (default 10,100,500)")
    parser.add_argument("--simulate", default=f"{GPUS_PER_NODE}xH100-80GB", help="each node's GPUs (8 of them)")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="agent passes at once in the fleet (default 64: a pass mostly waits for the operator's "
                        "answer to its claim check, and real agents do not wait for each other)")
    parser.add_argument("--floor-concurrency", default="8,16,32",
                        help="nodes written at once for the raw floor, comma-separated: each is timed and the "
                        "fastest is the floor (default 8,16,32)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each phase may take")
    parser.add_argument("--restart-only", action="store_true",
                        help="only the first start (every GPU Exclusive) and the no-op restart: no policy rollout, "
                        "no floor (the sizes a full run cannot reach in time)")
    parser.add_argument("--restart-layout", choices=("exclusive", "mig"), default="exclusive",
                        help="with --restart-only: the fleet the restart finds, every GPU Exclusive (no policy) "
                        "or MIG all-balanced (the policy applied before the operator's first start)")
    parser.add_argument("--operator-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the operators' environment (an allocator setting to compare); repeatable")
    parser.add_argument("--apiserver-pprof", type=int, default=0, metavar="SECONDS",
                        help="take the apiserver's CPU profile for SECONDS of the rollout and of a replay")
    parser.add_argument("--history", action="store_true", help="print the SharingPolicy status history")
    parser.add_argument("--profile", default=None,
                        help="run the first and the restarted operator under cProfile, profiles here")
    args = parser.parse_args()
    if args.restart_layout != "exclusive" and not args.restart_only:
        parser.error("--restart-layout is the fleet a --restart-only run restarts over; the full run rolls out "
                     "from Exclusive itself")
    for item in args.operator_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--operator-env takes NAME=VALUE, not {item!r}")
        OPERATOR_ENV[name] = value
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    configure_logging("warning")
    gctuning.tune()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
