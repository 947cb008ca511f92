"""A ResourceClaim's requests as values, and whether a set of devices can satisfy them.

:func:`claim_demand` reads a claim body (``resource.k8s.io/v1``) into a :class:`ClaimDemand`:
its requests (``exactly``, or ``firstAvailable`` alternatives tried in order), each with a
device class, CEL selectors, an allocation mode and count, and ``capacity.requests``; and its
``matchAttribute`` / ``distinctAttribute`` constraints. :func:`fit` answers whether those
requests can all be satisfied at once from a pool of :class:`Slot` (devices as they would be
published, with what is left of their consumable capacity), the way the scheduler's allocator
decides it: a device must pass its class's selectors and the request's, carry no taint, have
the capacity asked for (on a shared device: rounded up by the capacity's ``requestPolicy``,
and every capacity not asked for consumes the policy's default); requests in order, each
request's alternatives in order, devices in publication order, first solution wins.

CEL goes through ``tessera.planner.selector`` (the ``gpuSelector`` path) on the wire device
(:func:`~tessera.planner.selector.flat_published_device`), so a claim here sees exactly the
attributes and capacities the publisher writes.
Not for: reading claims from the API, or deciding recuts (``tessera.adaptive.choose``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera import DRIVER_NAME
from tessera.models.quantity import quantity_value
from tessera.planner.selector import (
    CompiledGpuSelector,
    FlatDevice,
    GpuSelectorError,
    compile_gpu_selector,
    flat_published_device,
)

ALL = -1  # allocationMode All: every matching device
_SEARCH_LIMIT = 20_000  # device tries per fit, so a hostile claim cannot stall a pass


@dataclass(frozen=True)
class Subrequest:
    """One way to satisfy a request: its ``exactly`` part, or one ``firstAvailable`` entry."""

    name: str  # "gpu", or "gpu/small" for a firstAvailable entry
    device_class: str
    selectors: tuple[str, ...] = ()
    count: int = 1  # ALL: allocationMode All
    capacity: tuple[tuple[str, Fraction], ...] = ()  # (capacity name, amount asked), sorted

    def describe(self) -> str:
        parts = [f"class {self.device_class}", "all devices" if self.count == ALL else f"count {self.count}"]
        parts += [f"{name} {_show(amount)}" for name, amount in self.capacity]
        parts += [f"selector {s!r}" for s in self.selectors]
        return f"request {self.name!r} ({', '.join(parts)})"


@dataclass(frozen=True)
class Request:
    name: str
    alternatives: tuple[Subrequest, ...]


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True)
class ClaimDemand:
    """An unallocated claim on Tessera's device classes, as the planning room reads it."""

    namespace: str
    name: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def shape(self) -> tuple[tuple[Request, ...], tuple[Constraint, ...]]:
        """What the claim asks for, without whose it is: equal for claims that fit alike."""
        return (self.requests, self.constraints)


def _show(amount: Fraction) -> str:
    return str(amount.numerator) if amount.denominator == 1 else str(float(amount))


def _subrequest(name: str, body: Mapping[str, Any]) -> Subrequest:
    selectors = tuple(
        str(s["cel"]["expression"]) for s in body.get("selectors") or () if (s.get("cel") or {}).get("expression")
    )
    mode = body.get("allocationMode") or "ExactCount"
    count = ALL if mode == "All" else int(body.get("count") or 1)
    asked = ((body.get("capacity") or {}).get("requests")) or {}
    capacity = tuple(sorted((str(k).rpartition("/")[2], quantity_value(str(v))) for k, v in asked.items()))
    return Subrequest(name, str(body.get("deviceClassName", "")), selectors, count, capacity)


def claim_demand(body: Mapping[str, Any], classes: Collection[str]) -> ClaimDemand | None:
    """The claim as demand, or None when it is allocated already, or asks (in any request or
    alternative) for a device class that is not one of ``classes`` (Tessera's): another
    driver's claims are not ours to satisfy, and a claim that mixes drivers cannot be
    satisfied by recutting GPUs alone."""
    meta = body.get("metadata") or {}
    if (body.get("status") or {}).get("allocation"):
        return None
    devices = (body.get("spec") or {}).get("devices") or {}
    requests: list[Request] = []
    for raw in devices.get("requests") or ():
        name = str(raw.get("name", ""))
        if raw.get("firstAvailable"):
            alternatives = tuple(_subrequest(f"{name}/{sub.get('name', '')}", sub) for sub in raw["firstAvailable"])
        elif raw.get("exactly"):
            alternatives = (_subrequest(name, raw["exactly"]),)
        else:
            return None
        if any(a.device_class not in classes for a in alternatives) or (raw.get("exactly") or {}).get("adminAccess"):
            return None  # another driver's class, or a monitoring claim that takes nothing
        requests.append(Request(name, alternatives))
    if not requests:
        return None
    constraints = tuple(
        Constraint(
            tuple(str(r) for r in c.get("requests") or ()),
            c.get("matchAttribute"),
            c.get("distinctAttribute"),
        )
        for c in devices.get("constraints") or ()
    )
    return ClaimDemand(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        tuple(requests),
        constraints,
        str(meta.get("uid", "")),
    )


