"""The one owner of Tessera's ResourceSlices: each node's devices in, the fewest writes out.

Like the upstream resourceslice controller, it keeps a cache of our slices per pool (one
pool per node) as the API returned them, plans against it (``tessera.dra.diff``), and applies
the watch's events to it: a change someone else made (the kubelet wipes a driver's slices when
its plugin goes away; a person deletes one) makes the pool be planned again from the truth;
the echo of our own writes changes nothing. At start it loads every slice of ours and deletes
those whose node has gone.

Not for: deciding what a node publishes or when drain taints go on (``decide``, ``runtime``),
building devices or slices (``tessera.dra``), or the watch itself (``tessera.kube.watch``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import structlog

from tessera.dra.devices import GpuDevices
from tessera.dra.diff import orphaned_slices, plan_slice_writes
from tessera.dra.slices import MANAGED_BY, MANAGED_BY_LABEL, NodeRef, build_slices_from_devices
from tessera.kube.http import ApiError
from tessera.kube.objects import Api

log = structlog.get_logger("tessera.operator")

OURS = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

# Makes one API write, counted under ``what`` (the metric label), and returns its result.
Writer = Callable[[str, Awaitable[Any]], Awaitable[Any]]


async def _unmetered(what: str, call: Awaitable[Any]) -> Any:
    return await call


def slice_pool(body: Mapping[str, Any]) -> str:
    """The pool (for us: the node) a slice belongs to; "" when it names none."""
    return str((body.get("spec") or {}).get("pool", {}).get("name", ""))


def _by_name(slices: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(slices, key=lambda s: str(s["metadata"]["name"]))


class SlicePublisher:
    """Our slices, per pool, and every write to them."""

    def __init__(self, api: Api, write: Writer = _unmetered) -> None:
        self.api = api
        self._write = write
        self.slices: dict[str, list[dict[str, Any]]] = {}  # pool -> our slices as the API returned them

    async def load(self) -> None:
        """Read every slice of ours into the cache."""
        for item in await self.api.list_slices(OURS):
            self.slices.setdefault(slice_pool(item), []).append(item)

    async def remove_orphans(self) -> None:
        """Delete our slices whose node no longer exists (the node went while we were away)."""
        nodes = await self.api.list_node_names()
        everything = [s for pool in self.slices.values() for s in pool]
        for ref in orphaned_slices(everything, nodes):
            await self._write("resourceslice/delete", self.api.delete_slice(ref.name, ref.uid))
            log.info("deleted orphaned ResourceSlice", slice=ref.name)
        for pool in [p for p in self.slices if p not in nodes]:
            del self.slices[pool]

    def seen(self, event_type: str, body: dict[str, Any]) -> bool:
        """Apply a watch event for one of our slices to the cache; True when it was someone
        else's change (its pool must be planned again), False for the echo of our own write."""
        pool = slice_pool(body)
        name = str(body["metadata"]["name"])
        cached = {str(s["metadata"]["name"]): s for s in self.slices.get(pool, [])}
        known = cached.get(name)
        if event_type == "DELETED":
            if known is None:
                return False
            del cached[name]
        else:
            version = body["metadata"].get("resourceVersion")
            if known is not None and known["metadata"].get("resourceVersion") == version:
                return False
            cached[name] = body
        self.slices[pool] = _by_name(cached.values())
        return True

    async def relist(self, pool: str) -> None:
        """Replace the cache of ``pool`` with what the API holds now."""
        items = await self.api.list_slices(OURS)
        self.slices[pool] = [s for s in items if slice_pool(s) == pool]

    async def forget(self, pool: str) -> None:
        """Delete every slice of ``pool`` (its node is gone; the Node owns them too, so this is
        belt and braces) and drop it from the cache."""
        for item in self.slices.pop(pool, []):
            meta = item["metadata"]
            await self._write("resourceslice/delete", self.api.delete_slice(meta["name"], meta.get("uid")))

    async def publish(self, node: str, uid: str, devices: Iterable[GpuDevices]) -> None:
        """Make ``node``'s slices publish exactly ``devices`` (each GPU's, taints and all) with
        the fewest writes. A conflict (someone else wrote) re-reads the pool and raises, so the
        caller plans again from the truth."""
        desired = build_slices_from_devices(NodeRef(node, uid), devices)
        existing = self.slices.get(node, [])
        plan = plan_slice_writes(node, desired, existing)
        if plan.empty:
            return
        current = {s["metadata"]["name"]: s for s in existing}
        for ref in plan.deletes:
            await self._write("resourceslice/delete", self.api.delete_slice(ref.name, ref.uid))
            current.pop(ref.name, None)
        for body in plan.updates:
            try:
                current[body["metadata"]["name"]] = await self._write(
                    "resourceslice/update", self.api.replace_slice(body)
                )
            except ApiError as exc:
                if exc.status in (404, 409):
                    await self.relist(node)
                raise
        for body in plan.creates:
            try:
                current[body["metadata"]["name"]] = await self._write(
                    "resourceslice/create", self.api.create_slice(body)
                )
            except ApiError as exc:
                if exc.status == 409:
                    await self.relist(node)
                raise
        self.slices[node] = _by_name(current.values())
        log.info("published ResourceSlices", node=node, generation=plan.generation, created=len(plan.creates),
                 updated=len(plan.updates), deleted=len(plan.deletes))
