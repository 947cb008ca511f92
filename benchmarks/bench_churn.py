"""The long run (issue #21, item 6): policy edits, claims and kills at up to 100 cheap nodes for
up to two hours, with the operator's and one agent's resident memory sampled after a warm-up, to
show whether either grows (the bar: less than 5% an hour).

    .venv/bin/python benchmarks/bench_churn.py [--nodes 100] [--minutes 65] [--warmup 300] [--seed 1]
        [--variant NAME[:ENV=VALUE,...]] ...

Starts its own control plane. The operator and two agents are real processes (``python -m
tessera``): one agent is sampled, the other is the one the churn kills. Every other node's agent
runs in this process (``bench_operator.AgentFleet``: 100 agent processes do not fit a 2-core
machine). The churn, seeded: the SharingPolicy over every node switches between time-slicing
(2-6 replicas) and a MIG layout; pending ResourceClaims are created and deleted; the
kube-apiserver is SIGKILLed and started again, and the victim agent killed and restarted, every
``--kill-every`` seconds. After ``--warmup`` s, VmRSS of the operator and of the sampled agent is
read every ``--sample-every`` s, and a progress line printed every five minutes (a run cut short
still says what it saw). Printed at the end: the first and last sample, the growth, a
least-squares slope, and one ``VERDICT`` line per process: growth per hour from the first to the
last sample after the warm-up (the figure the bar is about) and the slope per hour beside it,
PASS below 5%/h. Under an hour either is an extrapolation, and says so. Then whether any watch
was left stuck: one last policy edit, and how long until every sampled agent's NodeLayout has
the new spec from the operator and the agent's status reports it (``SETTLED`` in seconds, well
under the agents' 30 s resync when both watches deliver; ``STUCK`` after 120 s), and how many
times each process reopened a watch that had been silent for the idle bound.

Each ``--variant`` adds one more sampled agent on a node of its own, started through
``traced_tessera`` (which writes its malloc arenas, thread count and RSS to ``<name>.trace`` in
the run's folder, kept with ``--keep``) with the given environment added to the agent's own
(``AGENT_ENVIRONMENT``), ``-ENV`` unsetting one of those: e.g. ``arena2:MALLOC_ARENA_MAX=2``,
``plain:`` (as the product, with the witness) or ``dynamic:-MALLOC_MMAP_THRESHOLD_`` (glibc's
default, moving mmap threshold): an allocator setting compared against the same churn, side by side.
Not for: invariants under faults (``fault_campaign.py``) or rollout speed (``bench_operator.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench_operator's agent fleet lives beside this file

from benchmarks.bench_operator import LABEL, AgentFleet, node_list, proc_status  # noqa: E402

from tessera import RESOURCE_API_VERSION  # noqa: E402 (after the path above)
from tessera.kube.http import ApiError, KubeClient, resource_path  # noqa: E402
from tessera.kube.nodelayouts import get_node_layout  # noqa: E402
from tessera.localcluster import LocalCluster  # noqa: E402
from tessera.localcluster.cluster import wait_for  # noqa: E402
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses  # noqa: E402

SIMULATE = "1xH100-80GB"
POLICY = "churn"
NAMESPACE = "churn"
MIG = {"strategy": "MIG", "mig": {"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}}
MIB = 2**20


def policy_spec(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.3:
        return MIG
    return {"strategy": "TimeSlicing", "timeSlicing": {"replicas": rng.randint(2, 6)}}


def slope_per_hour(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, bytes), in bytes per hour."""
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    return 3600 * sum((t - mean_t) * (v - mean_v) for t, v in samples) / var


