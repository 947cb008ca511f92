"""The adaptive choice: which idle GPUs to recut, to which menu layout, for which waiting claims.

Pure: pending claims (oldest first), the GPUs of ``Adaptive`` policies, the device classes'
selectors and how many recuts each policy may still start in; a :class:`RecutPlan` out.

The rule, claim by claim, oldest first:

1. A claim that fits what this plan's recuts leave over (with the node's free devices) takes
   it: no new recut.
2. Else every option is tried: on every node, for every menu layout of a policy there, the
   fewest of that policy's recuttable GPUs (``k`` = 1, 2, …) recut to that layout that let the
   claim fit together with the node's free devices (those of GPUs not being recut: a claim
   may span a recut GPU and a device free elsewhere on its node). A GPU is never recut to the
   layout it has, and GPUs away from the idle layout are recut before those on it. The option
   chosen is the least by ``(k, -hosted, fragmentation, recuttable GPUs on the node, node,
   GPU index, menu order)``, where ``hosted`` counts how many of the next waiting claims (up
   to :data:`LOOKAHEAD`) the option's leftover would also take: on a tie the node with the
   fewest GPUs free to recut wins, so whole nodes stay whole for claims of many GPUs. Its GPUs
   join the plan and the claim's devices are taken from them.
3. Else the claim waits (no GPU free, or the cap reached) — unless no layout of any menu on
   any adaptive GPU could ever satisfy it, GPUs idle and recut at will: then it is
   :class:`Unsatisfiable`, with the request that fits nowhere named.

So the most claims are placed with the fewest GPUs recut (each recut chosen to host as many
of the waiting claims as it can), and ties go to the least fragmentation.
**Fragmentation** (:func:`fragmentation`) is the GPU capacity the plan leaves free that the
demand seen recently could not use: for every device of the recut GPUs, the
share of its GPU still free on it (1 for a whole GPU, slices/8 for a MIG instance, times the
free part of a shared device's limiting capacity) counts when no claim shape in ``recent``
(the claims pending now and lately) fits on that device alone. A GPU cut to 1g slices when
only 3g claims come scores high; one cut exactly as the demand asks scores 0.

**Gang claims** (:func:`plan_reservations`): a waiting claim no single GPU can host waits for
a node to empty, and while small claims take every GPU that frees up, none does. So each such
claim (oldest first, up to a limit) keeps one node, the one with the fewest busy GPUs among
those that could host it, and keeps it while it waits; the caller publishes that node's devices
tainted until its free devices can hold the claim, and :func:`plan_recuts` and
:func:`plan_ahead` plan no other claim there.

Never touches a GPU the caller does not mark recuttable (any device held, anything in use,
inside its cooldown, or a recut under way): the controller decides that from the claims.
Not for: I/O, timers or writing layouts (``tessera.controller.demand`` does those).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from tessera.adaptive.claims import ClaimDemand, Request, Slot, fit
from tessera.adaptive.layouts import MenuOption, menu_devices, slots_of
from tessera.models.catalog import catalog_model
from tessera.models.layout import GpuStatus
from tessera.models.policy import SharingPolicy

ClassSelectors = Mapping[str, Sequence[str]]
LOOKAHEAD = 16  # waiting claims after the one being placed that an option is scored on
HOSTS_KEPT = 4096  # answers kept in MenuCache.hosts


@dataclass(frozen=True)
class AdaptiveGpu:
    """A GPU an ``Adaptive`` policy governs, as the choice needs it."""

    node: str
    gpu: GpuStatus
    policy: SharingPolicy
    current: str | None  # the menu layout in force now (None: none of the menu yet)
    recuttable: bool  # nothing held or in use, cooldown over, no recut under way


@dataclass(frozen=True)
class Recut:
    node: str
    gpu: str  # UUID
    index: int
    policy: str
    layout: str
    claims: tuple[str, ...]  # the pending claims it is for (namespace/name)
    ahead: bool = False  # for claims like these expected soon (:func:`plan_ahead`), not waiting ones

    @property
    def reason(self) -> str:
        if self.ahead:
            return f"recut ahead for claims like {', '.join(self.claims[:3])}"
        return f"recut for claim {', '.join(self.claims)}" if self.claims else "recut"


@dataclass(frozen=True)
class Unsatisfiable:
    claim: str
    message: str


@dataclass(frozen=True)
class RecutPlan:
    recuts: tuple[Recut, ...]
    placed: Mapping[str, tuple[str, ...]]  # claim -> UUIDs of the GPUs it would be placed on
    unsatisfiable: tuple[Unsatisfiable, ...]
    waiting: tuple[str, ...]  # claims that fit some layout, but not on a GPU free now
    fragmentation: Fraction  # of the recut GPUs, after their claims are placed
    kept: Mapping[str, str] = field(default_factory=dict)  # node -> the claim it is kept for (as given)


class MenuCache:
    """Menu devices per (policy, spec, GPU), kept between plans: building them is the cost."""

    def __init__(self) -> None:
        self._options: dict[tuple[str, int, str], list[MenuOption]] = {}
        self._policy_specs: dict[str, int] = {}
        # (claim shape, GPUs as (policy, spec id, model)) -> whether one menu layout on all of
        # them could host the claim: fixed while the policies are (:func:`plan_reservations`).
        self.hosts: dict[tuple[object, ...], bool] = {}

    def options(self, policy: SharingPolicy, gpu: GpuStatus) -> list[MenuOption]:
        key = (policy.name, id(policy.spec), gpu.uuid)
        found = self._options.get(key)
        if found is None:
            if self._policy_specs.get(policy.name) != id(policy.spec):  # the policy changed: forget its GPUs
                self._options = {k: v for k, v in self._options.items() if k[0] != policy.name}
                self._policy_specs[policy.name] = id(policy.spec)
            found = self._options[key] = menu_devices(policy, gpu)
        return found


def fragmentation(slots: Sequence[Slot], recent: Sequence[ClaimDemand], classes: ClassSelectors) -> Fraction:
    """The free share of GPUs on ``slots`` that no claim shape in ``recent`` fits on alone
    (see the module doc). 0 when every free piece is of use to some recent claim."""
    shapes = list({d.shape: d for d in recent}.values())
    total = Fraction(0)
    for slot in slots:
        free = slot.free_fraction()
        if free and not any(fit(shape, [slot], classes) is not None for shape in shapes):
            total += free
    return total


@dataclass
class _Planned:
    gpu: AdaptiveGpu
    option: MenuOption
    claims: list[str] = field(default_factory=list)


def _model_key(gpu: GpuStatus) -> str:
    model = catalog_model(gpu.model, gpu.product_name)
    return model.key if model is not None else gpu.product_name


def plan_recuts(
    pending: Sequence[ClaimDemand],
    gpus: Sequence[AdaptiveGpu],
    classes: ClassSelectors,
    recuts_left: Mapping[str, int],
    *,
    free: Mapping[str, Sequence[Slot]] | None = None,
    recent: Sequence[ClaimDemand] = (),
    reserved: Mapping[str, str] = {},
    menus: MenuCache | None = None,
) -> RecutPlan:
    """Recuts for ``pending`` (oldest first); see the module doc for the rule.

    ``recuts_left``: policy name → GPUs it may still start recutting (its cap less those under
    way). ``free``: node → devices published there now that no claim holds (they may serve a
    claim beside a recut GPU); they are not changed. ``recent``: claims seen lately, for the
    fragmentation score (the pending ones count too). ``reserved``: node → the claim it is kept
    for (:func:`plan_reservations`); no other claim is planned there."""
    menus = menus or MenuCache()
    free = free or {}
    shapes = [*pending, *recent]
    left = dict(recuts_left)
    planned: dict[str, _Planned] = {}  # GPU UUID -> its recut
    leftover: dict[str, list[Slot]] = defaultdict(list)  # node -> slots of its planned recuts
    node_free: dict[str, list[Slot]] = {node: [s.copy() for s in slots] for node, slots in free.items()}
    by_node: dict[str, list[AdaptiveGpu]] = defaultdict(list)
    for g in sorted(gpus, key=lambda g: (g.node, g.gpu.index)):
        by_node[g.node].append(g)
    placed: dict[str, tuple[str, ...]] = {}
    waiting: list[str] = []
    unsatisfiable: list[Unsatisfiable] = []
    fresh_fits: dict[tuple[object, ...], tuple[int, Fraction] | None] = {}
    no_option: set[object] = set()  # claim shapes no new recut can serve in this pass
    never: dict[object, str | None] = {}  # claim shape -> why nothing could ever serve it
    owners = set(reserved.values())

    for position, claim in enumerate(pending):
        following = [c for c in pending[position + 1:position + 1 + LOOKAHEAD] if c.key not in placed]
        # 1. What this plan's recuts leave over.
        done = False
        for node in sorted(leftover):
            if reserved.get(node, claim.key) != claim.key:
                continue
            slots = [*node_free.get(node, []), *leftover[node]]
            used = _place(claim, slots, classes)
            if used is not None:
                for planned_gpu in planned.values():
                    if planned_gpu.gpu.node == node and planned_gpu.gpu.gpu.uuid in used:
                        planned_gpu.claims.append(claim.key)
                placed[claim.key] = tuple(sorted(used))
                done = True
                break
        if done:
            continue
        # 2. New recuts: the fewest GPUs, then the least fragmentation. A shape that found no
        # option finds none later in the pass either (planning only takes GPUs away), except
        # for a claim a node is reserved for: it may go where its shape's others may not.
        best: tuple[tuple[object, ...], str, list[AdaptiveGpu], MenuOption] | None = None
        searching = claim.shape not in no_option or claim.key in owners
        for node, node_gpus in sorted(by_node.items()) if searching else ():
            if reserved.get(node, claim.key) != claim.key:
                continue
            recuttable = [g for g in node_gpus if g.recuttable and g.gpu.uuid not in planned]
            for policy_name in sorted({g.policy.name for g in node_gpus}):
                mine = [g for g in recuttable if g.policy.name == policy_name]
                if not mine or left.get(policy_name, 0) <= 0:
                    continue
                for rank, option in enumerate(menus.options(mine[0].policy, mine[0].gpu)):
                    # Never recut a GPU to the layout it has (its free devices are in the base
                    # already); GPUs away from the idle layout go first, so whole ones stay whole.
                    idle = sorted(
                        (g for g in mine if g.current != option.layout_name),
                        key=lambda g: (g.current == _idle_layout(g), g.gpu.index),
                    )
                    for k in range(1, min(len(idle), left[policy_name]) + 1):
                        chosen = idle[:k]
                        gone = {g.gpu.uuid for g in chosen}
                        base = [*(s for s in node_free.get(node, []) if s.gpu not in gone), *leftover.get(node, [])]
                        verdict = _try(position, claim, following, base, chosen, option, menus, classes, shapes,
                                       fresh_fits)
                        if verdict is None:
                            continue
                        hosted, score = verdict
                        # Ties go to the node with the fewest GPUs free to recut: whole nodes stay whole.
                        cost = (k, -hosted, score, len(recuttable), node, chosen[0].gpu.index, rank)
                        if best is None or cost < best[0]:
                            best = (cost, node, chosen, option)
                        break
        if best is not None:
            _, node, chosen, option = best
            gone = {g.gpu.uuid for g in chosen}
            node_free[node] = [s for s in node_free.get(node, []) if s.gpu not in gone]  # their devices go
            own = len(node_free[node])
            slots = [*node_free[node], *leftover.get(node, [])]  # the same objects: consumed in place
            for g in chosen:
                opt = next(o for o in menus.options(g.policy, g.gpu) if o.layout_name == option.layout_name)
                planned[g.gpu.uuid] = _Planned(g, opt, [claim.key])
                slots.extend(slots_of(opt.devices))
                left[g.policy.name] = left.get(g.policy.name, 0) - 1
            used = _place(claim, slots, classes)
            assert used is not None, "the option was tried on the same slots"
            placed[claim.key] = tuple(sorted(used))
            leftover[node] = slots[own:]
            continue
        # 3. Waits, or can never be satisfied.
        no_option.add(claim.shape)
        if claim.shape not in never:
            never[claim.shape] = _never_satisfiable(claim, gpus, menus, classes)
        why = never[claim.shape]
        if why is None:
            waiting.append(claim.key)
        else:
            unsatisfiable.append(Unsatisfiable(claim.key, why))

    recuts = tuple(
        Recut(p.gpu.node, p.gpu.gpu.uuid, p.gpu.gpu.index, p.gpu.policy.name, p.option.layout_name, tuple(p.claims))
        for p in sorted(planned.values(), key=lambda p: (p.gpu.node, p.gpu.gpu.index))
    )
    score = fragmentation([s for slots in leftover.values() for s in slots], shapes, classes)
    return RecutPlan(recuts, placed, tuple(unsatisfiable), tuple(waiting), score, dict(reserved))


def _idle_layout(gpu: AdaptiveGpu) -> str | None:
    adaptive = gpu.policy.spec.adaptive
    return adaptive.idle if adaptive is not None else None


def _place(claim: ClaimDemand, slots: list[Slot], classes: ClassSelectors) -> set[str] | None:
    """Fit ``claim`` on ``slots``, consuming them; the GPUs whose devices it took from."""
    before = [(s.taken, dict(s.free)) for s in slots]
    if fit(claim, slots, classes, consume=True) is None:
        return None
    return {s.gpu for s, (taken, free) in zip(slots, before, strict=True) if (s.taken, s.free) != (taken, free)}


def _try(
    position: int,
    claim: ClaimDemand,
    following: Sequence[ClaimDemand],
    base: list[Slot],
    chosen: list[AdaptiveGpu],
    option: MenuOption,
    menus: MenuCache,
    classes: ClassSelectors,
    shapes: Sequence[ClaimDemand],
    memo: dict[tuple[object, ...], tuple[int, Fraction] | None],
) -> tuple[int, Fraction] | None:
    """None when ``claim`` does not fit ``chosen`` recut to ``option`` beside ``base``; else how
    many of the ``following`` waiting claims the rest would also host (first fit, in order),
    and the fragmentation of the recut GPUs after them. Without ``base`` the answer depends
    only on the claim's place in the queue, the GPUs' model, the layout and how many, so it is
    remembered across nodes."""
    # The base enters the key by what it offers (device names and what is left of them), not
    # by node: nodes alike in what is free answer alike.
    signature = tuple((s.name, s.taken, tuple(sorted(s.free.items()))) for s in base)
    key = (position, chosen[0].policy.name, option.layout_name, _model_key(chosen[0].gpu), len(chosen), signature)
    if key in memo:
        return memo[key]
    slots = [s.copy() for s in base]
    for g in chosen:
        opt = next((o for o in menus.options(g.policy, g.gpu) if o.layout_name == option.layout_name), None)
        if opt is None:
            return None
        slots.extend(slots_of(opt.devices))
    verdict: tuple[int, Fraction] | None = None
    if fit(claim, slots, classes, consume=True) is not None:
        hosted = sum(1 for other in following if fit(other, slots, classes, consume=True) is not None)
        verdict = (hosted, fragmentation(slots[len(base):], shapes, classes))
    memo[key] = verdict
    return verdict


def _never_satisfiable(
    claim: ClaimDemand, gpus: Sequence[AdaptiveGpu], menus: MenuCache, classes: ClassSelectors
) -> str | None:
    """Why no menu layout on any adaptive GPU could ever satisfy ``claim`` (every GPU of a
    node and policy idle and recut alike), or None when one could."""
    if _fits_somewhere(claim, gpus, menus, classes):
        return None
    policies = sorted({g.policy.name for g in gpus})
    where = f"the menus of {', '.join(policies)}" if policies else "no Adaptive policy (none selects a GPU)"
    for request in claim.requests:
        alone = ClaimDemand(claim.namespace, claim.name, (request,))
        if not _fits_somewhere(alone, gpus, menus, classes):
            return (
                f"{_describe(request)} fits no device that any layout in {where} would publish on any GPU; "
                "change the request or add a layout that fits it"
            )
    return (
        f"the claim's requests fit no layout in {where} together (constraints "
        f"{', '.join(c.match_attribute or c.distinct_attribute or '?' for c in claim.constraints) or 'none'})"
    )


def _describe(request: Request) -> str:
    return " or ".join(sub.describe() for sub in request.alternatives)


def _fits_somewhere(claim: ClaimDemand, gpus: Sequence[AdaptiveGpu], menus: MenuCache, classes: ClassSelectors) -> bool:
    groups: dict[tuple[str, str], list[AdaptiveGpu]] = defaultdict(list)
    for g in gpus:
        groups[(g.node, g.policy.name)].append(g)
    tried: set[tuple[object, ...]] = set()
    for group in groups.values():
        first = group[0]
        for option in menus.options(first.policy, first.gpu):
            key = (first.policy.name, option.layout_name, _model_key(first.gpu), len(group))
            if key in tried:
                continue
            tried.add(key)
            slots: list[Slot] = []
            for g in group:
                opt = next((o for o in menus.options(g.policy, g.gpu) if o.layout_name == option.layout_name), None)
                if opt is not None:
                    slots.extend(slots_of(opt.devices))
            if fit(claim, slots, classes) is not None:
                return True
    return False


@dataclass(frozen=True)
class AheadPlan:
    recuts: tuple[Recut, ...]  # GPUs to recut now for the claims expected
    keep: frozenset[str]  # UUIDs of free GPUs the expected claims would use as they are


def plan_ahead(
    expected: Sequence[ClaimDemand],
    gpus: Sequence[AdaptiveGpu],
    classes: ClassSelectors,
    recuts_left: Mapping[str, int],
    *,
    free: Mapping[str, Sequence[Slot]],
    busy: Collection[str] = (),
    lately: Sequence[ClaimDemand] = (),
    reserved: Collection[str] = (),
    menus: MenuCache | None = None,
) -> AheadPlan:
    """Recuts ahead of demand: the claims ``expected`` within the time a recut takes (the
    caller passes those that arrived within the last such span: the next span is forecast to
    bring claims like them) are placed, first fit in order, on the ``free`` devices (node →
    devices no claim holds, of GPUs not being recut); those that fit nowhere get recuts from
    :func:`plan_recuts`, among GPUs not in ``busy`` (planned already for waiting claims), within
    ``recuts_left``. So a claim like the recent ones finds a device published when it comes,
    instead of waiting the debounce and a recut while whole GPUs sit free. The GPUs the
    expected claims would use as they are are kept (:func:`back_to_idle` leaves them).

    ``lately``: the claims that arrived within the cooldown before the lead time (older than
    ``expected``). They never cause a recut, but the free devices they would use as they are
    are kept too, after the expected claims have taken theirs. That is the hysteresis: a GPU is
    recut ahead on the short lead time but given back to idle only when a whole cooldown
    brought no claim it could serve. Keeping on the lead time alone made the sliding window
    flap a GPU (ahead, back to idle, ahead again) at two recuts a cooldown.

    ``reserved``: nodes kept for waiting claims (:func:`plan_reservations`): none of their
    devices or GPUs is counted on or recut here."""
    menus = menus or MenuCache()
    free = {node: slots for node, slots in free.items() if node not in reserved}
    pool = [[s.copy() for s in slots] for _, slots in sorted(free.items())]
    keep: set[str] = set()
    # First fit, node by node. The pool only shrinks, so a node a shape did not fit on never
    # fits it later in the call: each shape resumes at the node it last fit on.
    start: dict[object, int] = {}

    def first_fit(claim: ClaimDemand) -> bool:
        for at in range(start.get(claim.shape, 0), len(pool)):
            used = _place(claim, pool[at], classes)
            if used is not None:
                keep.update(used)
                start[claim.shape] = at
                return True
        start[claim.shape] = len(pool)
        return False

    unserved = [claim for claim in expected if not first_fit(claim)]
    for claim in lately:
        first_fit(claim)
    if not unserved:
        return AheadPlan((), frozenset(keep))
    out = set(busy) | keep
    candidates = [g if g.gpu.uuid not in out and g.node not in reserved
                  else AdaptiveGpu(g.node, g.gpu, g.policy, g.current, False) for g in gpus]
    left = {node: [s for s in slots if s.gpu not in out] for (node, _), slots in zip(sorted(free.items()), pool,
                                                                                    strict=True)}
    plan = plan_recuts(unserved, candidates, classes, recuts_left, free=left, menus=menus)
    recuts = tuple(Recut(r.node, r.gpu, r.index, r.policy, r.layout, r.claims, ahead=True) for r in plan.recuts)
    return AheadPlan(recuts, frozenset(keep))


def back_to_idle(gpus: Sequence[AdaptiveGpu], plan: RecutPlan, *, keep: Collection[str] = ()) -> list[AdaptiveGpu]:
    """GPUs to return to their policy's idle layout: recuttable (so free and past their
    cooldown), on another menu layout, not just planned for a claim by ``plan``, and not in
    ``keep`` (UUIDs: those :func:`plan_ahead` expects claims like the recent ones to use, or
    recuts ahead). The cooldown is what keeps alternating demand from flapping a GPU: at most
    one recut each way per cooldown."""
    planned = {r.gpu for r in plan.recuts} | set(keep)
    out = []
    for g in gpus:
        adaptive = g.policy.spec.adaptive
        if adaptive is None or not g.recuttable or g.current == adaptive.idle or g.gpu.uuid in planned:
            continue
        out.append(g)
    return out


@dataclass(frozen=True)
class Reservation:
    """A node kept for one waiting claim that needs several GPUs of it (a gang)."""

    node: str
    claim: str  # namespace/name
    ready: bool  # the claim fits the node's free devices now: publish them untainted for the scheduler


def plan_reservations(
    pending: Sequence[ClaimDemand],
    gpus: Sequence[AdaptiveGpu],
    classes: ClassSelectors,
    *,
    free: Mapping[str, Sequence[Slot]],
    busy: Collection[str],
    previous: Mapping[str, str] = {},
    limit: int,
    menus: MenuCache | None = None,
) -> list[Reservation]:
    """Nodes to drain for the waiting claims no single GPU can host (oldest first, at most
    ``limit`` nodes): while one waits, its node's free devices are published tainted, so new
    claims go elsewhere and the node empties as its claims end, instead of a gang claim waiting
    for a node to empty by chance while small claims keep landing on every freed GPU.

    A claim keeps the node it had (``previous``: claim → node) while that node could still host
    it; a new one gets, among the nodes whose Adaptive GPUs could host it once emptied and that
    no other claim has, the one with the fewest ``busy`` GPUs (UUIDs of GPUs any claim holds or
    uses), then by name. ``ready`` when the claim fits the node's ``free`` devices (node →
    devices no claim holds, of GPUs not being recut) as they are now: then they are published
    untainted and the scheduler places it (or a recut the plan makes for it does)."""
    menus = menus or MenuCache()
    by_node: dict[str, list[AdaptiveGpu]] = defaultdict(list)
    for g in gpus:
        by_node[g.node].append(g)
    kinds = {node: tuple(sorted(_kind(g) for g in node_gpus)) for node, node_gpus in by_node.items()}
    singles = {_kind(g): g for g in gpus}  # one GPU of each kind
    out: list[Reservation] = []
    taken: set[str] = set()
    hosts: dict[object, list[str]] = {}  # claim shape -> nodes that could host it emptied

    def could_host(claim: ClaimDemand, node_gpus: Sequence[AdaptiveGpu], kind: tuple[object, ...]) -> bool:
        key = (claim.shape, kind)
        if key not in menus.hosts:
            if len(menus.hosts) >= HOSTS_KEPT:  # claims of ever new shapes must not grow it for good
                menus.hosts.clear()
            menus.hosts[key] = _fits_somewhere(claim, node_gpus, menus, classes)
        return menus.hosts[key]

    for claim in pending:
        if len(out) >= limit:
            break
        if any(could_host(claim, [g], (kind,)) for kind, g in singles.items()):
            continue  # one GPU can host it: any GPU that frees up serves it, nothing to drain
        if claim.shape not in hosts:
            hosts[claim.shape] = [node for node, node_gpus in sorted(by_node.items())
                                  if could_host(claim, node_gpus, kinds[node])]
        candidates = [node for node in hosts[claim.shape] if node not in taken]
        if not candidates:
            continue
        node = previous.get(claim.key)
        if node not in candidates:
            node = min(candidates, key=lambda n: (sum(g.gpu.uuid in busy for g in by_node[n]), n))
        taken.add(node)
        ready = fit(claim, list(free.get(node, ())), classes) is not None  # fit changes no slot unless told to
        out.append(Reservation(node, claim.key, ready))
    return out


def _kind(gpu: AdaptiveGpu) -> tuple[str, int, str]:
    """What a GPU's menu devices depend on: its policy (as now) and its model."""
    return (gpu.policy.name, id(gpu.policy.spec), _model_key(gpu.gpu))
