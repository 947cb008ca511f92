"""A seeded fault campaign against the real control plane: policy churn (create, edit, delete,
priority flips; an Adaptive policy among the layouts, with claims for 3g slices that only a
recut serves, and claims for both GPUs of a node, for which Adaptive keeps the node tainted)
while claims are created, allocated by the real scheduler and released, and the operator, the
node agents and the kube-apiserver are killed (SIGKILL) and restarted at random points. Two
operator replicas elect a leader through a Lease; the leader is killed (``kill-leader``) or
frozen past its lease (``freeze-leader``: SIGSTOP, then SIGCONT a little after the lease ran
out, while the campaign goes on), and the standby is killed (``kill-standby``). Invariants
are checked all the while:

- no allocated device is destroyed: a claim whose allocation is older than its node's latest
  agent status must find its device in that status (resourceVersions are etcd revisions, so
  "older" is exact on this one-etcd cluster);
- our slices are never duplicated (a device name twice in a pool) nor orphaned (a pool with
  no Node);
- after the faults stop, the slices converge to what the agents report (the time is measured);
- a restarted operator with nothing new to do writes nothing;
- never two writers: every operator process logs each write as it goes onto the wire and the
  moment it starts to lead (``TESSERA_FAULT_WRITE_LOG``, on the machine's monotonic clock);
  once a replica has begun to lead, no other replica writes until it leads again itself (so a
  frozen leader that wakes writes nothing until it has the lease back).

The same seed gives the same actions, faults and pauses, so a failing run can be replayed
(the processes' own timing still varies). Not a test module itself: ``test_fault_campaign``
runs a short campaign in CI and ``benchmarks/fault_campaign.py`` a long one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.controller.decide import published_device_names
from tessera.dra.devices import DRAIN_TAINT_KEY, RESERVED_TAINT_KEY
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tessera.models.layout import NodeLayout
from tests.integration.kube_helpers import DRIVER, claim_template, on_node, pod_with_claim, policy

LABEL = "campaign"
SIMULATE = "2xH100-80GB"
NAMESPACE = "campaign"
LAYOUTS: dict[str, dict[str, Any]] = {
    "all-1g": {"strategy": "MIG", "mig": {"preset": "all-1g"}},
    "balanced": {"strategy": "MIG", "mig": {"preset": "all-balanced"}},
    "whole-mig": {"strategy": "MIG", "mig": {"preset": "whole"}},
    "exclusive": {"strategy": "Exclusive"},
    "time-sliced": {"strategy": "TimeSlicing", "timeSlicing": {"replicas": 4}},
    "mps": {"strategy": "MPS", "mps": {"memory": {"default": "8Gi", "min": "1Gi", "step": "1Gi"}}},
    "dynamic": {"strategy": "DynamicMIG"},
    "adaptive": {"strategy": "Adaptive", "adaptive": {
        "layouts": [{"name": "whole"}, {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}},
                    {"name": "mps", "strategy": "MPS"}],
        "idle": "whole", "cooldown": "2s", "maxRecuts": 2, "pendingAfter": "1s"}},
}
POLICY_NAMES = ("campaign-a", "campaign-b")
ACTIONS = {  # action: weight
    "policy-apply": 4,
    "policy-delete": 1,
    "priority-flip": 1,
    "pod-create": 5,
    "pod-create-slice": 2,  # a claim for a 3g slice: only a MIG layout serves it, so Adaptive recuts for it
    "pod-create-pair": 1,  # a claim for both GPUs of a node: under Adaptive, a node is kept (tainted) for it
    "pod-delete": 3,
    "kill-operator": 1,  # either replica
    "kill-leader": 1,
    "freeze-leader": 1,
    "kill-standby": 1,
    "kill-agent": 1,
    "kill-apiserver": 1,
}
FAULTS = frozenset({"kill-operator", "kill-leader", "freeze-leader", "kill-standby", "kill-agent", "kill-apiserver"})
OPERATORS = ("operator", "operator-b")
# The campaign's lease: shorter than client-go's 15/10/2 s so that a CI run sees many handovers;
# benchmarks/fault_campaign.py --lease-duration 15 runs the defaults.
CAMPAIGN_LEASE = {"TESSERA_LEASE_DURATION": "6", "TESSERA_RENEW_DEADLINE": "4", "TESSERA_RETRY_PERIOD": "1"}


@dataclass
class CampaignReport:
    seed: int
    steps: int
    actions: Counter[str] = field(default_factory=Counter)
    failed_actions: int = 0  # actions the API refused or could not take (the apiserver was down)
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    # Devices the scheduler allocated after their agent had removed them (``DeviceHistory``):
    # not a violation of Tessera's, reported apart.
    stale_allocations: list[str] = field(default_factory=list)
    convergence: list[float] = field(default_factory=list)  # seconds from faults stopping to converged
    restart_writes: float = -1.0
    quiet_wait: float = 0.0  # seconds the restart check waited for the leader to go quiet
    restart_write_kinds: dict[str, float] = field(default_factory=dict)  # by the metric's labels
    restart_status_changes: list[str] = field(default_factory=list)  # policy status fields the restart changed
    writes_checked: int = 0  # operator writes set against every replica's terms (never two writers)
    leader_terms: int = 0
    recuts_for_claims: int = 0  # AdaptiveRecut Events: GPUs an Adaptive policy recut for a waiting claim
    nodes_kept: int = 0  # AdaptiveReserve Events: nodes kept (tainted) for a claim of both their GPUs

    @property
    def faults(self) -> int:
        return sum(n for a, n in self.actions.items() if a in FAULTS)

    def summary(self) -> str:
        conv = sorted(self.convergence)
        p50 = conv[len(conv) // 2] if conv else float("nan")
        p99 = conv[min(len(conv) - 1, int(len(conv) * 0.99))] if conv else float("nan")
        return (
            f"seed {self.seed}: {self.steps} steps, {self.faults} faults injected "
            f"({', '.join(f'{a} {self.actions[a]}' for a in sorted(FAULTS))}), "
            f"{sum(self.actions.values()) - self.faults} other actions ({self.failed_actions} refused while the "
            f"apiserver was down), {self.checks} invariant checks, {len(self.violations)} violations "
            f"({len(self.stale_allocations)} stale-view allocations of removed devices apart); "
            f"convergence after faults stop: p50 {p50:.1f} s, p99 {p99:.1f} s over {len(conv)} quiet periods; "
            f"writes of a restarted operator with nothing new (after {self.quiet_wait:.1f} s quiet wait): "
            f"{self.restart_writes:.0f}"
            f"{' ' + str(self.restart_write_kinds) if self.restart_write_kinds else ''}"
            f"{' ' + '; '.join(self.restart_status_changes) if self.restart_status_changes else ''}; "
            f"adaptive recuts for waiting claims: {self.recuts_for_claims}, nodes kept for pairs: {self.nodes_kept}; "
            f"{self.writes_checked} operator writes in {self.leader_terms} leader terms checked for a second writer"
        )


def read_write_log(path: Path) -> list[tuple[float, str]]:
    """(monotonic seconds, "LEADING" or "<method> <url>") of one operator process's write log."""
    out = []
    for line in path.read_text().splitlines():
        at, _, what = line.partition(" ")
        out.append((int(at) / 1e9, what))
    return out


