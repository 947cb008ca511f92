"""The one owner of Tessera's ResourceSlices: each node's devices in, the fewest writes out.

Like the upstream resourceslice controller, it keeps a cache of our slices per pool (one
pool per node), plans against it (``tessera.dra.diff``), and applies the watch's events to
it: a change someone else made (the kubelet wipes a driver's slices when its plugin goes
away; a person deletes one) makes the pool be planned again from the truth; the echo of our
own writes changes nothing. The cache is filled by the slice watch's first list; at start,
slices whose node has gone are deleted.

Our own echoes are told apart even when the watch is faster than the write's answer (it often
is: the apiserver sends the event and the response at once). While a write to a slice is in
flight, the watch's events for that slice are kept in the cache but set aside; once the answer
comes, those that are our write's own version are its echo, and any other version (someone
else wrote around ours) has the pool planned again through ``replan``. So a rollout reconciles
each node for what it asked, not once more per echo that overtook an answer.

The cache is kept small and a publish that changes nothing cheap, because a fleet holds
thousands of slices and every reconcile publishes:
- each slice is kept as compact JSON without ``managedFields``, zlib-compressed (parsed, a
  slice costs about ten times its JSON; compressed, about a quarter of it: 8 MIG slices are
  ~6 KiB a node instead of ~26 KiB), and unpacked only when a plan needs it (a few tens of
  microseconds, rare: see the next point);
- each slice remembers the digest of the built slice it is known to match (the one we wrote
  at that resourceVersion, or one a full comparison found equal), so publishing the same
  devices again is a digest per slice instead of a comparison of every field.

Not for: deciding what a node publishes or when drain taints go on (``decide``, ``runtime``),
building devices or slices (``tessera.dra``), or the watch itself (``tessera.kube.watch``).
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from tessera.dra.devices import DRIVER, GpuDevices
from tessera.dra.diff import plan_slice_writes
from tessera.dra.slices import MANAGED_BY, MANAGED_BY_LABEL, NodeRef, ResourceSlice, build_slices_from_devices
from tessera.kube.http import ApiError
from tessera.kube.objects import Api
from tessera.kube.watch import metadata_stub, without_managed_fields

log = structlog.get_logger("tessera.operator")

OURS = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
PACK_LEVEL = 6  # zlib level of the cached slices: as fast as level 1 on slices this small, and smaller

# Makes one API write, counted under ``what`` (the metric label), and returns its result.
Writer = Callable[[str, Awaitable[Any]], Awaitable[Any]]


async def _unmetered(what: str, call: Awaitable[Any]) -> Any:
    return await call


def slice_pool(body: Mapping[str, Any]) -> str:
    """The pool (for us: the node) a slice belongs to; "" when it names none."""
    return str((body.get("spec") or {}).get("pool", {}).get("name", ""))


def slice_stub(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a slice's deletion must still say after a relist: who it was, and its pool."""
    return {**metadata_stub(body), "spec": {"pool": {"name": slice_pool(body)}}}


def _digest(built: ResourceSlice) -> bytes:
    """A built slice's fingerprint (builds are deterministic: equal input, equal JSON)."""
    return hashlib.blake2b(orjson.dumps(built), digest_size=16).digest()


@dataclass(slots=True)
class CachedSlice:
    """One of our slices as the API last showed it."""

    name: str
    uid: str | None
    resource_version: str | None
    generation: int
    packed: bytes  # the body, without managedFields, as compact JSON, zlib-compressed
    matches: bytes | None = None  # digest of the built slice this version is known to equal

    @classmethod
    def of(cls, body: Mapping[str, Any], matches: bytes | None = None) -> CachedSlice:
        meta = body.get("metadata") or {}
        kept = without_managed_fields(body)
        generation = int(((body.get("spec") or {}).get("pool") or {}).get("generation", 0))
        return cls(str(meta["name"]), meta.get("uid"), meta.get("resourceVersion"), generation,
                   zlib.compress(orjson.dumps(kept), PACK_LEVEL), matches)

    def body(self) -> ResourceSlice:
        parsed: ResourceSlice = orjson.loads(zlib.decompress(self.packed))
        return parsed


def _unchanged(cached: Mapping[str, CachedSlice], digests: Mapping[str, bytes]) -> bool:
    """Whether the pool is known to hold exactly the built slices: the same names, each
    matching its built slice, all of one generation (a pool of mixed generations must be
    written whole again, whatever the slices hold)."""
    return (
        cached.keys() == digests.keys()
        and all(entry.matches == digests[name] for name, entry in cached.items())
        and len({entry.generation for entry in cached.values()}) <= 1
    )


