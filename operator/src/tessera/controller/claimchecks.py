"""The operator answers the agents' claim checks, so that no agent watches every claim.

Before an agent destroys or reshapes a published device it must know every claim allocated a
device of its node, as fresh as a quorum read (``tessera.agent.claimguard``). A claim cannot be
selected by node on the server (ResourceClaims select on name and namespace only), so an agent
that watches claims gets every claim event of the cluster: 14.8 µs of apiserver CPU per event
and watcher (``benchmarks/bench_claim_fanout.py``), 74 ms per claim event at 5,000 agents. So
for a NodeLayout whose spec says ``claimCheck: Operator`` (every spec this operator writes),
the agent asks the operator instead:

1. the agent writes a new token on its fence claim (``ASK_ANNOTATION``, with its node in
   ``NODE_ANNOTATION``) in the install's namespace;
2. this room's watch of every claim brings the ask, and the answer is taken at that moment
   from what the watch has passed on: the claims holding the node's devices;
3. the answer (``tessera.models.claimcheck``) is written on the fence claim
   (``ANSWER_ANNOTATION``); the agent watches that one claim, and takes only the answer to
   the token it wrote.

Why the answer is as fresh as a quorum list started when the agent's check began: the
apiserver gives the ask a resourceVersion after every change committed before it, one watch of
one resource delivers its events in resourceVersion order, and when it falls behind it lists
again (a consistent read); so once the watch has passed the ask on, it has passed on every
claim change committed before the agent asked. An ask seen in the middle of a list (the watch
passes a list on page by page) is answered once the whole list is in (``ListWatch.relisting``).
The agent refuses (``ClaimCheckFailed``) when no answer comes in time: nothing is destroyed on
a guess.

Why a watch of its own and not the Kopf claim handler's events: Kopf hands each object's events
to a worker of that object's own, so across objects it keeps no order, and an ask can be
handled before an allocation committed ahead of it. The Kopf handler still drives every
decision; this watch answers asks, and tells the operator (``gone``) of every deletion it sees,
those its relists find too: when Kopf's own watch starts over (410 Gone) it lists again and says
nothing of a claim deleted meanwhile, which the operator's view would hold on to (a hold that
no longer exists keeps its GPU from being recut). Its cost is one more watcher of every claim,
whatever the number of agents.

Cost per check: two small writes (the ask and the answer), each delivered to the few watchers
of every claim (this operator, kube-scheduler, kube-controller-manager) and to the asking
agent's watch of its own fence claim. Only the leader answers (its writes go through the gate);
a standby takes its answers as asks arrive, and sends those still open when it comes to lead
(an answer taken earlier is still true of what was committed before its ask).
Not for: the handover's own check of claims (``handover``, ``freshclaims``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter, Histogram

from tessera import DRIVER_NAME, RESOURCE_GROUP, RESOURCE_VERSION
from tessera.controller.state import claim_hold, pending_on_our_classes
from tessera.kube.claims import ANSWER_ANNOTATION, ASK_ANNOTATION, FENCE_PREFIX, NODE_ANNOTATION
from tessera.kube.fence import NotLeading
from tessera.kube.http import ApiError, KubeClient
from tessera.kube.watch import ListWatch
from tessera.models.allocation import held_devices
from tessera.models.claimcheck import AnswerError, ClaimCheckAnswer

log = structlog.get_logger("tessera.operator")

ANSWERS = Counter("tessera_operator_claim_check_answers_total", "Claim checks the operator answered for agents")
ANSWER_SECONDS = Histogram("tessera_operator_claim_check_seconds",
                           "From an agent's ask reaching the operator to its answer written")

Answer = Callable[[str, str, str], Awaitable[None]]  # (namespace, name, answer JSON)
SENDING = 16  # answers in flight at once (a rollout's wave asks by the hundred)


@dataclass(frozen=True, slots=True)
class _Ask:
    node: str
    token: str
    arrived: float  # monotonic
    answer: str  # the answer's JSON, taken when the ask was passed on


class ClaimChecks:
    """Every claim's holds by node, from one ordered watch; asks on fence claims in
    ``namespace`` answered from them. ``start()`` / ``stop()``."""

    def __init__(self, client: KubeClient, answer: Answer, namespace: str, leading: asyncio.Event,
                 driver: str = DRIVER_NAME, retry_after: float = 1.0,
                 gone: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        self._answer = answer
        self._gone = gone  # told of each claim deletion (fence claims apart), as the watch passes it on
        self.namespace = namespace
        self.driver = driver
        self._leading = leading
        self._retry_after = retry_after
        self.watch = ListWatch(client, RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", self.seen,
                               stub=self._stub, on_listed=self.listed)
        self._held: dict[str, dict[str, tuple[str, ...]]] = {}  # node -> claim key -> its devices there
        self._nodes_of: dict[str, tuple[str, ...]] = {}  # claim key -> the nodes it holds devices on
        self._deferred: dict[str, tuple[str, str]] = {}  # fence name -> (node, token) asked during a list
        self._open: dict[str, _Ask] = {}  # fence name -> its latest ask, answer taken, not yet written
        self._answering: dict[str, _Ask] = {}  # fence name -> the ask whose answer is being written
        self._wake = asyncio.Event()
        self._sending = asyncio.Semaphore(SENDING)
        self._task: asyncio.Task[None] | None = None
        self.answered = 0

    def start(self) -> None:
        self.watch.start()
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="tessera-claim-checks")

    async def stop(self) -> None:
        await self.watch.stop()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- the watch's consumer -----------------------------------------------------------------

    def _fence(self, body: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]] | None:
        """(name, node, annotations) of a fence claim in the install's namespace, else None."""
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        node, name = annotations.get(NODE_ANNOTATION), str(meta.get("name", ""))
        if meta.get("namespace") != self.namespace or not node or not name.startswith(FENCE_PREFIX):
            return None
        return name, str(node), annotations

    def _stub(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Kept (to learn of its deletion after a relist): fence claims, claims holding a
        device, and claims waiting for one of Tessera's classes (the operator's view has those)."""
        if self._fence(body) is None and claim_hold(body) is None and not pending_on_our_classes(body):
            return None
        meta = body.get("metadata") or {}
        return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta}}

    def seen(self, kind: str, body: Mapping[str, Any]) -> None:
        """One ResourceClaim watch event, in the stream's order."""
        fence = self._fence(body)
        if fence is not None:
            self._ask_seen(kind, *fence)
            return
        if kind == "DELETED" and self._gone is not None:
            self._gone(body)
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for node in self._nodes_of.pop(key, ()):
            claims = self._held[node]
            claims.pop(key, None)
            if not claims:
                del self._held[node]
        if kind == "DELETED":
            return
        by_node: dict[str, list[str]] = {}
        for pool, device in held_devices(body, self.driver):
            by_node.setdefault(pool, []).append(device)
        if by_node:
            self._nodes_of[key] = tuple(by_node)
            for node, devices in by_node.items():
                self._held.setdefault(node, {})[key] = tuple(sorted(devices))

    def _ask_seen(self, kind: str, name: str, node: str, annotations: Mapping[str, Any]) -> None:
        token = annotations.get(ASK_ANNOTATION)
        if kind == "DELETED" or not token or _answered_token(annotations.get(ANSWER_ANNOTATION)) == token:
            self._deferred.pop(name, None)
            self._open.pop(name, None)
            return
        token = str(token)
        asked = self._open.get(name) or self._answering.get(name)
        if asked is not None and asked.token == token:
            return  # taken already (this is the echo of another write to the claim)
        if self.watch.relisting:  # the claims after it in the list are not in yet
            self._deferred[name] = (node, token)
            return
        self._take(name, node, token)

    def _take(self, name: str, node: str, token: str) -> None:
        answer = ClaimCheckAnswer.of(token, node, self._held.get(node, {}).items())
        self._open[name] = _Ask(node, token, time.monotonic(), answer.encode())
        self._wake.set()

    def listed(self) -> None:
        """The watch has passed a whole list on: asks seen in it are answered now."""
        deferred, self._deferred = self._deferred, {}
        for name, (node, token) in deferred.items():
            self._take(name, node, token)

    def holds_on(self, node: str) -> dict[str, tuple[str, ...]]:
        """Claim key -> devices it holds on ``node``, as the watch has them (tests, debugging)."""
        return dict(self._held.get(node, {}))

    # -- answering ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Write the answers taken, while leading, until cancelled."""
        batches: set[asyncio.Task[None]] = set()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._leading.wait()
                # One answer in flight per fence claim: a later one must not be overwritten by an earlier.
                batch = {name: ask for name, ask in self._open.items() if name not in self._answering}
                if not batch:
                    continue
                self._answering.update(batch)
                task = asyncio.create_task(self._send_batch(batch), name="tessera-claim-check-answers")
                batches.add(task)
                task.add_done_callback(batches.discard)
        finally:
            for task in batches:
                task.cancel()

    async def _send_batch(self, batch: dict[str, _Ask]) -> None:
        try:
            failed = any(await asyncio.gather(*(self._send(name, ask) for name, ask in batch.items())))
        finally:
            for name in batch:
                del self._answering[name]
        if failed:
            await asyncio.sleep(self._retry_after)
            self._wake.set()
        elif any(name in self._open for name in batch):
            self._wake.set()  # a newer ask came while this one's answer was written

    async def _send(self, name: str, ask: _Ask) -> bool:
        """Write one answer; True when it failed (and is to be written again)."""
        try:
            async with self._sending:
                await self._answer(self.namespace, name, ask.answer)
        except ApiError as error:
            if error.status != 404:
                log.warning("cannot answer a claim check", claim=f"{self.namespace}/{name}", error=str(error))
                return True
            # The fence claim is gone: its agent asks again on a new one.
        except (OSError, TimeoutError, NotLeading) as error:
            log.warning("cannot answer a claim check", claim=f"{self.namespace}/{name}", error=str(error))
            return True
        else:
            self.answered += 1
            ANSWERS.inc()
            ANSWER_SECONDS.observe(time.monotonic() - ask.arrived)
        if self._open.get(name) == ask:
            del self._open[name]
        return False


def _answered_token(text: object) -> str | None:
    if not isinstance(text, str):
        return None
    try:
        return ClaimCheckAnswer.decode(text).token
    except AnswerError:
        return None