class Churn:
    def __init__(self, cluster: LocalCluster, processes: TesseraProcesses, api: KubeClient, seed: int) -> None:
        self.cluster, self.processes, self.api = cluster, processes, api
        self.rng = random.Random(seed)
        self.claims: list[str] = []
        self.counts: dict[str, int] = {}
        self.failed = 0  # actions refused (mostly: the apiserver was down)

    def count(self, action: str) -> None:
        self.counts[action] = self.counts.get(action, 0) + 1

    async def edit_policy(self, spec: dict[str, Any] | None = None) -> None:
        body = {"apiVersion": "tessera.dev/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": POLICY},
                "spec": {"nodeSelector": {"matchLabels": {LABEL: "fleet"}}, **(spec or policy_spec(self.rng))}}
        await self.api.patch(resource_path("tessera.dev", "v1alpha1", "sharingpolicies", POLICY), body, "apply",
                             field_manager="bench-churn", force=True)
        self.count("edit-policy")

    async def claim(self) -> None:
        path = resource_path("resource.k8s.io", RESOURCE_API_VERSION.split("/")[1], "resourceclaims",
                             namespace=NAMESPACE)
        if len(self.claims) >= 20 or (self.claims and self.rng.random() < 0.4):
            name = self.claims.pop(self.rng.randrange(len(self.claims)))
            with contextlib.suppress(ApiError):
                await self.api.delete(f"{path}/{name}")
            self.count("delete-claim")
            return
        name = f"c-{self.rng.getrandbits(32):08x}"
        await self.api.create(path, {
            "apiVersion": RESOURCE_API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
        })
        self.claims.append(name)
        self.count("create-claim")

    async def kill(self, victim: str) -> None:
        await asyncio.to_thread(self.cluster.kill_apiserver)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        await asyncio.to_thread(self.cluster.start_apiserver)
        self.count("kill-apiserver")
        old = next(p for p in self.processes.processes if p.name == f"agent-{victim}")
        old.kill()
        self.processes.processes.remove(old)
        self.processes.agent(victim, SIMULATE)
        self.count("kill-agent")

    async def step(self, victim: str) -> None:
        try:
            if self.rng.random() < 0.3:
                await self.edit_policy()
            else:
                await self.claim()
        except Exception:  # the apiserver may be coming back; the churn goes on
            self.failed += 1


FINAL_SPEC = {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 8}}  # one the churn never writes


async def settle(api: KubeClient, churn: Churn, nodes: list[str], timeout: float = 120.0) -> float | None:
    """After the churn, one last policy edit: seconds until the operator has written a new spec
    into each of ``nodes``' NodeLayouts and each node's agent has reported it (observedGeneration);
    None if that takes longer than ``timeout``. Well under the agents' 30 s resync, it shows that
    the operator's and the agents' watches were all still delivering after the churn."""

    async def generations(node: str) -> tuple[int, int]:
        layout = await get_node_layout(api, node) or {}
        status = layout.get("status") or {}
        return int((layout.get("metadata") or {}).get("generation") or 0), int(status.get("observedGeneration") or -1)

    before = {node: (await generations(node))[0] for node in nodes}
    await churn.edit_policy(FINAL_SPEC)
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        now = {node: await generations(node) for node in nodes}
        if all(spec > before[node] and seen == spec for node, (spec, seen) in now.items()):
            return time.monotonic() - start
        await asyncio.sleep(0.5)
    return None


def watch_silences(process: TesseraProcess) -> int:
    """How many times the process reopened a watch that had heard nothing for the idle bound."""
    try:
        return process.log.read_text(errors="replace").count("watch silent; reopening")
    except OSError:
        return 0


def rss(process: TesseraProcess) -> int:
    return proc_status(process.popen.pid, "VmRSS")


BAR_PERCENT_PER_HOUR = 5.0


