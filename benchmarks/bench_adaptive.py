"""Benchmark: adaptive layouts against static policies and first-fit recuts, replaying a public
GPU-sharing trace on a simulated fleet, through the operator's own planning and device code.

    .venv/bin/python benchmarks/bench_adaptive.py [--nodes 100] [--gpus-per-node 8] [--pods 3000]
                                                  [--load 1.5] [--seed 42 [7 ...]] [--warmup 0] [--strategies ...]

Workload: ``benchmarks/traces/openb_pod_list_default.sample.csv`` (Alibaba cluster-trace-gpu-v2023,
see ``benchmarks/traces/README.md``; cite Weng et al., USENIX ATC '23). Each Pod keeps its shape
(``num_gpu``, ``gpu_milli``) and its run time (``deletion_time - scheduled_time``, held to 1 min
.. 4 h); the trace's own arrivals offer a few dozen GPUs at a time (6,212 GPUs were behind it),
so arrivals are a seeded Poisson process, in the trace's order, at the rate that offers
``--load`` times the fleet's capacity. Fleet: ``--nodes`` x ``--gpus-per-node`` H100-80GB.

Claims (the mapping is a choice, stated): a Pod of whole GPUs asks ``whole-gpu.tessera.dev``,
count ``num_gpu``. A fractional Pod (``gpu_milli`` < 1000) asks, ``firstAvailable``: a MIG
partition (``mig.tessera.dev``) of at least ceil(gpu_milli x 7 / 1000) compute slices, else an
MPS share (``shared-gpu.tessera.dev``) of ceil(gpu_milli / 10) percent compute. Under
``static-exclusive`` nothing is shared, so a fractional Pod asks for a whole GPU.

Strategies: ``static-exclusive``, ``static-mig`` (all-balanced: 2 x 1g, 2g, 3g), ``static-mps``
(every GPU MPS); ``first-fit`` (Adaptive menu; each pass, for each waiting claim in turn, the
first recuttable GPU and the first menu layout that fits it); ``tessera`` (the same menu,
``tessera.adaptive.choose.plan_recuts`` offered the free devices beside, then ``plan_ahead``:
recuts ahead for the claims placed within the last ``--ahead`` seconds, by default the
operator's lead time, 2 x (pendingAfter + pass + recut); and ``plan_reservations``: a waiting
claim no single GPU can host keeps a node, whose devices the scheduler then skips, as it skips
the operator's ``tessera.dev/reserved`` taint, until its free devices can hold the claim).
Both adaptive ones return free GPUs to the idle layout after the cooldown (``back_to_idle``;
Tessera keeps those ``plan_ahead`` expects to use, and those the claims of the last cooldown
would use as they are), run a pass every 5 s whatever waits, respect the cap (``maxRecuts``), wait
``pendingAfter`` before a claim counts, treat a GPU never recut as past its cooldown (as the
operator does), and a recut GPU publishes nothing for ``--recut-seconds``
(20 s by default: real MIG changes take seconds per instance; ``bench_adaptive_e2e.py`` measures
the whole path on a real node with simulated GPUs).
The scheduler is first fit: nodes by name, devices in publication order, claims oldest first,
with the same ``fit`` the planning room uses (class and request CEL through the planner's
selector path, capacity request policies, firstAvailable).

Printed per strategy: ``unallocated-while-pending`` = GPU capacity not allocated (a whole GPU,
a MIG instance's slices / 8, the unbooked compute of an MPS GPU; GPUs being recut count as
unallocated), integrated over the time at least one claim waits, over that time x the fleet;
``never placed`` = claims still waiting when nothing is left to happen; pending p50/p99 =
arrival to allocation of the placed claims; ``recuts`` = layout changes (for claims and back
to idle). After each line, ``unused-while-pending`` counts instead the capacity no placed Pod's
own ``gpu_milli`` uses (a fractional Pod on a whole GPU wastes the rest), so static-exclusive's
over-allocation shows, and the recuts by reason (for waiting claims, ahead, back to idle).
Figures count from ``--warmup`` seconds on. Several ``--seed`` values run the whole comparison
once per seed; after each, one ``# seed N: tessera ...`` line gives its reduction against first
fit and against the best static policy run, beside the targets (30% and 40%).
Not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import itertools
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from tessera.adaptive.choose import (
    AdaptiveGpu,
    MenuCache,
    RecutPlan,
    back_to_idle,
    plan_ahead,
    plan_recuts,
    plan_reservations,
)
from tessera.adaptive.claims import ClaimDemand, Slot, claim_demand, class_selectors, fit
from tessera.adaptive.layouts import slots_of
from tessera.controller.demand import AHEAD_FACTOR
from tessera.dra.deviceclasses import device_classes
from tessera.models.catalog import model_by_key
from tessera.models.layout import GpuStatus
from tessera.models.policy import SharingPolicy
from tessera.planner.inventory import catalog_gpu

TRACE = Path(__file__).resolve().parent / "traces" / "openb_pod_list_default.sample.csv"
MODEL = "H100-80GB"
STRATEGIES = ("static-exclusive", "static-mig", "static-mps", "first-fit", "tessera")
CLASSES = class_selectors(device_classes())
OURS = frozenset(CLASSES)
PASS_SECONDS = 5.0  # how often the operator's demand pass runs
RECUT_SECONDS = 20.0  # default: handover grace, agent apply, publish; the GPU offers nothing meanwhile
MIN_RUN, MAX_RUN = 60, 4 * 3600

MENU: list[dict[str, Any]] = [
    {"name": "whole"},
    {"name": "mps", "strategy": "MPS"},
    {"name": "balanced", "strategy": "MIG", "mig": {"preset": "all-balanced"}},
    {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}},
    {"name": "sevenths", "strategy": "MIG", "mig": {"preset": "all-1g"}},
]
STATIC = {"static-exclusive": "whole", "static-mig": "balanced", "static-mps": "mps"}


def policy(menu: list[dict[str, Any]], idle: str, max_recuts: int, cooldown: str, pending_after: str) -> SharingPolicy:
    return SharingPolicy.model_validate({
        "metadata": {"name": "bench"},
        "spec": {"strategy": "Adaptive", "adaptive": {
            "layouts": menu, "idle": idle, "maxRecuts": max_recuts, "cooldown": cooldown,
            "pendingAfter": pending_after}},
    })


# ---------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Pod:
    name: str
    num_gpu: int
    milli: int
    run: float


def read_trace(path: Path, limit: int) -> list[Pod]:
    pods = []
    with path.open() as f:
        for row in csv.DictReader(f):
            start = int(row["scheduled_time"] or row["creation_time"])
            run = min(max(int(row["deletion_time"]) - start, MIN_RUN), MAX_RUN)
            pods.append(Pod(row["name"], int(row["num_gpu"]), int(row["gpu_milli"]), float(run)))
    return pods[:limit]


_MIG_SIZES = {p.compute_slices: p.memory_slices for p in model_by_key(MODEL).profiles}


def claim_for(pod: Pod, shared: bool) -> ClaimDemand:
    """The ResourceClaim a Pod's owner would write (see the module doc)."""
    if pod.milli >= 1000 or not shared:
        requests: list[dict[str, Any]] = [
            {"name": "gpu", "exactly": {"deviceClassName": "whole-gpu.tessera.dev", "count": pod.num_gpu}}
        ]
    else:
        slices = math.ceil(pod.milli * 7 / 1000)
        size = min(m for c, m in _MIG_SIZES.items() if c >= slices)
        requests = [{"name": "gpu", "firstAvailable": [
            {"name": "mig", "deviceClassName": "mig.tessera.dev", "selectors": [
                {"cel": {"expression": f'device.attributes["gpu.tessera.dev"].migSize >= {size}'}}]},
            {"name": "mps", "deviceClassName": "shared-gpu.tessera.dev",
             "capacity": {"requests": {"compute": str(math.ceil(pod.milli / 10))}}},
        ]}]
    body = {"metadata": {"name": pod.name, "namespace": "trace"}, "spec": {"devices": {"requests": requests}}}
    demand = claim_demand(body, OURS)
    assert demand is not None
    return demand


