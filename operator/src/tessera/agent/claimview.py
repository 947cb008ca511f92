"""The claims that name this node's devices, proved current before the claim guard reads them,
without listing every claim of the cluster before each destroying operation. Two ways, chosen
by the NodeLayout's ``spec.claimCheck``:

- ``Operator`` (what the operator writes): the agent asks the operator, which watches every
  claim (``tessera.controller.claimchecks``). ``fresh()`` writes a new token on this agent's
  fence claim (``tessera-fence-<node>`` in the install's namespace, ``ASK_ANNOTATION``), and
  waits for the operator's answer with that token on the same claim, which this agent watches
  alone (a watch of one object by name). The answer names the claims holding the node's
  devices as the operator's watch had them when the ask came by in its order. The agent
  watches no other claim, so the cluster's claim events cost it nothing.
- unset (a spec written by hand, or by an operator before this one): one watch of every
  ResourceClaim keeps here the claims whose allocation has a result of our driver in this
  node's pool, and the fence claim; every other event is dropped as it arrives. ``fresh()``
  writes a new token on the fence claim (``FENCE_ANNOTATION``) and waits until the watch
  passes that write on, then answers from what it keeps.

Why either is as safe as a quorum list of every claim started when ``fresh()`` began
(``tessera.kube.claims.list_resource_claims``): the apiserver gives the ask or fence write a
resourceVersion after every change committed before it, and one watch of one resource delivers
its events in resourceVersion order, with a relist (a consistent read) when it falls behind; so
once a watch of every claim has delivered the write, it has delivered every claim change
committed before ``fresh()`` began. The operator's watch answers from there; this agent's own
watch counts a fence's echo from there, and an echo that comes in the middle of a relist (a
list is passed on page by page) only once the whole list is in (``relisted``). When the ask or
the fence cannot be written, or its answer or echo does not
come in time, ``fresh()`` raises, and the guard refuses the operation (``ClaimCheckFailed``):
nothing is destroyed on a guess. A fence namespace that does not exist (a cluster without the
install's namespace) falls back to the cluster-wide quorum list, as safe as before and as costly.

Only one of the two watches runs at a time (``use``), and none before the first pass has read
the spec: an agent that asks the operator never lists every claim, not even at its start.
The kubelet plugin starts a prepare from the watch's copy of the claim (``claim_copy``) while
it reads the claim to confirm it (``tessera.agent.plugin.watched``); an agent that asks the
operator keeps no copies, and the plugin reads the claim first.
Not for: deciding whether a claim holds a device (``tessera.agent.claimguard`` with
``tessera.models.allocation``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from tessera import RESOURCE_GROUP, RESOURCE_VERSION
from tessera.kube.claims import (
    ANSWER_ANNOTATION,
    ASK_ANNOTATION,
    FENCE_ANNOTATION,
    FENCE_PREFIX,
    list_resource_claims,
    write_claim_fence,
)
from tessera.kube.http import ApiError, KubeClient
from tessera.kube.watch import ListWatch, without_managed_fields
from tessera.models.allocation import allocation_results
from tessera.models.claimcheck import AnswerError, ClaimCheckAnswer

log = structlog.get_logger("tessera.agent")
MAX_NAME = 253


def fence_claim_name(node: str) -> str:
    """``tessera-fence-<node>``; a long node name is shortened with a digest (names are ≤ 253)."""
    name = f"{FENCE_PREFIX}{node}"
    if len(name) <= MAX_NAME:
        return name
    return f"{FENCE_PREFIX}{node[:200]}-{hashlib.sha256(node.encode()).hexdigest()[:16]}"


class FenceError(Exception):
    """The claims could not be proved current (the fence was not written, or not seen in time)."""


class ClaimView:
    """This node's claims, proved current by ``fresh()``; ``use()`` each pass, ``stop()`` at the end."""

    def __init__(self, api: KubeClient, *, driver: str, node: str, fence_namespace: str,
                 timeout_s: float = 15.0, own_watch: bool = True,
                 relisting: Callable[[], bool] | None = None) -> None:
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
        self._answer: ClaimCheckAnswer | None = None  # the operator's latest answer to this agent
        self._changed = asyncio.Condition()
        self.asking: bool | None = None  # True: the operator answers; False: our watch; None: not yet known
        self.fences = 0  # fence writes (tests, the benchmark's request count)
        self.asks = 0  # asks written to the operator
        self.fallback_lists = 0  # cluster-wide lists when there is no fence namespace
        self.proof_seconds = 0.0  # time from the ask's or fence's write to its answer or echo, summed
        self.observe: Callable[[str, float], None] | None = None  # ("ask" | "fence", seconds), each proof
        # own_watch=False: the owner feeds ``feed`` from a watch of every claim of its own (one
        # process running many nodes' agents, as the benchmark's fleet does, shares one).
        self._own_watch = own_watch
        self.watch: ListWatch | None = None
        # Whether the watch feeding ``feed`` is passing a list on (``ListWatch.relisting``): a
        # fence's echo then proves nothing until the whole list is in (``relisted``).
        self._relisting = relisting or (lambda: self.watch is not None and self.watch.relisting)
        self._echoed = 0  # the last token echoed during a relist, counted once it is over

    async def use(self, *, asking: bool) -> None:
        """Prove claims current by asking the operator, or by a watch of every claim; starts
        the watch that way needs (the fence claim's alone, or every claim's) and stops the other."""
        if asking == self.asking:
            return
        self.asking = asking
        self._answer = None
        if not self._own_watch:
            return  # the owner's watch of every claim goes on feeding the view either way
        self._held.clear()  # the new watch lists what it keeps afresh
        if self.watch is not None:
            await self.watch.stop()
        selector = f"metadata.name={self.fence_name},metadata.namespace={self.fence_namespace}" if asking else None
        self.watch = ListWatch(self.api, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", self.feed,
                               field_selector=selector, stub=self._stub, on_listed=self.relisted)
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
        """One ResourceClaim watch event (of the fence claim, or of any claim; most are dropped here)."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if self._is_fence(body):
            annotations = meta.get("annotations") or {}
            if self.asking:
                self._take_answer(annotations.get(ANSWER_ANNOTATION))
                return
            count = self._newer(str(annotations.get(FENCE_ANNOTATION, "")))
            if count is not None:
                if self._relisting():  # the claims after it in the list are not in yet
                    self._echoed = max(self._echoed, count)
                    return
                self._seen = count
                asyncio.get_running_loop().create_task(self._notify())
            return
        if kind != "DELETED" and self._names_this_node(body):
            self._held[key] = without_managed_fields(body)
        else:
            self._held.pop(key, None)

    def _newer(self, token: str) -> int | None:
        """The count of ``token`` when this boot wrote it and nothing later was seen yet, else None."""
        boot, _, count = token.partition("-")
        if boot != self._boot or not count.isdigit() or int(count) <= self._seen:
            return None
        return int(count)

    def relisted(self) -> None:
        """The watch has passed a whole list on: a fence echoed in it counts now."""
        if not self.asking and self._echoed > self._seen:
            self._seen = self._echoed
            asyncio.get_running_loop().create_task(self._notify())

    def _take_answer(self, text: object) -> None:
        if not isinstance(text, str):
            return
        try:
            answer = ClaimCheckAnswer.decode(text)
        except AnswerError as error:
            log.warning("cannot read the operator's claim check answer", claim=self.fence_name, error=str(error))
            return
        count = self._newer(answer.token)
        if answer.node != self.node or count is None:
            return  # for another node, an earlier agent on this node, or an older ask
        self._seen = count
        self._answer = answer
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def ensure_fence(self) -> None:
        """Make the fence claim exist (with a token no read waits for), so that the first
        ``fresh()`` of a pass is one write, not a failed patch and a create. A failure is
        logged, not raised: ``fresh()`` creates the claim itself when it must."""
        try:
            await write_claim_fence(self.api, self.fence_namespace, self.fence_name, f"{self._boot}-0",
                                    node=self.node, timeout_s=self.timeout_s)
        except (ApiError, OSError) as error:  # OSError: the apiserver went away meanwhile
            log.info("could not make the claim fence yet", namespace=self.fence_namespace, error=repr(error))

    # -- the guard's read -----------------------------------------------------------------------

    def claim_copy(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The watch's copy of one claim naming this node's pool, None when it has none (not
        proved current: the kubelet plugin confirms it with a read, ``tessera.agent.plugin.watched``)."""
        return self._held.get(f"{namespace}/{name}")

    def held(self) -> list[dict[str, Any]]:
        """The claims naming this node's pool as the watch has them now, or as the operator's
        last answer had them (not proved current)."""
        if self.asking:
            return self._answer.as_claims(self.driver) if self._answer is not None else []
        return list(self._held.values())

    async def fresh(self) -> list[dict[str, Any]]:
        """The claims naming this node's pool, including every allocation committed before this
        call began. Raises ``FenceError`` (or the API's error) when that cannot be proved;
        ``use()`` must have chosen the way first."""
        if self.asking is None:
            raise FenceError("no pass has chosen how to check claims yet")
        asking = self.asking
        self._sent += 1
        wanted = self._sent
        try:
            await write_claim_fence(self.api, self.fence_namespace, self.fence_name, f"{self._boot}-{wanted}",
                                    node=self.node, key=ASK_ANNOTATION if asking else FENCE_ANNOTATION,
                                    timeout_s=self.timeout_s)
        except ApiError as error:
            if error.status == 404 and "namespaces" in error.message:
                return await self._fallback(error)
            raise FenceError(f"cannot write the fence claim {self.fence_namespace}/{self.fence_name}: {error}") \
                from None
        if asking:
            self.asks += 1
        else:
            self.fences += 1
        written = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s), self._changed:
                await self._changed.wait_for(lambda: self._seen >= wanted)
        except TimeoutError:
            what = ("the operator did not answer the claim check (is the Tessera operator running, and leading?)"
                    if asking else "the ResourceClaim watch did not pass the fence on")
            raise FenceError(f"{what} within {self.timeout_s:.0f} s") from None
        waited = time.monotonic() - written
        self.proof_seconds += waited
        if self.observe is not None:
            self.observe("ask" if asking else "fence", waited)
        return self.held()

    async def _fallback(self, error: ApiError) -> list[dict[str, Any]]:
        if not self.fallback_lists:
            log.warning("no namespace for the claim fence; the claim guard lists every claim instead",
                        namespace=self.fence_namespace, error=str(error))
        self.fallback_lists += 1
        return await list_resource_claims(self.api, self.timeout_s)