def verdict(who: str, points: list[tuple[float, int]]) -> str:
    """The line a script checks: growth per hour after the warm-up, first to last and by slope."""
    (t0, first), (t1, last) = points[0], points[-1]
    hours = (t1 - t0) / 3600
    growth = 100 * (last - first) / first / hours if hours > 0 else 0.0
    slope = 100 * slope_per_hour(points) / first
    passed = growth < BAR_PERCENT_PER_HOUR
    # An hour's run keeps its first sample after the warm-up: 59.7 min of samples is an hour measured.
    measured = f"measured over {60 * hours:.1f} min" if hours >= 0.95 else f"extrapolated from {60 * hours:.0f} min"
    return (f"VERDICT {who}: {first / MIB:.1f} -> {last / MIB:.1f} MiB, {growth:+.1f}%/h first-to-last "
            f"({measured}), least-squares {slope:+.1f}%/h; bar <{BAR_PERCENT_PER_HOUR:.0f}%/h: "
            f"{'PASS' if passed else 'FAIL'}")


def keep_files(folder: Path, kept: Path) -> None:
    """The processes' logs and the variants' traces, copied out of the run's folder."""
    kept.mkdir(parents=True, exist_ok=True)
    for path in [*folder.glob("*.trace"), *folder.glob("*.log")]:
        (kept / path.name).write_bytes(path.read_bytes())


def parse_variant(text: str) -> tuple[str, dict[str, str | None]]:
    """NAME[:ENV=VALUE,-ENV,...]: ``-ENV`` unsets what the agent's launch would set."""
    name, _, assignments = text.partition(":")
    env: dict[str, str | None] = {}
    for assignment in filter(None, assignments.split(",")):
        if assignment.startswith("-") and len(assignment) > 1 and "=" not in assignment:
            env[assignment[1:]] = None
            continue
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--variant {text!r}: write NAME or NAME:ENV=VALUE[,-ENV,...]")
        env[key] = value
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", name):  # it names a Node: agent-<name>
        raise argparse.ArgumentTypeError(f"--variant {text!r}: the name must be lower-case letters, digits "
                                         "and '-' (it becomes a Node's name), e.g. arena2")
    return name, env


