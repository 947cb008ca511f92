"""The claims that name this node's devices, kept current by one watch of ResourceClaims per
agent and proved current by a fence, so that the claim guard reads them without listing every
claim of the cluster before each destroying operation.

One ``ListWatch`` of every ResourceClaim (a claim cannot be filtered by node on the server)
keeps here only the claims whose allocation has a result of our driver in this node's pool,
and the fence claim; every other event is dropped as it arrives (the watch keeps no stub of
them either). ``fresh()`` is what the guard calls before a destroy: it writes a new token on
this agent's fence claim (``tessera-fence-<node>`` in the install's namespace) and waits until
the watch passes that write on, then answers from what it keeps.

Why that is as safe as the quorum list it replaces (``tessera.kube.claims.list_resource_claims``):
the apiserver gives the fence write a resourceVersion after every change committed before it,
and one watch of one resource delivers its events in resourceVersion order, with a relist
(a consistent read) when it falls behind. So once the watch has delivered the fence, it has
delivered every claim change committed before ``fresh()`` began, among them any allocation the
scheduler wrote (and the apiserver acknowledged) before it: exactly what the quorum list saw.
When the fence cannot be written or its echo does not come in time, ``fresh()`` raises, and
the guard refuses the operation (``ClaimCheckFailed``): nothing is destroyed on a guess. A
fence namespace that does not exist (a cluster without the install's namespace) falls back to
the cluster-wide quorum list, as safe as before and as costly.

Cost per destroying operation: one small write and its echo, whatever the size of the
cluster; the watch's events are the apiserver's fan-out, not requests.
The kubelet plugin starts a prepare from this watch's copy of the claim (``claim_copy``) while
it reads the claim to confirm it (``tessera.agent.plugin.watched``).
Not for: deciding whether a claim holds a device (``tessera.agent.claimguard`` with
``tessera.models.allocation``).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

import structlog

from tessera import RESOURCE_GROUP, RESOURCE_VERSION
from tessera.kube.claims import FENCE_ANNOTATION, list_resource_claims, write_claim_fence
from tessera.kube.http import ApiError, KubeClient
from tessera.kube.watch import ListWatch, without_managed_fields
from tessera.models.allocation import allocation_results

log = structlog.get_logger("tessera.agent")
MAX_NAME = 253


def fence_claim_name(node: str) -> str:
    """``tessera-fence-<node>``; a long node name is shortened with a digest (names are ≤ 253)."""
    name = f"tessera-fence-{node}"
    if len(name) <= MAX_NAME:
        return name
    return f"tessera-fence-{node[:200]}-{hashlib.sha256(node.encode()).hexdigest()[:16]}"


class FenceError(Exception):
    """The claims could not be proved current (the fence was not written, or not seen in time)."""


class ClaimView:
    """This node's claims by one watch; ``fresh()`` proves them current. ``start()`` / ``stop()``."""

    def __init__(self, api: KubeClient, *, driver: str, node: str, fence_namespace: str,
                 timeout_s: float = 15.0, own_watch: bool = True) -> None:
        self.api = api
        self.driver = driver
        self.node = node
        self.fence_namespace = fence_namespace
        self.fence_name = fence_claim_name(node)
        self.timeout_s = timeout_s
        self._held: dict[str, dict[str, Any]] = {}  # namespace/name -> claim naming this node's pool
        self._boot = uuid.uuid4().hex[:12]  # tokens of an earlier agent on this node never count
        self._sent = 0
        self._seen = 0
        self._changed = asyncio.Condition()
        self.fences = 0  # fence writes (tests, the benchmark's request count)
        self.fallback_lists = 0  # cluster-wide lists when there is no fence namespace
        # own_watch=False: the owner feeds ``feed`` from a watch of its own (one process running
        # many nodes' agents, as the benchmark's fleet does, shares one watch among them).
        self.watch = (ListWatch(api, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", self.feed, stub=self._stub)
                      if own_watch else None)

    def start(self) -> None:
        if self.watch is not None:
            self.watch.start()

    async def stop(self) -> None:
        if self.watch is not None:
            await self.watch.stop()

    # -- the watch's consumer -----------------------------------------------------------------

    def _is_fence(self, body: Mapping[str, Any]) -> bool:
        meta = body.get("metadata") or {}
        return meta.get("name") == self.fence_name and meta.get("namespace") == self.fence_namespace

    def _names_this_node(self, body: Mapping[str, Any]) -> bool:
        return bool(allocation_results(body, self.driver, pool=self.node, include_admin_access=True))

    def _stub(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        if self._is_fence(body) or self._names_this_node(body):
            meta = body.get("metadata") or {}
            return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta}}
        return None

    def feed(self, kind: str, body: dict[str, Any]) -> None:
        """One ResourceClaim watch event (any claim of the cluster; most are dropped here)."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if self._is_fence(body):
            token = str((meta.get("annotations") or {}).get(FENCE_ANNOTATION, ""))
            boot, _, count = token.partition("-")
            if boot == self._boot and count.isdigit() and int(count) > self._seen:
                self._seen = int(count)
                asyncio.get_running_loop().create_task(self._notify())
            return
        if kind != "DELETED" and self._names_this_node(body):
            self._held[key] = without_managed_fields(body)
        else:
            self._held.pop(key, None)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def ensure_fence(self) -> None:
        """Make the fence claim exist (with a token no read waits for), so that the first
        ``fresh()`` of a pass is one write, not a failed patch and a create. A failure is
        logged, not raised: ``fresh()`` creates the claim itself when it must."""
        try:
            await write_claim_fence(self.api, self.fence_namespace, self.fence_name, f"{self._boot}-0",
                                    timeout_s=self.timeout_s)
        except (ApiError, OSError) as error:  # OSError: the apiserver went away meanwhile
            log.info("could not make the claim fence yet", namespace=self.fence_namespace, error=repr(error))

    # -- the guard's read -----------------------------------------------------------------------

    def claim_copy(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The watch's copy of one claim naming this node's pool, None when it has none (not
        proved current: the kubelet plugin confirms it with a read, ``tessera.agent.plugin.watched``)."""
        return self._held.get(f"{namespace}/{name}")

    def held(self) -> list[dict[str, Any]]:
        """The claims naming this node's pool as the watch has them now (not proved current)."""
        return list(self._held.values())

    async def fresh(self) -> list[dict[str, Any]]:
        """The claims naming this node's pool, including every allocation committed before this
        call began. Raises ``FenceError`` (or the API's error) when that cannot be proved."""
        self._sent += 1
        wanted = self._sent
        try:
            await write_claim_fence(self.api, self.fence_namespace, self.fence_name, f"{self._boot}-{wanted}",
                                    timeout_s=self.timeout_s)
        except ApiError as error:
            if error.status == 404 and "namespaces" in error.message:
                return await self._fallback(error)
            raise FenceError(f"cannot write the fence claim {self.fence_namespace}/{self.fence_name}: {error}") \
                from None
        self.fences += 1
        try:
            async with asyncio.timeout(self.timeout_s), self._changed:
                await self._changed.wait_for(lambda: self._seen >= wanted)
        except TimeoutError:
            raise FenceError(
                f"the ResourceClaim watch did not pass the fence on within {self.timeout_s:.0f} s"
            ) from None
        return self.held()

    async def _fallback(self, error: ApiError) -> list[dict[str, Any]]:
        if not self.fallback_lists:
            log.warning("no namespace for the claim fence; the claim guard lists every claim instead",
                        namespace=self.fence_namespace, error=str(error))
        self.fallback_lists += 1
        return await list_resource_claims(self.api, self.timeout_s)