# ---------------------------------------------------------------- devices and their capacity


@dataclass
class Slot:
    """A device that may be allocated, and what is left of it.

    ``gpu`` is the UUID of the GPU it belongs to; ``fraction`` is the share of that GPU it stands
    for (1 for a whole GPU, memory slices / 8 for a MIG instance). A shared device
    (``allowMultipleAllocations``) keeps its free capacity; any other device is taken whole."""

    gpu: str
    device: Mapping[str, Any]
    flat: FlatDevice
    fraction: Fraction
    shared: bool
    total: dict[str, Fraction]
    free: dict[str, Fraction]
    taken: bool = False
    verdicts: dict[tuple[str, ...], bool] = field(default_factory=dict)  # selectors -> pass; shared by copies

    @property
    def name(self) -> str:
        return str(self.device["name"])

    @property
    def usable(self) -> bool:
        return not self.taken and not self.device.get("taints")

    def free_fraction(self) -> Fraction:
        """The part of its GPU this device still has to give."""
        if self.taken:
            return Fraction(0)
        if not self.shared:
            return self.fraction
        limiting = [self.free[n] / self.total[n] for n in self.total if self.total[n] > 0 and _has_policy(self, n)]
        return self.fraction * (min(limiting) if limiting else Fraction(1))

    def copy(self) -> Slot:
        return Slot(self.gpu, self.device, self.flat, self.fraction, self.shared, self.total, dict(self.free),
                    self.taken, self.verdicts)


def _has_policy(slot: Slot, name: str) -> bool:
    """Capacities that cap how many claims share a device (``shares``, ``compute``, MPS memory),
    as opposed to an advisory one whose default is nothing (time-sliced memory)."""
    policy = slot.device["capacity"][name].get("requestPolicy") or {}
    return bool(policy) and quantity_value(str(policy.get("default", "0"))) > 0


def slot_of(gpu: str, device: Mapping[str, Any], fraction: Fraction) -> Slot:
    """A freshly published device: nothing of it consumed."""
    total = {name: quantity_value(str(c["value"])) for name, c in device.get("capacity", {}).items()}
    return Slot(gpu, device, flat_published_device(device), fraction, bool(device.get("allowMultipleAllocations")),
                total, dict(total))


def _consumption(slot: Slot, asked_pairs: tuple[tuple[str, Fraction], ...]) -> dict[str, Fraction] | None:
    """What one allocation of ``slot`` for ``asked`` consumes, or None when it cannot have it."""
    asked = dict(asked_pairs)
    if not slot.shared:
        if any(name not in slot.total or slot.total[name] < amount for name, amount in asked.items()):
            return None
        return {}
    out: dict[str, Fraction] = {}
    for name, total in slot.total.items():
        policy = slot.device["capacity"][name].get("requestPolicy")
        want = asked.get(name)
        if policy is None:
            amount: Fraction | None = total if want is None or want <= total else None
        else:
            amount = _by_policy(policy, want)
        if amount is None or amount > slot.free[name]:
            return None
        out[name] = amount
    if any(name not in slot.total for name in asked):
        return None
    return out


def _by_policy(policy: Mapping[str, Any], want: Fraction | None) -> Fraction | None:
    """KEP-5075's rounding: the default when nothing is asked; else the smallest valid value at
    least ``want`` (validValues), or ``want`` raised to min and rounded up to a step (validRange)."""
    if want is None:
        return quantity_value(str(policy["default"]))
    values = policy.get("validValues")
    if values:
        fitting = [v for v in (quantity_value(str(x)) for x in values) if v >= want]
        return min(fitting) if fitting else None
    valid = policy.get("validRange") or {}
    low = quantity_value(str(valid.get("min", "0")))
    amount = max(want, low)
    if valid.get("step"):
        step = quantity_value(str(valid["step"]))
        amount = low + math.ceil((amount - low) / step) * step
    if valid.get("max") is not None and amount > quantity_value(str(valid["max"])):
        return None
    return amount


# ---------------------------------------------------------------- selectors


def _selector(source: str) -> CompiledGpuSelector | None:
    try:
        return compile_gpu_selector(source)
    except GpuSelectorError:
        return None


def _passes(sources: tuple[str, ...], slot: Slot) -> bool:
    """Every selector gives true; one that does not compile or fails on the device does not
    select it (the scheduler would not allocate it either). Remembered per device."""
    verdict = slot.verdicts.get(sources)
    if verdict is None:
        verdict = slot.verdicts[sources] = _evaluate(sources, slot)
    return verdict


def _evaluate(sources: tuple[str, ...], slot: Slot) -> bool:
    for source in sources:
        selector = _selector(source)
        if selector is None:
            return False
        try:
            if not selector.matches_flat(slot.flat):
                return False
        except GpuSelectorError:
            return False
    return True