# ---------------------------------------------------------------- the fleet


@dataclass
class Gpu:
    node: str
    status: GpuStatus
    layout: str
    since: float = -math.inf  # when its layout was chosen (never: past any cooldown, as the operator counts it)
    slots: list[Slot] = field(default_factory=list)
    recutting: bool = False

    def free(self) -> bool:
        return not self.recutting and all(not s.taken and s.free == s.total for s in self.slots)


@dataclass
class Allocation:
    claim: ClaimDemand
    node: str
    took: list[tuple[Slot, dict[str, Fraction], Fraction]]  # slot, capacity consumed, GPU share used


class Simulation:
    def __init__(self, strategy: str, pods: list[Pod], arrivals: list[float], args: argparse.Namespace) -> None:
        self.strategy = strategy
        self.adaptive = strategy in ("first-fit", "tessera")
        menu = MENU if self.adaptive else [m for m in MENU if m["name"] == STATIC[strategy]]
        idle = "whole" if self.adaptive else STATIC[strategy]
        self.policy = policy(menu, idle, args.max_recuts, f"{args.cooldown}s", f"{args.pending_after}s")
        self.cooldown = float(args.cooldown)
        self.debounce = float(args.pending_after)
        self.recut_seconds = float(args.recut_seconds)
        self.menus = MenuCache()
        self.nodes = [f"node-{i:03d}" for i in range(args.nodes)]
        self.gpus: dict[str, list[Gpu]] = {}
        for node in self.nodes:
            self.gpus[node] = [Gpu(node, catalog_gpu(node, i, MODEL), idle) for i in range(args.gpus_per_node)]
            for g in self.gpus[node]:
                g.slots = self._slots(g, idle)
        self.total = len(self.nodes) * args.gpus_per_node
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        shared = strategy != "static-exclusive"
        for pod, at in zip(pods, arrivals, strict=True):
            self._at(at, "arrive", (claim_for(pod, shared), pod.run, pod.num_gpu * min(pod.milli, 1000) / 1000))
        self.pending: dict[str, tuple[ClaimDemand, float, float]] = {}  # key -> (claim, arrived, run)
        self.demand_of: dict[str, float] = {}  # key -> GPUs its Pod really needs
        self.allocations: dict[str, Allocation] = {}
        self.failed: dict[tuple[object, str], int] = {}  # (shape, node) -> node version when it failed
        self.version: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.waits: list[float] = []
        self.recuts = 0
        self.why: dict[str, int] = {"demand": 0, "ahead": 0, "idle": 0}  # recuts by reason
        self.area = 0.0  # unallocated GPU x seconds while a claim waits
        self.unused_area = 0.0  # GPU x seconds no placed Pod's own demand (gpu_milli) uses, while one waits
        self.demand_used = 0.0  # GPUs the placed Pods' own demand uses
        self.measure_from = args.warmup
        self.waiting_time = 0.0
        self.allocated = Fraction(0)
        self.now = 0.0
        self.next_pass = PASS_SECONDS if self.adaptive else math.inf
        self.recent: list[ClaimDemand] = []
        self.reserved: dict[str, str] = {}  # claim -> the node kept for it (tessera)
        self.tainted: set[str] = set()  # nodes whose free devices are published tainted (reserved, not ready)
        self.arrived: list[tuple[float, ClaimDemand]] = []  # (when, claim) within the lead time
        # The operator's lead time (AdaptiveDemand.lead_time), with this run's debounce, pass and recut.
        lead = AHEAD_FACTOR * (self.debounce + PASS_SECONDS + self.recut_seconds)
        self.ahead = float(args.ahead) if args.ahead is not None else lead

    def _slots(self, gpu: Gpu, layout: str) -> list[Slot]:
        option = next(o for o in self.menus.options(self.policy, gpu.status) if o.layout_name == layout)
        return slots_of(option.devices)

    def _at(self, when: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, payload))

    # -- the scheduler ----------------------------------------------------------------------

    def schedule(self) -> None:
        blocked: set[object] = set()  # shapes that fit no node in this call: later claims of them neither
        for key, (claim, arrived, run) in list(self.pending.items()):  # in arrival order
            if claim.shape in blocked:
                continue
            blocked.add(claim.shape)
            for node in self.nodes:
                if node in self.tainted or self.failed.get((claim.shape, node)) == self.version[node]:
                    continue
                slots = [s for g in self.gpus[node] if not g.recutting for s in g.slots]
                before = [(s, s.taken, dict(s.free)) for s in slots]
                if fit(claim, slots, CLASSES, consume=True) is None:
                    self.failed[(claim.shape, node)] = self.version[node]
                    continue
                took = []
                for slot, taken, free in before:
                    if (slot.taken, slot.free) == (taken, free):
                        continue
                    share = (slot.fraction - slot.free_fraction()) - (slot.fraction - _free_fraction(slot, taken, free))
                    took.append((slot, {n: free[n] - slot.free[n] for n in free}, share))
                    self.allocated += share
                self.allocations[key] = Allocation(claim, node, took)
                self.demand_used += self.demand_of[key]
                self.version[node] += 1
                del self.pending[key]
                self.waits.append(self.now - arrived)
                self._at(self.now + run, "depart", key)
                blocked.discard(claim.shape)
                break

    def release(self, key: str) -> None:
        allocation = self.allocations.pop(key)
        self.demand_used -= self.demand_of[key]
        for slot, consumed, share in allocation.took:
            if not slot.shared:
                slot.taken = False
            for name, amount in consumed.items():
                slot.free[name] += amount
            self.allocated -= share
        self.version[allocation.node] += 1

    # -- the operator's pass ----------------------------------------------------------------

    def adaptive_gpus(self) -> tuple[list[AdaptiveGpu], int]:
        out, under_way = [], 0
        for node in self.nodes:
            for g in self.gpus[node]:
                under_way += g.recutting
                cooled = self.now - g.since >= self.cooldown
                out.append(AdaptiveGpu(node, g.status, self.policy, g.layout, g.free() and cooled))
        return out, under_way

    def operator_pass(self) -> None:
        waiting = [c for c, arrived, _ in sorted(self.pending.values(), key=lambda v: v[1])
                   if self.now - arrived >= self.debounce]
        gpus, under_way = self.adaptive_gpus()
        cap = self.policy.spec.adaptive.max_recuts  # type: ignore[union-attr]
        left = {"bench": max(0, cap - under_way)}
        lifted: set[str] = set()
        if self.strategy == "tessera":
            # As the operator offers them: devices no claim holds, of GPUs not being recut.
            free = {node: [s for g in self.gpus[node] if not g.recutting for s in g.slots
                           if not s.taken and s.free == s.total] for node in self.nodes}
            busy = {g.status.uuid for node in self.nodes for g in self.gpus[node]
                    if not g.recutting and any(s.taken or s.free != s.total for s in g.slots)}
            reservations = plan_reservations(waiting, gpus, CLASSES, free=free, busy=busy, previous=self.reserved,
                                             limit=cap, menus=self.menus)
            self.reserved = {r.claim: r.node for r in reservations}
            tainted = {r.node for r in reservations if not r.ready}
            for node in tainted ^ self.tainted:
                self.version[node] += 1
            lifted, self.tainted = self.tainted - tainted, tainted
            plan = plan_recuts(waiting, gpus, CLASSES, left, free=free, recent=self.recent,
                               reserved={r.node: r.claim for r in reservations}, menus=self.menus)
        else:
            plan = first_fit_plan(waiting, gpus, self.menus, left["bench"])
        by_uuid = {g.status.uuid: g for node in self.nodes for g in self.gpus[node]}
        changes = [(r.gpu, r.layout, "demand") for r in plan.recuts]
        keep: frozenset[str] = frozenset()
        if self.strategy == "tessera" and self.ahead > 0:
            # Recut ahead: the claims of the last lead time, forecast for the next one.
            placed = [(at, c) for at, c in self.arrived if c.key not in self.pending]
            expected = [c for at, c in placed if self.now - at <= self.ahead]
            lately = [c for at, c in reversed(placed) if self.now - at > self.ahead]  # newest first
            busy = {r.gpu for r in plan.recuts} | {u for uuids in plan.placed.values() for u in uuids}
            ahead = plan_ahead(expected, gpus, CLASSES, {"bench": left["bench"] - len(plan.recuts)},
                               free=free, busy=busy, lately=lately, reserved=set(self.reserved.values()),
                               menus=self.menus)
            changes += [(r.gpu, r.layout, "ahead") for r in ahead.recuts]
            keep = ahead.keep | {r.gpu for r in ahead.recuts}
        # The first-fit baseline returns every free GPU to the idle layout after its cooldown.
        changes += [(g.gpu.uuid, self.policy.spec.adaptive.idle, "idle")  # type: ignore[union-attr]
                    for g in back_to_idle(gpus, plan, keep=keep)]
        for uuid, layout, why in changes:
            self.why[why] += 1
            gpu = by_uuid[uuid]
            gpu.recutting, gpu.layout, gpu.since = True, layout, self.now
            self.version[gpu.node] += 1
            self.recuts += 1
            self._at(self.now + self.recut_seconds, "recut", gpu)
        if lifted:
            self.schedule()  # a reserved node's devices published untainted: the scheduler retries

    # -- the clock --------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        # The operator's pass runs every PASS_SECONDS whatever happens (as its loop does), so
        # free GPUs go back to idle and recuts start even while nothing waits.
        while self.events or (self.adaptive and self.pending):
            when = self.events[0][0] if self.events else math.inf
            if self.next_pass <= when:
                self._advance(self.next_pass)
                recuts = self.recuts
                self.operator_pass()
                self.next_pass += PASS_SECONDS
                if not self.events and self.recuts == recuts:
                    break  # nothing left to happen and nothing to recut: what waits never runs
                continue
            self._advance(when)
            _, _, kind, payload = heapq.heappop(self.events)
            if kind == "arrive":
                claim, run, need = payload
                self.pending[claim.key] = (claim, self.now, run)
                self.demand_of[claim.key] = need
                self.recent = [*self.recent[-63:], claim]
                window = max(self.ahead, self.cooldown)  # as the operator keeps them (AdaptiveDemand)
                self.arrived = [*(x for x in self.arrived if self.now - x[0] <= window), (self.now, claim)]
            elif kind == "depart":
                self.release(payload)
            elif kind == "recut":
                payload.slots = self._slots(payload, payload.layout)
                payload.recutting = False
                self.version[payload.node] += 1
            self.schedule()
        waits = sorted(self.waits)
        return {
            "unallocated": 100 * self.area / (self.waiting_time * self.total) if self.waiting_time else 0.0,
            "never": float(len(self.pending)),
            "p50": statistics.median(waits) if waits else 0.0,
            "p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else 0.0,
            "recuts": float(self.recuts),
            "why": ", ".join(f"{n} {k}" for k, n in self.why.items()),  # type: ignore[dict-item]
            "unused": 100 * self.unused_area / (self.waiting_time * self.total) if self.waiting_time else 0.0,
        }

    def _advance(self, when: float) -> None:
        start = max(self.now, self.measure_from)
        if self.pending and when > start:
            self.waiting_time += when - start
            self.area += (when - start) * float(self.total - self.allocated)
            self.unused_area += (when - start) * (self.total - self.demand_used)
        self.now = max(self.now, when)


