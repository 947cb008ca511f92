"""Desired slices vs the slices that exist → the fewest API writes, and the pool generation.

Comparison sees only what Tessera writes: spec (quantities by value, missing = empty, taint
``timeAdded`` ignored when we leave it to the apiserver), our labels and our owner
reference. Server-set fields (uid, resourceVersion, metadata.generation, managedFields,
creationTimestamp, other people's labels) never cause a write.

Pool generation (``ResourcePool`` docs: consumers use only the slices of the highest
generation, and count them against ``resourceSliceCount``) — the same rule as the
resourceslice controller in ``k8s.io/dynamic-resource-allocation``:

- Same slice names as exist, and at most one slice differs → keep the generation and
  update that one slice. One write is atomic, so a consumer never sees a mixed pool.
- Anything else (a slice to create or delete — the count changes —, two or more slices
  that differ, or existing slices of mixed generations that cannot be fixed by one write)
  → generation = highest existing + 1 and *every* desired slice is written (updated or
  created), obsolete ones deleted; until the last write lands the scheduler sees an
  incomplete pool and waits, never a wrong one.
- Nothing differs → an empty plan.

Apply a plan in the order given: ``deletes``, then ``updates`` (PUT, ``resourceVersion``
set: a conflict means someone wrote in between — re-list and re-plan), then ``creates``.
Not for: building slices (``tessera.dra.slices``) or calling the API (the controller).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tessera.dra.devices import DRIVER
from tessera.dra.slices import ResourceSlice
from tessera.models.quantity import quantity_value

_QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step"})


@dataclass(frozen=True, slots=True)
class SliceRef:
    """An existing slice to delete, with the preconditions that make the delete safe."""

    name: str
    uid: str | None = None
    resource_version: str | None = None

    @classmethod
    def of(cls, resource_slice: ResourceSlice) -> SliceRef:
        meta = resource_slice.get("metadata", {})
        return cls(meta["name"], meta.get("uid"), meta.get("resourceVersion"))


@dataclass(frozen=True, slots=True)
class SlicePlan:
    """The writes that turn the existing pool into the desired one."""

    generation: int
    creates: tuple[ResourceSlice, ...] = ()
    updates: tuple[ResourceSlice, ...] = ()
    deletes: tuple[SliceRef, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)

    @property
    def writes(self) -> int:
        return len(self.creates) + len(self.updates) + len(self.deletes)


def _normal(value: Any, key: str | None = None, *, in_values: bool = False) -> Any:
    """A comparable form: quantities as numbers, empty containers and None dropped."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            n = _kept(_normal(v, k, in_values=False))
            if n is not None:
                out[k] = n
        return out
    if isinstance(value, list):
        return [_normal(v, key, in_values=key == "validValues") for v in value]
    if isinstance(value, str) and (key in _QUANTITY_KEYS or in_values):
        try:
            return quantity_value(value)
        except ValueError:
            return value
    if isinstance(value, int) and not isinstance(value, bool) and (key in _QUANTITY_KEYS or in_values):
        return Fraction(value)
    return value


def _taint_key(device: str, taint: dict[str, Any]) -> tuple[str, str, str, str]:
    return (device, str(taint.get("key")), str(taint.get("value", "")), str(taint.get("effect")))


def _existing_taint_times(existing: ResourceSlice) -> dict[tuple[str, str, str, str], str]:
    times = {}
    for device in existing.get("spec", {}).get("devices") or []:
        for taint in device.get("taints") or []:
            if taint.get("timeAdded"):
                times[_taint_key(device["name"], taint)] = taint["timeAdded"]
    return times


def carry_taint_times(desired: ResourceSlice, existing: ResourceSlice | None) -> ResourceSlice:
    """``desired`` with the ``timeAdded`` of every taint that already exists on the same
    device (same key, value, effect), so a taint keeps the time it was first added. The
    result has metadata of its own (callers add to it); devices it leaves alone are shared."""
    out = {**desired, "metadata": dict(desired["metadata"])}
    times = _existing_taint_times(existing) if existing else {}
    if not times:
        return out
    devices = []
    for device in desired.get("spec", {}).get("devices") or []:
        taints = device.get("taints") or []
        if any("timeAdded" not in t and _taint_key(device["name"], t) in times for t in taints):
            device = {**device, "taints": [
                {**t, "timeAdded": times[k]} if "timeAdded" not in t and (k := _taint_key(device["name"], t)) in times
                else t
                for t in taints
            ]}
        devices.append(device)
    out["spec"] = {**desired["spec"], "devices": devices}
    return out


def _kept(value: Any) -> Any:
    """What a dict entry is worth in the comparable form: empty and None are the same as absent."""
    return None if value in (None, {}, []) else value