class SlicePublisher:
    """Our slices, per pool, and every write to them."""

    def __init__(self, api: Api, write: Writer = _unmetered, replan: Callable[[str], None] = lambda pool: None) -> None:
        self.api = api
        self._write = write
        self._replan = replan  # a pool someone else changed while we wrote to it: plan it again
        self.slices: dict[str, dict[str, CachedSlice]] = {}  # pool -> slice name -> what the API holds
        # slice name -> the versions the watch brought while our write to it was in flight
        # (None: a deletion); an entry exists exactly while a write is in flight
        self._in_flight: dict[str, list[str | None]] = {}

    def bodies(self, pool: str) -> list[ResourceSlice]:
        """The cached slices of ``pool``, parsed, by name."""
        return [entry.body() for _, entry in sorted(self.slices.get(pool, {}).items())]

    async def remove_orphans(self, nodes: Collection[str]) -> None:
        """Delete our slices whose node is not among ``nodes`` (it went while we were away)."""
        for pool in sorted(p for p in self.slices if p not in nodes):
            await self.forget(pool)

    def seen(self, event_type: str, body: Mapping[str, Any]) -> bool:
        """Apply a watch event for one of our slices to the cache; True when it was someone
        else's change (its pool must be planned again), False for the echo of our own write.
        An event for a slice we are writing now is judged when the write answers (``_all``)."""
        changed = self._apply(event_type, body)
        flight = self._in_flight.get(str(body["metadata"]["name"]))
        if changed and flight is not None:
            flight.append(None if event_type == "DELETED" else body["metadata"].get("resourceVersion"))
            return False
        return changed

    def _apply(self, event_type: str, body: Mapping[str, Any]) -> bool:
        spec = body.get("spec") or {}
        if event_type != "DELETED" and spec.get("driver") != DRIVER:
            return False  # labelled as ours, but another driver's: not ours to keep or change
        pool = slice_pool(body)
        name = str(body["metadata"]["name"])
        cached = self.slices.get(pool)
        known = cached.get(name) if cached is not None else None
        if event_type == "DELETED":
            if cached is None or known is None:
                return False
            del cached[name]
            return True
        if known is not None and known.resource_version == body["metadata"].get("resourceVersion"):
            return False
        self.slices.setdefault(pool, {})[name] = CachedSlice.of(body)
        return True

    async def relist(self, pool: str) -> None:
        """Replace the cache of ``pool`` with what the API holds now."""
        items = await self.api.list_slices(OURS, node=pool)
        self.slices[pool] = {}
        for item in items:
            if slice_pool(item) == pool:
                self.seen("ADDED", item)

    async def forget(self, pool: str) -> None:
        """Delete every slice of ``pool`` (its node is gone; the Node owns them too, so this is
        belt and braces) and drop it from the cache."""
        for entry in self.slices.pop(pool, {}).values():
            await self._write("resourceslice/delete", self.api.delete_slice(entry.name, entry.uid))
            log.info("deleted the ResourceSlice of a node that is gone", slice=entry.name)

    async def publish(self, node: str, uid: str, devices: Iterable[GpuDevices]) -> None:
        """Make ``node``'s slices publish exactly ``devices`` (each GPU's, taints and all) with
        the fewest writes. A conflict (someone else wrote) re-reads the pool and raises, so the
        caller plans again from the truth."""
        desired = build_slices_from_devices(NodeRef(node, uid), devices)
        digests = {str(s["metadata"]["name"]): _digest(s) for s in desired}
        cached = self.slices.setdefault(node, {})
        if _unchanged(cached, digests):
            return
        plan = plan_slice_writes(node, desired, [entry.body() for entry in cached.values()])
        if plan.empty:  # equal in everything we manage: remember it, and the next time is cheap
            for name, entry in cached.items():
                entry.matches = digests.get(name)
            return
        # Each kind of write in turn (deletes, updates, creates); the writes of one kind at once.
        await self._all("resourceslice/delete", node, cached, [
            (ref.name, self.api.delete_slice(ref.name, ref.uid)) for ref in plan.deletes], digests)
        await self._all("resourceslice/update", node, cached, [
            (str(b["metadata"]["name"]), self.api.replace_slice(b)) for b in plan.updates], digests)
        await self._all("resourceslice/create", node, cached, [
            (str(b["metadata"]["name"]), self.api.create_slice(b)) for b in plan.creates], digests)
        log.info("published ResourceSlices", node=node, generation=plan.generation, created=len(plan.creates),
                 updated=len(plan.updates), deleted=len(plan.deletes))

    async def _all(self, what: str, node: str, cached: dict[str, CachedSlice],
                   calls: list[tuple[str, Awaitable[Any]]], digests: Mapping[str, bytes]) -> None:
        """Make ``calls`` (slice name, write) at once and keep what each returned. A conflict
        or a missing slice (someone else wrote) re-reads the pool; any failure is raised once
        every write has answered."""
        planned = {name: cached.get(name) for name, _ in calls}
        for name, _ in calls:
            self._in_flight[name] = []
        try:
            results = await asyncio.gather(*(self._write(what, call) for _, call in calls), return_exceptions=True)
        finally:
            brought = {name: self._in_flight.pop(name, []) for name, _ in calls}
        failure: BaseException | None = None
        others = False  # the watch brought a version that is not our write's: someone else's change
        for (name, _), result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                failure = failure or result
                others = others or bool(brought[name])
                continue
            ours = None if what == "resourceslice/delete" else result["metadata"].get("resourceVersion")
            others = others or any(version != ours for version in brought[name])
            entry = cached.get(name)
            if entry is not planned[name]:
                # The watch was faster than the answer: keep its version, and when that is our
                # write's own, remember that it equals what we built (the next publish is cheap).
                if entry is not None and ours is not None and entry.resource_version == ours:
                    entry.matches = digests[name]
            elif what == "resourceslice/delete":
                cached.pop(name, None)
            else:
                cached[name] = CachedSlice.of(result, digests[name])
        if others:
            self._replan(node)
        if failure is None:
            return
        if isinstance(failure, ApiError) and failure.status in (404, 409):
            await self.relist(node)
        raise failure