def _free_fraction(slot: Slot, taken: bool, free: dict[str, Fraction]) -> Fraction:
    old = Slot(slot.gpu, slot.device, slot.flat, slot.fraction, slot.shared, slot.total, free, taken)
    return old.free_fraction()


def first_fit_plan(pending: Sequence[ClaimDemand], gpus: Sequence[AdaptiveGpu], menus: MenuCache,
                   cap: int) -> RecutPlan:
    """The baseline: for each waiting claim in turn, the first recuttable GPU and the first menu
    layout its claim fits, one GPU per claim, no packing, no score."""
    recuts = []
    taken: set[str] = set()
    from tessera.adaptive.choose import Recut

    for claim in pending:
        if len(recuts) >= cap:
            break
        for g in gpus:
            if not g.recuttable or g.gpu.uuid in taken:
                continue
            option = next((o for o in menus.options(g.policy, g.gpu) if o.layout_name != g.current
                           and fit(claim, slots_of(o.devices), CLASSES) is not None), None)
            if option is not None:
                recuts.append(Recut(g.node, g.gpu.uuid, g.gpu.index, g.policy.name, option.layout_name, (claim.key,)))
                taken.add(g.gpu.uuid)
                break
    return RecutPlan(tuple(recuts), {}, (), (), Fraction(0))