def _same(have: Any, want: Any, key: str | None = None, *, in_values: bool = False) -> bool:
    """Whether ``have`` (as stored) and ``want`` (as built) are equal in the comparable form of
    :func:`_normal`, a taint's ``timeAdded`` ignored where ``want`` leaves it to the server.

    It walks both at once and goes down only where they differ as they are (equal parts are
    compared in C), so a slice the server gave back as written costs one comparison, and a
    changed one only its changed devices. Normalising every field instead was two thirds of the
    operator's CPU on a restart over MIG nodes."""
    if have == want:
        return True
    if isinstance(have, dict) and isinstance(want, dict):
        for k in have.keys() | want.keys():
            h, w = have.get(k), want.get(k)
            if h == w or (k == "timeAdded" and key == "taints" and w is None):
                continue
            if (isinstance(h, dict) and isinstance(w, dict)) or (isinstance(h, list) and isinstance(w, list)):
                if not _same(h, w, k):
                    return False
            elif _kept(_normal(h, k)) != _kept(_normal(w, k)):
                return False
        return True
    if isinstance(have, list) and isinstance(want, list):
        values = key == "validValues"
        return len(have) == len(want) and all(
            _same(h, w, key, in_values=values) for h, w in zip(have, want, strict=True)
        )
    return bool(_normal(have, key, in_values=in_values) == _normal(want, key, in_values=in_values))


def slice_differs(existing: ResourceSlice, desired: ResourceSlice) -> bool:
    """Whether writing ``desired`` would change ``existing`` in anything Tessera manages."""
    if not _same(existing.get("spec", {}), desired["spec"]):
        return True
    meta, want = existing.get("metadata", {}), desired["metadata"]
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in (want.get("labels") or {}).items()):
        return True
    owners = {(o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or []}
    return any((o["kind"], o["name"], o["uid"]) not in owners for o in want.get("ownerReferences") or [])


def _with_generation(desired: ResourceSlice, generation: int) -> ResourceSlice:
    """``desired`` with ``generation``; shares everything else with it (nothing edits either)."""
    spec = desired["spec"]
    return {**desired, "spec": {**spec, "pool": {**spec["pool"], "generation": generation}}}


def _update_body(desired: ResourceSlice, existing: ResourceSlice) -> ResourceSlice:
    body = carry_taint_times(desired, existing)
    meta = existing.get("metadata", {})
    labels = {**(meta.get("labels") or {}), **(body["metadata"].get("labels") or {})}
    body["metadata"]["labels"] = dict(sorted(labels.items()))
    if meta.get("annotations"):
        body["metadata"]["annotations"] = meta["annotations"]
    if meta.get("resourceVersion"):
        body["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return body


def pool_slices(existing: Sequence[ResourceSlice], pool: str, driver: str = DRIVER) -> list[ResourceSlice]:
    """The slices of ``existing`` that belong to ``driver``'s pool ``pool``."""
    return [
        s
        for s in existing
        if s.get("spec", {}).get("driver") == driver and (s.get("spec", {}).get("pool") or {}).get("name") == pool
    ]


def plan_slice_writes(pool: str, desired: Sequence[ResourceSlice], existing: Sequence[ResourceSlice]) -> SlicePlan:
    """The writes that make the pool ``pool`` (a node name) hold exactly ``desired``.

    ``desired``: that node's slices from ``build_node_slices`` (generation left at 0).
    ``existing``: the slices the API returned (those of other pools or drivers are ignored;
    list them with the field selector ``spec.driver=gpu.tessera.dev,spec.nodeName=<node>``)."""
    current = _by_name(pool_slices(existing, pool))
    if not desired:
        return SlicePlan(0, deletes=tuple(SliceRef.of(current[n]) for n in sorted(current)))
    if any(d["spec"]["pool"]["name"] != pool for d in desired):
        raise ValueError(f"desired slices must all belong to pool {pool!r}")
    generation = max((int(s["spec"]["pool"].get("generation", 0)) for s in current.values()), default=0)
    wanted = {str(d["metadata"]["name"]): d for d in desired}
    obsolete = sorted(set(current) - set(wanted))
    missing = sorted(set(wanted) - set(current))
    changed = sorted(
        n for n in wanted if n in current and slice_differs(current[n], _with_generation(wanted[n], generation))
    )
    deletes = tuple(SliceRef.of(current[n]) for n in obsolete)
    if not obsolete and not missing and len(changed) <= 1:
        updates = tuple(_update_body(_with_generation(wanted[n], generation), current[n]) for n in changed)
        return SlicePlan(generation, updates=updates)
    generation += 1
    return SlicePlan(
        generation,
        creates=tuple(_with_generation(wanted[n], generation) for n in missing),
        updates=tuple(
            _update_body(_with_generation(wanted[n], generation), current[n]) for n in sorted(wanted) if n in current
        ),
        deletes=deletes,
    )


def _by_name(slices: Sequence[ResourceSlice]) -> dict[str, ResourceSlice]:
    return {str(s["metadata"]["name"]): s for s in slices}