def _candidates(sub: Subrequest, slots: Sequence[Slot], class_selectors: Mapping[str, Sequence[str]]) -> list[int]:
    wanted = (*class_selectors.get(sub.device_class, ()), *sub.selectors)
    if sub.device_class not in class_selectors:
        return []
    return [i for i, slot in enumerate(slots) if slot.usable and _passes(wanted, slot)]


# ---------------------------------------------------------------- the search


@dataclass(frozen=True)
class Fit:
    """A solution: per (sub)request, the devices it gets (publication names, in order)."""

    picks: tuple[tuple[str, tuple[int, ...]], ...]  # (subrequest name, slot indexes)


def fit(
    demand: ClaimDemand, slots: list[Slot], class_selectors: Mapping[str, Sequence[str]], *, consume: bool = False
) -> Fit | None:
    """The first way ``slots`` satisfy every request of ``demand`` together, or None.

    With ``consume`` the slots are changed as the allocation would change them (devices taken,
    shared capacity consumed), so the next claim sees what is left."""
    budget = [_SEARCH_LIMIT]
    state = [s.copy() for s in slots]
    chosen: list[tuple[Subrequest, tuple[int, ...]]] = []
    found = _search(demand, 0, state, class_selectors, chosen, budget)
    if found is None:
        return None
    if consume:
        for sub, indexes in found:
            for i in indexes:
                _take(slots[i], sub.capacity)
    return Fit(tuple((sub.name, idx) for sub, idx in found))


def _take(slot: Slot, asked: tuple[tuple[str, Fraction], ...]) -> None:
    used = _consumption(slot, asked)
    if used is None:
        raise AssertionError(f"{slot.name} cannot give {dict(asked)}")
    if not slot.shared:
        slot.taken = True
    for name, amount in used.items():
        slot.free[name] -= amount


def _search(
    demand: ClaimDemand,
    at: int,
    state: list[Slot],
    class_selectors: Mapping[str, Sequence[str]],
    chosen: list[tuple[Subrequest, tuple[int, ...]]],
    budget: list[int],
) -> list[tuple[Subrequest, tuple[int, ...]]] | None:
    if at == len(demand.requests):
        return list(chosen) if _constraints_hold(demand, chosen, state) else None
    for sub in demand.requests[at].alternatives:
        candidates = _candidates(sub, state, class_selectors)
        if sub.count == ALL:
            usable = [i for i in candidates if _consumption(state[i], sub.capacity) is not None]
            options: list[tuple[int, ...]] = [tuple(usable)] if usable and len(usable) == len(candidates) else []
            combos = iter(options)
        else:
            combos = _combinations(sub, candidates, state, budget)
        for combo in combos:
            saved = [state[i].copy() for i in combo]
            for i in combo:
                _take(state[i], sub.capacity)
            chosen.append((sub, combo))
            found = _search(demand, at + 1, state, class_selectors, chosen, budget)
            chosen.pop()
            for i, old in zip(combo, saved, strict=True):
                state[i] = old
            if found is not None:
                return found
            if budget[0] <= 0:
                return None
    return None


def _combinations(sub: Subrequest, candidates: list[int], state: list[Slot], budget: list[int]) -> Any:
    """``count`` distinct devices that can each give ``sub`` its capacity, in publication
    order (first fit), lazily."""

    def walk(start: int, picked: list[int]) -> Any:
        if len(picked) == sub.count:
            yield tuple(picked)
            return
        for pos in range(start, len(candidates)):
            budget[0] -= 1
            if budget[0] <= 0:
                return
            i = candidates[pos]
            if _consumption(state[i], sub.capacity) is None:
                continue
            picked.append(i)
            yield from walk(pos + 1, picked)
            picked.pop()

    return walk(0, [])


def _attribute(slot: Slot, name: str) -> object:
    qualified = name.removeprefix(f"{DRIVER_NAME}/")
    value = slot.flat.get(qualified)
    return None if value is None else value[1]


def _constraints_hold(
    demand: ClaimDemand, chosen: Sequence[tuple[Subrequest, tuple[int, ...]]], state: Sequence[Slot]
) -> bool:
    for constraint in demand.constraints:
        named = set(constraint.requests)
        picked = [
            state[i]
            for sub, idx in chosen
            for i in idx
            if not named or sub.name in named or sub.name.partition("/")[0] in named
        ]
        if constraint.match_attribute:
            values = {_attribute(s, constraint.match_attribute) for s in picked}
            if None in values or len(values) > 1:
                return False
        if constraint.distinct_attribute:
            values_list = [_attribute(s, constraint.distinct_attribute) for s in picked]
            if None in values_list or len(set(values_list)) != len(values_list):
                return False
    return True


def class_selectors(classes: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """DeviceClass name → its CEL selectors, from DeviceClass objects (``tessera.dra.deviceclasses``
    gives Tessera's)."""
    return {
        str(c["metadata"]["name"]): tuple(
            str(s["cel"]["expression"]) for s in (c.get("spec") or {}).get("selectors") or () if s.get("cel")
        )
        for c in classes
    }