def arrivals_for(pods: list[Pod], load: float, capacity: int, seed: int) -> list[float]:
    """Seeded Poisson arrivals at the rate that offers ``load`` x ``capacity`` GPUs on average."""
    demand = statistics.fmean(p.num_gpu * min(p.milli, 1000) / 1000 * p.run for p in pods)
    rate = load * capacity / demand
    rng = random.Random(seed)
    now, out = 0.0, []
    for _ in pods:
        now += rng.expovariate(rate)
        out.append(now)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--load", type=float, default=1.5, help="offered GPUs / fleet GPUs (by gpu_milli)")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds before the figures count")
    parser.add_argument("--seed", type=int, nargs="+", default=[42], help="one run per seed, each compared")
    parser.add_argument("--max-recuts", type=int, default=16)
    parser.add_argument("--cooldown", type=float, default=300.0)
    parser.add_argument("--pending-after", type=float, default=5.0)
    parser.add_argument("--recut-seconds", type=float, default=RECUT_SECONDS)
    parser.add_argument("--ahead", type=float, default=None,
                        help="tessera recuts ahead for the claims placed in the last this many seconds "
                             "(default, as the operator: 2 x (pendingAfter + pass + recut seconds); 0: never)")
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES), choices=STRATEGIES)
    args = parser.parse_args(argv)
    pods = read_trace(TRACE, args.pods)
    for seed in args.seed:
        arrivals = arrivals_for(pods, args.load, args.nodes * args.gpus_per_node, seed)
        print(f"# {len(pods)} Pods of {TRACE.name}, {args.nodes} nodes x {args.gpus_per_node} {MODEL}, "
              f"load {args.load}, seed {seed}, maxRecuts {args.max_recuts}, cooldown {args.cooldown:g} s, "
              f"pendingAfter {args.pending_after:g} s, recut {args.recut_seconds:g} s, "
              f"figures from {args.warmup:g} s on")
        results = {}
        for strategy in args.strategies:
            started = time.perf_counter()
            r = results[strategy] = Simulation(strategy, pods, arrivals, args).run()
            print(f"{strategy}: unallocated-while-pending {r['unallocated']:.1f}%, never placed {int(r['never'])}, "
                  f"pending p50 {r['p50']:.0f} s p99 {r['p99']:.0f} s, recuts {int(r['recuts'])}"
                  f"   # unused-while-pending {r['unused']:.1f}%, recuts for {r['why']}, "
                  f"{time.perf_counter() - started:.0f} s to simulate",
                  flush=True)
        print(against_targets(seed, results), flush=True)


def against_targets(seed: int, results: dict[str, dict[str, Any]]) -> str:
    """One line: how far Tessera's unallocated-while-pending is below first fit's and the best
    static policy's (targets: 30% and 40% less), and its recuts against first fit's."""
    ours = results.get("tessera")
    if ours is None:
        return f"# seed {seed}: no tessera run, nothing to compare"
    parts = []
    if "first-fit" in results:
        ff = results["first-fit"]
        parts.append(f"{_less(ours['unallocated'], ff['unallocated'])} less than first-fit (target 30%), "
                     f"recuts {int(ours['recuts'])} vs {int(ff['recuts'])}")
    statics = {n: r for n, r in results.items() if n in STATIC}
    if statics:
        name, best = min(statics.items(), key=lambda kv: kv[1]["unallocated"])
        parts.append(f"{_less(ours['unallocated'], best['unallocated'])} less than the best static, {name} "
                     "(target 40%)")
    return f"# seed {seed}: tessera " + "; ".join(parts) if parts else f"# seed {seed}: nothing to compare"


def _less(ours: float, theirs: float) -> str:
    return f"{100 * (1 - ours / theirs):.0f}%" if theirs else "n/a"


if __name__ == "__main__":
    main()