async def run(args: argparse.Namespace) -> int:
    fleet_nodes = [f"fleet-{i:03d}" for i in range(args.nodes - 2)]
    sampled, victim = "agent-sampled", "agent-victim"
    with LocalCluster.start() as cluster, tempfile.TemporaryDirectory(prefix="tessera-churn-") as folder:
        cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
        cluster.kubectl("create", "namespace", NAMESPACE)
        processes = TesseraProcesses(cluster, Path(folder))
        api = KubeClient.from_environment(str(cluster.kubeconfig))
        fleet: AgentFleet | None = None
        try:
            operator = processes.operator()
            cluster.kubectl("apply", "-f", "-", input=node_list(fleet_nodes))
            for name in (sampled, victim):
                cluster.add_node(name, labels={LABEL: "fleet"})
            agent = processes.agent(sampled, SIMULATE)
            processes.agent(victim, SIMULATE)
            variants: dict[str, TesseraProcess] = {}
            for name, env in args.variant:
                cluster.add_node(f"agent-{name}", labels={LABEL: "fleet"})
                trace = Path(folder) / f"{name}.trace"
                variants[name] = processes.agent(f"agent-{name}", SIMULATE, module="benchmarks.traced_tessera",
                                                 env={"TESSERA_TRACE_OUT": str(trace), **env})
            fleet = AgentFleet(api, fleet_nodes, SIMULATE, concurrency=8)
            fleet.start()
            churn = Churn(cluster, processes, api, args.seed)
            await wait_for(lambda: operator.role() == "leader", timeout=60, message="the operator to lead")
            await churn.edit_policy()
            print(f"{args.nodes} nodes ({len(fleet_nodes)} in-process, 2 agent processes); "
                  f"churn for {args.minutes} min, warm-up {args.warmup} s, seed {args.seed}", flush=True)
            start = time.monotonic()
            end = start + args.minutes * 60
            next_kill = start + args.kill_every
            next_sample = start + args.warmup
            sampled_processes = {"operator": operator, "agent": agent,
                                 **{f"agent-{name}": p for name, p in variants.items()}}
            samples: dict[str, list[tuple[float, int]]] = {who: [] for who in sampled_processes}
            next_progress = start + args.warmup + 300
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_kill:
                    await churn.kill(victim)
                    next_kill = time.monotonic() + args.kill_every
                if now >= next_sample:
                    for who, process in sampled_processes.items():
                        if process.alive():  # a dead one keeps the samples it had
                            samples[who].append((now - start, rss(process)))
                    next_sample += args.sample_every
                if now >= next_progress:
                    print(f"[{(now - start) / 60:.0f} min] " + ", ".join(
                        f"{who} {pts[0][1] / MIB:.1f}->{pts[-1][1] / MIB:.1f} MiB" for who, pts in samples.items()
                        if pts) + f"; {churn.failed} refused", flush=True)
                    next_progress += 300
                await churn.step(victim)
                await asyncio.sleep(churn.rng.uniform(0.2, 1.0))
            dead = [who for who, process in sampled_processes.items() if not process.alive()]
            for who in dead:
                print(f"DIED {who}: its log's last lines:\n{sampled_processes[who].tail(15)}")
            nodes = {"agent": sampled, **{f"agent-{name}": f"agent-{name}" for name in variants}}  # who -> node
            settled = await settle(api, churn, [node for who, node in nodes.items() if who not in dead])
            print(f"SETTLED: the last policy edit reached every sampled agent's NodeLayout and its status in "
                  f"{settled:.1f} s" if settled is not None else "STUCK: the last policy edit did not reach every "
                  "sampled agent's NodeLayout status in 120 s")
            print("watch silences (a watch reopened after 90 s without a word): " + ", ".join(
                f"{who} {watch_silences(process)}" for who, process in sampled_processes.items()))
            print("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(churn.counts.items()))
                  + f"; {churn.failed} refused (apiserver down); fleet passes failed {fleet.failed_passes}")
            for who, points in samples.items():
                if len(points) < 2:
                    print(f"{who}: too few samples after the warm-up ({len(points)}); run longer")
                    continue
                (t0, first), (t1, last) = points[0], points[-1]
                per_hour = slope_per_hour(points)
                print(f"{who} VmRSS: {first / MIB:.1f} MiB at {t0:.0f} s -> {last / MIB:.1f} MiB at {t1:.0f} s "
                      f"({100 * (last - first) / first:+.1f}% over {(t1 - t0) / 60:.1f} min, {len(points)} samples); "
                      f"slope {per_hour / MIB:+.1f} MiB/h = {100 * per_hour / first:+.1f}%/h EXTRAPOLATED "
                      f"from {(t1 - t0) / 60:.1f} min")
            print(json.dumps({who: [(round(t), v // 1024) for t, v in pts] for who, pts in samples.items()}))
            for who, points in samples.items():
                if who in dead:
                    print(f"VERDICT {who}: died during the run; FAIL")
                elif len(points) >= 2:
                    print(verdict(who, points))
            return 1 if dead or settled is None else 0
        finally:
            if args.keep:  # first: what follows may fail (the apiserver may be down this very moment)
                keep_files(Path(folder), Path(args.keep))
            try:
                if fleet is not None:
                    await fleet.stop()
            except Exception as exc:  # an in-process agent's last request met a killed apiserver
                print(f"(the in-process fleet stopped with an error: {exc!r})")
            await api.close()
            processes.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20, help="nodes in all, 3..100 (2 are agent processes)")
    parser.add_argument("--minutes", type=float, default=4.0, help="how long the churn runs (at most 120)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of churn before the first sample")
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--kill-every", type=float, default=45.0, help="seconds between apiserver+agent kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        help="one more sampled agent, traced, with this environment: NAME[:ENV=VALUE,...]")
    parser.add_argument("--keep", help="a folder to copy the processes' logs and the variants' traces into")
    args = parser.parse_args()
    if not 3 <= args.nodes <= 100:
        parser.error("--nodes must be between 3 and 100")
    if not 0 < args.minutes <= 120:
        parser.error("--minutes must be more than 0 and at most 120")
    if args.warmup >= args.minutes * 60:
        parser.error("--warmup must be shorter than the run (--minutes)")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