def writes_only(entries: list[tuple[float, str]], since: float = float("-inf")) -> list[tuple[float, str]]:
    return [(at, what) for at, what in entries if what != "LEADING" and at >= since]


def second_writers(logs: dict[str, list[tuple[float, str]]]) -> list[str]:
    """Writes made by a process while another had begun to lead after it last did: with a
    write fence that shuts before a lease can be taken, there are none."""
    timeline = sorted((at, what == "LEADING", process, what) for process, entries in logs.items()
                      for at, what in entries)
    problems = []
    leader: str | None = None
    for at, leading, process, what in timeline:
        if leading:
            leader = process
        elif process != leader:
            problems.append(f"{process} wrote ({what}) at {at:.3f} while {leader} led")
    return problems


def _rv(body: dict[str, Any]) -> int:
    return int(body["metadata"]["resourceVersion"])


class DeviceHistory:
    """Per claim, from the last look that saw it unallocated on: every device each node's agent
    status listed at any look since. A claim allocated a device that none of those looks listed
    was allocated after its agent had removed the device: the scheduler acted on a stale view
    of the slices (it does after an apiserver restart, until its ResourceSlice informer has
    listed again; the operator then reports the claim, ``MissingDevice``), not a device
    destroyed under a claim. A claim never seen unallocated (allocated between two looks)
    has no history, so a device missing under it always counts as a violation. What this
    cannot see: a device removed, recreated, allocated and removed again between two looks
    (a whole handover, grace included, inside one look's interval)."""

    def __init__(self) -> None:
        self.present: dict[str, dict[str, set[str]]] = {}  # claim uid -> pool -> devices listed

    def observe(self, claims: list[dict[str, Any]], status_of: dict[str, tuple[int, frozenset[str]]]) -> None:
        uids = set()
        for claim in claims:
            uid = str(claim["metadata"].get("uid"))
            uids.add(uid)
            if not ((claim.get("status") or {}).get("allocation")):
                self.present[uid] = {}
            if uid in self.present:
                for pool, (_, devices) in status_of.items():
                    self.present[uid].setdefault(pool, set()).update(devices)
        for gone in set(self.present) - uids:
            del self.present[gone]

    def removed_before_allocated(self, claim: dict[str, Any], pool: str, device: str) -> bool:
        listed = self.present.get(str(claim["metadata"].get("uid")), {})
        return pool in listed and device not in listed[pool]


