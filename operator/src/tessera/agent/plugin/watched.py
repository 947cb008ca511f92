"""A prepare's claim, taken from the agent's claim watch at once and confirmed by a read of the
claim that runs alongside the work, so the API round trip leaves the kubelet's path without
leaving the plugin.

An agent that watches every claim itself (for a NodeLayout spec without ``claimCheck:
Operator``) already keeps the claims allocated on its node (``tessera.agent.claimview``); one
that asks the operator watches no claims, keeps no copies, and every prepare reads its claim
first. When the kubelet asks to prepare a claim, ``ClaimSource.begin``
hands the preparer the watch's copy of it, if it has one with the UID the kubelet named, and
starts a GET of the claim beside it. The preparer does its work (holds, CDI spec) from the
watch's copy, and before the checkpoint is first written (for a DynamicMIG claim that is
before any instance is made) it calls ``Reading.confirm()``, which waits for the GET and
compares: same UID, and the same resourceVersion or else the same ``status.allocation``. When
they disagree, ``confirm`` raises ``ViewBehindError`` with the GET's copy; the preparer rolls back
what it did and does it again from that copy. Without a copy in the watch (the watch has not
seen the allocation yet, or the plugin runs without one) the GET is awaited first, as before.

Why the GET is not skipped when the watch has the claim: the kubelet's request names the claim
by namespace, name and UID only, and a claim keeps its UID while its allocation is cleared and
made again (the scheduler deallocates a claim whose Pod did not bind, or whose reserving Pods
are all gone, and allocates it again later, maybe to another device). A watch may lag behind
such a change, so a copy from it whose UID matches can still name the device the claim had
before — a device the scheduler may since have given another claim. Preparing from that copy
would hand one device to two claims. The GET is a quorum read that starts after the kubelet's
call, which the kubelet makes only after it saw the Pod bound, which the scheduler does only
after it wrote the allocation; so the GET sees the allocation the kubelet acts on, or a later
one. Proving the watch current instead (the claim view's fence) costs a write and its echo,
more than the read it would save.

What the watch's copy is allowed to do before the GET agrees: take holds (a hold only keeps the
reconciler off a device; it is dropped on rollback), start an MPS server, and write the claim's
own CDI spec (named by the claim's UID; the kubelet learns its device IDs only from the answer,
and a rollback removes or a redo rewrites it). Nothing leaves the plugin from an unconfirmed
copy: no checkpoint record, no answer, no device status. A DynamicMIG claim changes the GPUs
and records its plan in the checkpoint first, so it confirms before both.

The metric ``tessera_agent_plugin_claim_reads{source}`` counts which copy each fresh prepare
was built from: ``view`` (the watch's, confirmed), ``get`` (no usable copy in the watch) or
``view_stale`` (the watch's disagreed; redone from the GET's). The steps ``claim_view``,
``claim_read_alongside`` (the GET's own time) and ``claim_confirm`` (the part of it the call
waited for) are timed with the call's others.
Not for: preparing (``tessera.agent.plugin.prepare``) or keeping the watch (``tessera.agent.claimview``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tessera.agent.plugin.claims import ClaimError, ClaimReader, ClaimRef
from tessera.agent.plugin.steps import PluginMetrics, StepTimes


class ClaimCopies(Protocol):
    """Copies of the claims allocated on this node, as a watch has them (maybe behind)."""

    def claim_copy(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class ViewBehindError(Exception):
    """The GET's copy of the claim differs from the watch's; the work must be redone from it."""

    def __init__(self, ref: ClaimRef, claim: dict[str, Any]) -> None:
        super().__init__(f"ResourceClaim {ref}: the watch's copy is behind the API's")
        self.claim = claim


def same_claim(watched: Mapping[str, Any], read: Mapping[str, Any]) -> bool:
    """Whether a prepare built from ``watched`` is right for ``read`` (the GET's copy): the same
    UID, and the same resourceVersion or, failing that, the same allocation (a status write of
    the claim's device status, or a new reservation, changes the version but not what to prepare)."""
    watched_meta, read_meta = watched.get("metadata") or {}, read.get("metadata") or {}
    if watched_meta.get("uid") != read_meta.get("uid"):
        return False
    version = watched_meta.get("resourceVersion")
    if version is not None and version == read_meta.get("resourceVersion"):
        return True
    return bool((watched.get("status") or {}).get("allocation") == (read.get("status") or {}).get("allocation"))


@dataclass(slots=True)
class Reading:
    """One prepare's claim: ``claim`` to start from, and ``confirm()`` before anything leaves."""

    ref: ClaimRef
    claim: dict[str, Any]
    from_view: bool
    _metrics: PluginMetrics
    _get: asyncio.Task[dict[str, Any] | None] | None = None
    _times: StepTimes | None = None
    _confirmed: bool = field(default=False)

    @classmethod
    def read(cls, ref: ClaimRef, claim: dict[str, Any], metrics: PluginMetrics) -> Reading:
        """A reading of the API's own copy: nothing to confirm."""
        return cls(ref, claim, False, metrics, _confirmed=True)

    async def confirm(self) -> None:
        """Until the GET's copy is in and agrees with ``claim`` (at once when ``claim`` is the
        GET's). Raises ``ViewBehindError`` with the GET's copy, or ``ClaimError`` when the claim is
        gone or cannot be read. Once it returned, it returns at once."""
        if self._confirmed:
            return
        assert self._get is not None
        with self._times.step("claim_confirm") if self._times is not None else contextlib.nullcontext():
            read = await self._get
        if read is None:
            raise ClaimError(f"ResourceClaim {self.ref} does not exist (deleted before it was prepared)")
        if not same_claim(self.claim, read):
            self._metrics.claim_reads.labels("view_stale").inc()
            raise ViewBehindError(self.ref, read)
        self._confirmed = True
        self._metrics.claim_reads.labels("view").inc()

    def close(self) -> None:
        """Stop the GET if nothing waits for it any more (the prepare failed before confirming)."""
        if self._get is None:
            return
        if not self._get.done():
            self._get.cancel()
        elif not self._get.cancelled():
            self._get.exception()  # a failed read nobody awaited is not "never retrieved"


class ClaimSource:
    """Where a prepare gets its claim: the watch's copy checked by a GET alongside, or the GET."""

    def __init__(self, reader: ClaimReader, metrics: PluginMetrics, view: ClaimCopies | None = None) -> None:
        self.reader = reader
        self.view = view
        self._metrics = metrics

    async def begin(self, ref: ClaimRef, times: StepTimes) -> Reading:
        """The claim to start from. With a copy in the watch under the kubelet's UID: that copy
        now, with a GET started; else the GET's copy (``ClaimError`` when there is none)."""
        copy: Mapping[str, Any] | None = None
        if self.view is not None:
            with times.step("claim_view"):
                copy = self.view.claim_copy(ref.namespace, ref.name)
        if copy is not None and (copy.get("metadata") or {}).get("uid") == ref.uid:
            get = asyncio.get_running_loop().create_task(self._read_alongside(ref, times),
                                                         name=f"claim-read-{ref.uid}")
            return Reading(ref, dict(copy), True, self._metrics, get, times)
        with times.step("claim_read"):
            read = await self.reader.read_claim(ref.namespace, ref.name)
        if read is None:
            raise ClaimError(f"ResourceClaim {ref} does not exist (deleted before it was prepared)")
        self._metrics.claim_reads.labels("get").inc()
        return Reading.read(ref, read, self._metrics)

    async def _read_alongside(self, ref: ClaimRef, times: StepTimes) -> dict[str, Any] | None:
        with times.step("claim_read_alongside"):
            return await self.reader.read_claim(ref.namespace, ref.name)


__all__ = ["ClaimCopies", "ClaimSource", "Reading", "ViewBehindError", "same_claim"]