def check_invariants(layouts: list[dict[str, Any]], claims: list[dict[str, Any]], slices: list[dict[str, Any]],
                     nodes: set[str], history: DeviceHistory | None = None) -> tuple[list[str], list[str]]:
    """Every invariant that must hold at any instant, on one look at the cluster: the problems,
    and apart from them the allocations the scheduler made from a stale view (see
    :class:`DeviceHistory`; all count as problems without one)."""
    problems, stale = [], []
    status_of: dict[str, tuple[int, frozenset[str]]] = {}
    for body in layouts:
        layout = NodeLayout.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status")
                                            if k in body})
        if layout.status is not None:
            devices = frozenset().union(*(published_device_names(g) for g in layout.status.gpus))
            status_of[layout.metadata.name] = (_rv(body), devices)
    if history is not None:
        history.observe(claims, status_of)
    for claim in claims:
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        for r in results:
            if r.get("driver") != DRIVER or r["pool"] not in status_of:
                continue
            layout_rv, devices = status_of[r["pool"]]
            if _rv(claim) < layout_rv and r["device"] not in devices:
                meta = claim["metadata"]
                if history is not None and history.removed_before_allocated(claim, r["pool"], r["device"]):
                    stale.append(f"claim {meta['namespace']}/{meta['name']} was allocated {r['pool']}/{r['device']} "
                                 "after its agent had removed it (a stale scheduler view)")
                    continue
                problems.append(f"claim {meta['namespace']}/{meta['name']} holds {r['pool']}/{r['device']}, "
                                f"which its agent's status (rv {layout_rv}) no longer has")
    seen: dict[tuple[str, str], str] = {}
    for s in slices:
        pool = s["spec"]["pool"]["name"]
        if pool not in nodes:
            problems.append(f"slice {s['metadata']['name']} is orphaned: no Node {pool}")
        for d in s["spec"].get("devices") or []:
            key = (pool, d["name"])
            if key in seen:
                problems.append(f"device {pool}/{d['name']} is in two slices: {seen[key]} and {s['metadata']['name']}")
            seen[key] = s["metadata"]["name"]
    return problems, stale


def _kept(pool: str, mine: set[str], nodes: set[str]) -> bool:
    return pool in mine or pool not in nodes  # the campaign's own, or an orphan


def _ready_now(policy_body: dict[str, Any]) -> bool:
    """Settled for the policy's latest generation: Ready=True, or Ready=False only because it
    wins no GPU (another policy outranks it everywhere; the campaign's churn can end so)."""
    status = policy_body.get("status") or {}
    ready = any(
        c["type"] == "Ready" and (c["status"] == "True" or c.get("reason") == "NoMatchingGPUs")
        for c in status.get("conditions", [])
    )
    return ready and status.get("observedGeneration") == policy_body["metadata"]["generation"]


def converged(layouts: list[dict[str, Any]], slices: list[dict[str, Any]]) -> bool:
    """The slices publish exactly what every agent reports, each pool whole: all its slices of
    one generation, as many as each of them counts (a pool the scheduler would use)."""
    published: dict[str, set[str]] = {}
    pools: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        pools.setdefault(s["spec"]["pool"]["name"], []).append(s["spec"]["pool"])
        published.setdefault(s["spec"]["pool"]["name"], set()).update(
            d["name"] for d in s["spec"].get("devices") or []
        )
    for members in pools.values():
        if {(p.get("generation"), p.get("resourceSliceCount")) for p in members} != {
            (members[0].get("generation"), len(members))
        }:
            return False
    for body in layouts:
        status = body.get("status")
        if not status:
            return False
        layout = NodeLayout.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status")
                                            if k in body})
        assert layout.status is not None
        want = set().union(*(published_device_names(g) for g in layout.status.gpus))
        if published.get(layout.metadata.name, set()) != want:
            return False
    return True


class Campaign:
    def __init__(self, cluster: LocalCluster, tessera: TesseraProcesses, seed: int, nodes: int = 3,
                 lease: dict[str, str] | None = None) -> None:
        self.cluster = cluster
        self.lease = lease or CAMPAIGN_LEASE
        self.write_logs: dict[str, Path] = {}  # operator incarnation -> its write log
        self.incarnations = 0
        self.frozen: set[str] = set()
        self.thaws: list[asyncio.Task[None]] = []
        self.tessera = tessera
        self.rng = random.Random(seed)
        self.report = CampaignReport(seed, 0)
        self.history = DeviceHistory()
        self.nodes = [f"campaign-{i}" for i in range(nodes)]
        self.pods: list[str] = []
        self.next_pod = 0
        self.policies: dict[str, tuple[str, int]] = {}  # name -> (layout, priority)
        self.apiserver_up = True

    # -- reading the cluster (tolerant of a dead apiserver) ---------------------------------

    def _items(self, *args: str) -> list[dict[str, Any]] | None:
        out = self.cluster.kubectl("get", "-o", "json", *args, check=False)
        if out.returncode != 0:
            return None
        items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
        return items

    def _look(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], set[str]] | None:
        # Layouts before claims: a claim read later is at least as new, which the rv rule needs.
        layouts = self._items("nodelayouts")
        claims = self._items("resourceclaims", "-n", NAMESPACE)
        slices = self._items("resourceslices")
        nodes = self._items("nodes")
        if layouts is None or claims is None or slices is None or nodes is None:
            return None
        # The campaign's nodes only (other test modules share the cluster), plus any orphan.
        names = {n["metadata"]["name"] for n in nodes}
        mine = set(self.nodes)
        ours = [s for s in slices if s["spec"]["driver"] == DRIVER and _kept(s["spec"]["pool"]["name"], mine, names)]
        return [b for b in layouts if b["metadata"]["name"] in mine], claims, ours, names

    async def check(self) -> bool:
        look = await asyncio.to_thread(self._look)
        if look is None:
            return False
        self.report.checks += 1
        problems, stale = check_invariants(*look, history=self.history)
        for problem in problems:
            if problem not in self.report.violations:
                self.report.violations.append(problem)
        for late in stale:
            if late not in self.report.stale_allocations:
                self.report.stale_allocations.append(late)
        return True

    async def _checker(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(0.3)

    # -- acting ------------------------------------------------------------------------------

    def _kubectl_ok(self, *args: str, input: str | None = None) -> bool:
        return self.cluster.kubectl(*args, input=input, check=False).returncode == 0

    def _apply(self, body: dict[str, Any]) -> bool:
        return self._kubectl_ok("apply", "-f", "-", input=json.dumps(body))

    def _restart(self, name: str) -> TesseraProcess:
        process = next(p for p in self.tessera.processes if p.name == name)
        process.kill()
        self.tessera.processes.remove(process)
        if name.startswith("agent-"):
            return self.tessera.agent(name.removeprefix("agent-"), SIMULATE)
        return self._operator(name)

    def _operator(self, name: str) -> TesseraProcess:
        """An operator replica in the campaign's election, with a write log of its own."""
        self.incarnations += 1
        log = self.tessera.folder / f"{name}-{self.incarnations}.writes"
        log.touch()
        self.write_logs[f"{name}#{self.incarnations}"] = log
        return self.tessera.operator(name, env={**self.lease, "TESSERA_FAULT_WRITE_LOG": str(log)})

    def _replicas(self) -> list[TesseraProcess]:
        return [p for p in self.tessera.processes if p.name in OPERATORS]

    async def _roles(self) -> dict[str, str | None]:
        awake = [p for p in self._replicas() if p.name not in self.frozen]
        found = await asyncio.gather(*(asyncio.to_thread(p.role) for p in awake))
        return {p.name: r for p, r in zip(awake, found, strict=True)}

    async def _freeze(self, process: TesseraProcess) -> None:
        """SIGSTOP for longer than the lease, then SIGCONT, while the campaign goes on."""
        self.frozen.add(process.name)
        process.freeze()
        try:
            await asyncio.sleep(float(self.lease["TESSERA_LEASE_DURATION"]) + self.rng.uniform(1.0, 3.0))
        finally:
            process.thaw()
            self.frozen.discard(process.name)

    async def act(self, action: str) -> bool:
        rng = self.rng
        match action:
            case "policy-apply":
                name = rng.choice(POLICY_NAMES)
                layout = rng.choice(sorted(LAYOUTS))
                priority = self.policies.get(name, (layout, rng.randint(0, 10)))[1]
                body = policy(name, LABEL, {**LAYOUTS[layout], "priority": priority})
                if self._apply(body):
                    self.policies[name] = (layout, priority)
                    return True
                return False
            case "policy-delete":
                if not self.policies:
                    return True
                name = rng.choice(sorted(self.policies))
                ok = self._kubectl_ok("delete", "sharingpolicy", name, "--wait=false")
                if ok:
                    del self.policies[name]
                return ok
            case "priority-flip":
                if len(self.policies) < 2:
                    return True
                (a, (la, pa)), (b, (lb, pb)) = sorted(self.policies.items())
                ok = self._apply(policy(a, LABEL, {**LAYOUTS[la], "priority": pb})) and self._apply(
                    policy(b, LABEL, {**LAYOUTS[lb], "priority": pa})
                )
                if ok:
                    self.policies = {a: (la, pb), b: (lb, pa)}
                return ok
            case "pod-create":
                pod = f"w-{self.next_pod}"
                self.next_pod += 1
                body = pod_with_claim(pod, NAMESPACE, "any", on_node(rng.choice(self.nodes)))
                if self._apply(body):
                    self.pods.append(pod)
                    return True
                return False
            case "pod-create-slice" | "pod-create-pair":
                pod = f"s-{self.next_pod}" if action == "pod-create-slice" else f"p-{self.next_pod}"
                self.next_pod += 1
                template = "three-g" if action == "pod-create-slice" else "pair"
                body = pod_with_claim(pod, NAMESPACE, template, on_node(rng.choice(self.nodes)))
                if self._apply(body):
                    self.pods.append(pod)
                    return True
                return False
            case "pod-delete":
                if not self.pods:
                    return True
                pod = self.pods.pop(rng.randrange(len(self.pods)))
                return self._kubectl_ok("delete", "pod", pod, "-n", NAMESPACE, "--grace-period=0", "--force",
                                        "--wait=false")
            case "kill-operator":
                self._restart(rng.choice([n for n in OPERATORS if n not in self.frozen] or ["operator"]))
                return True
            case "kill-leader" | "freeze-leader" | "kill-standby":
                roles = await self._roles()
                want = "standby" if action == "kill-standby" else "leader"
                chosen = sorted(name for name, role in roles.items() if role == want)
                if not chosen:
                    return False  # none now (a handover under way): counted as refused
                if action == "freeze-leader":
                    process = next(p for p in self.tessera.processes if p.name == chosen[0])
                    self.thaws.append(asyncio.create_task(self._freeze(process)))
                else:
                    self._restart(chosen[0])
                return True
            case "kill-agent":
                self._restart(f"agent-{rng.choice(self.nodes)}")
                return True
            case "kill-apiserver":
                await asyncio.to_thread(self.cluster.kill_apiserver)
                await asyncio.sleep(rng.uniform(0.2, 2.0))
                await asyncio.to_thread(self.cluster.start_apiserver)
                return True
        raise ValueError(f"unknown action {action}")

    # -- the campaign --------------------------------------------------------------------------

    async def setup(self) -> None:
        for process in self._replicas():  # the fixture's operator makes way for the campaign's two
            process.stop()
            self.tessera.processes.remove(process)
        for name in OPERATORS:
            self._operator(name)
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        await wait_for(lambda: self._kubectl_ok("get", "serviceaccount", "default", "-n", NAMESPACE), timeout=30,
                       message="the campaign namespace's ServiceAccount")
        three_g = f'device.attributes["{DRIVER}"].migProfile == "3g.40gb"'
        pair = claim_template("pair", NAMESPACE, "whole-gpu.tessera.dev")
        pair["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
        self.cluster.apply_objects([claim_template("any", NAMESPACE, "gpu.tessera.dev"),
                                    claim_template("three-g", NAMESPACE, "mig.tessera.dev", three_g), pair])
        for node in self.nodes:
            self.cluster.add_node(node, labels={"tessera.dev/test": LABEL})
            self.tessera.agent(node, SIMULATE)
        await self.wait_converged(timeout=120)

    async def wait_converged(self, timeout: float) -> float:
        started = time.monotonic()

        def done() -> bool:
            look = self._look()
            return look is not None and len(look[0]) >= len(self.nodes) and converged(look[0], look[2])

        await wait_for(done, timeout=timeout, interval=0.3, message="the slices to converge to the agents' status")
        return time.monotonic() - started

    async def run(self, steps: int, quiet_every: int = 15) -> CampaignReport:
        """``steps`` random actions; every ``quiet_every`` steps the faults stop and the time
        until the slices match the agents again is measured."""
        checker = asyncio.create_task(self._checker())
        try:
            names, weights = zip(*ACTIONS.items(), strict=True)
            for step in range(steps):
                action = self.rng.choices(names, weights)[0]
                self.report.actions[action] += 1
                if not await self.act(action):
                    self.report.failed_actions += 1
                await asyncio.sleep(self.rng.uniform(0.0, 0.4))
                if (step + 1) % quiet_every == 0 or step == steps - 1:
                    self.report.convergence.append(await self.wait_converged(timeout=120))
            self.report.steps = steps
            await asyncio.gather(*self.thaws)
            recuts = self._items("events", "-n", NAMESPACE, "--field-selector", "reason=AdaptiveRecut")
            self.report.recuts_for_claims = len(recuts or [])
            kept = self._items("events", "-n", NAMESPACE, "--field-selector", "reason=AdaptiveReserve")
            self.report.nodes_kept = len(kept or [])
            await self.release_everything()
            await self.check()
        finally:
            checker.cancel()
            for task in self.thaws:
                task.cancel()
            for process in self._replicas():
                process.thaw()
        self.report.restart_writes = await self.restart_writes()
        self.check_writers()
        return self.report

    def check_writers(self) -> None:
        logs = {name: read_write_log(path) for name, path in self.write_logs.items()}
        self.report.writes_checked = sum(len(writes_only(entries)) for entries in logs.values())
        self.report.leader_terms = sum(1 for entries in logs.values() for _, what in entries if what == "LEADING")
        for problem in second_writers(logs)[:20]:
            self.report.violations.append(f"two writers: {problem}")

    async def release_everything(self) -> None:
        for pod in self.pods:
            self._kubectl_ok("delete", "pod", pod, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false")
        self.pods.clear()

        def no_claims() -> bool:
            claims = self._items("resourceclaims", "-n", NAMESPACE)
            return claims is not None and not claims

        await wait_for(no_claims, timeout=120, interval=0.5, message="every campaign claim to go")
        await self.wait_converged(timeout=120)

        def policies_settled() -> bool:
            items = self._items("sharingpolicies")
            if items is None:
                return False
            return all(_ready_now(p) for p in items if p["metadata"]["name"] in POLICY_NAMES)

        try:
            await wait_for(policies_settled, timeout=180, interval=0.5, message="every campaign policy to be Ready")
        except TimeoutError:  # say what each policy is waiting for, then fail
            for body in self._items("sharingpolicies") or []:
                print(json.dumps({"name": body["metadata"]["name"], "spec": body.get("spec"),
                                  "status": body.get("status")}, indent=1)[:4000])
            raise

        def untainted() -> bool:
            # With every claim gone nothing is kept for a claim or drained for one: a taint that
            # stayed would keep the device off every claim, and a restarted operator (which knows
            # of no reservation) would lift it, a write the restart check would blame on it.
            slices = self._items("resourceslices")
            return slices is not None and not any(
                t.get("key") in (RESERVED_TAINT_KEY, DRAIN_TAINT_KEY)
                for s in slices if s["spec"]["driver"] == DRIVER
                for d in s["spec"].get("devices") or [] for t in d.get("taints") or []
            )

        await wait_for(untainted, timeout=120, interval=0.5,
                       message="no device to stay tainted for a drain or a reservation once every claim is gone")
        await self.wait_converged(timeout=120)

    def _settled(self) -> bool:
        """Every agent has reported its spec, and every GPU an Adaptive policy cut is back on
        the policy's idle layout (with every claim gone, the leader takes it there once its
        cooldown ends)."""
        layouts, policies = self._items("nodelayouts"), self._items("sharingpolicies")
        if layouts is None or policies is None:
            return False
        idle = {p["metadata"]["name"]: ((p.get("spec") or {}).get("adaptive") or {}).get("idle") for p in policies}
        for body in layouts:
            if (body.get("status") or {}).get("observedGeneration") != body["metadata"].get("generation"):
                return False
            for gpu in (body.get("spec") or {}).get("gpus") or []:
                if gpu.get("menuLayout") and gpu["menuLayout"] != idle.get(gpu.get("policy")):
                    return False
        return True

    async def wait_quiet(self, quiet: float = 3.0, timeout: float = 90.0) -> None:
        """Before the restart check: no replica has written for ``quiet`` seconds and the
        cluster is ``_settled``. A restart "with nothing new" must find nothing left to do; a
        leader that never stops writing fails here."""
        last: float | None = None
        since = time.monotonic()
        deadline = since + timeout
        while time.monotonic() < deadline:
            counts = [p.metrics() for p in self._replicas()]
            total = None if not all(counts) else sum(
                v for m in counts for k, v in m.items() if k.startswith("tessera_operator_api_writes_total"))
            if total is None or total != last:
                last, since = total, time.monotonic()
            elif time.monotonic() - since >= quiet and self._settled():
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"the operator did not go quiet ({quiet:.0f} s without a write, every layout "
                           f"reported and every adaptive GPU idle) within {timeout:.0f} s")

    async def restart_writes(self) -> float:
        """API writes a restarted operator makes when nothing changed (must be 0). Both replicas
        stop (handing the lease over), and one starts again: it leads at once."""
        started = time.monotonic()
        await self.wait_quiet()
        self.report.quiet_wait = time.monotonic() - started
        before = {p["metadata"]["name"]: p.get("status") or {} for p in self._items("sharingpolicies") or []}
        for process in self._replicas():
            process.stop()
            self.tessera.processes.remove(process)
        restarted = self._operator("operator")
        layouts = self._items("nodelayouts") or []

        def reconciled() -> dict[str, float] | None:
            metrics = restarted.metrics()
            done = metrics.get('tessera_operator_reconciles_total{result="ok"}', 0)
            passes = metrics.get("tessera_operator_policy_status_passes_total", 0)
            return metrics if done >= len(layouts) and passes >= 1 else None

        metrics = await wait_for(reconciled, timeout=90, message="the restarted operator to reconcile every node")
        writes = {k.removeprefix("tessera_operator_api_writes_total"): v for k, v in metrics.items()
                  if k.startswith("tessera_operator_api_writes_total") and v}
        self.report.restart_write_kinds = writes
        if writes:  # say what a restart's write changed in the policies' status, for the next reader
            after = {p["metadata"]["name"]: p.get("status") or {} for p in self._items("sharingpolicies") or []}
            for name in sorted(before.keys() | after.keys()):
                old, new = before.get(name, {}), after.get(name, {})
                for key in sorted(old.keys() | new.keys()):
                    if old.get(key) != new.get(key):
                        was, now = json.dumps(old.get(key))[:600], json.dumps(new.get(key))[:600]
                        self.report.restart_status_changes.append(f"{name}.status.{key}: {was} -> {now}")
        return float(sum(writes.values()))
