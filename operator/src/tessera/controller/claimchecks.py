"""The operator answers the agents' claim checks, so that no agent watches every claim.

Before an agent destroys or reshapes a published device it must know every claim allocated a
device of its node, as fresh as a quorum read (``tessera.agent.claimguard``). A claim cannot be
selected by node on the server (ResourceClaims select on name and namespace only), so an agent
that watches claims gets every claim event of the cluster: at 5,000 nodes each claim event
costs the apiserver about 45 ms of fan-out (9 µs per watcher, measured in stop 36), and a
rollout's fence writes grow with the square of the fleet. The operator watches every claim
anyway. So for a NodeLayout whose spec says ``claimCheck: Operator`` (every spec this operator
writes), the agent asks it instead:

1. the agent writes a new token on its fence claim (``ASK_ANNOTATION``, with its node in
   ``NODE_ANNOTATION``) in the install's namespace;
2. the claim watch (the Kopf handler) brings the ask here; it is noted with the moment it
   arrived;
3. the operator lists every claim (``FreshClaims``: one list, shared by every ask it serves)
   started after the asks it answers arrived, and
4. writes each asking node's answer on its fence claim (``ANSWER_ANNOTATION``): the token and
   the claims holding the node's devices in that list (``tessera.models.claimcheck``).

Why the answer is as fresh as the agent's own quorum list: the ask is written after the agent's
check began, it arrives here after it was written, and the list starts after it arrived; a
list asks for no resourceVersion, so the apiserver answers it from etcd with every allocation
committed before it started. The agent takes only the answer with the token it wrote
(``tessera.agent.claimview``), and refuses (``ClaimCheckFailed``) when none comes in time:
nothing is destroyed on a guess.

Cost: two small writes per check (the ask and the answer), each delivered to the few watchers
of every claim (this operator, kube-scheduler, kube-controller-manager) and to the asking
agent's watch of its own fence claim; and one list of every claim per batch of asks, however
many agents ask together. Only the leader answers (its writes go through the gate); a standby
notes asks, and answers those still open when it comes to lead.
Not for: the handover's own check of claims (``handover``, ``freshclaims``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter, Histogram

from tessera.controller.freshclaims import FreshClaims
from tessera.controller.state import ClaimHold
from tessera.kube.claims import ANSWER_ANNOTATION, ASK_ANNOTATION, NODE_ANNOTATION
from tessera.kube.fence import NotLeading
from tessera.kube.http import ApiError
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


class ClaimChecks:
    """Asks seen on fence claims in ``namespace``, answered in batches by ``run()``."""

    def __init__(self, fresh_claims: FreshClaims, answer: Answer, namespace: str,
                 leading: asyncio.Event, retry_after: float = 1.0) -> None:
        self.fresh_claims = fresh_claims
        self._answer = answer
        self.namespace = namespace
        self._leading = leading
        self._retry_after = retry_after
        self._open: dict[str, _Ask] = {}  # fence claim name -> its latest unanswered ask
        self._answering: dict[str, _Ask] = {}  # fence claim name -> the ask a batch is answering now
        self._wake = asyncio.Event()
        self._sending = asyncio.Semaphore(SENDING)
        self.answered = 0

    def seen(self, event_type: str, body: Mapping[str, Any]) -> None:
        """A ResourceClaim event: notes an ask on a fence claim that its answer does not match."""
        meta = body.get("metadata") or {}
        if meta.get("namespace") != self.namespace:
            return
        name = str(meta.get("name", ""))
        annotations = meta.get("annotations") or {}
        token, node = annotations.get(ASK_ANNOTATION), annotations.get(NODE_ANNOTATION)
        if event_type == "DELETED" or not token or not node:
            self._open.pop(name, None)
            return
        if _answered_token(annotations.get(ANSWER_ANNOTATION)) == token:
            self._open.pop(name, None)
            return
        ask = self._open.get(name)
        if ask is None or ask.token != token:
            self._open[name] = _Ask(str(node), str(token), time.monotonic())
            self._wake.set()

    async def run(self) -> None:
        """Answer open asks until cancelled. Each batch (the asks open when the loop wakes, but
        those being answered) is answered from one list started after they all arrived, in a
        task of its own: asks arriving meanwhile start the next batch at once, and its list
        starts as soon as the one in flight is read (``FreshClaims`` reads one at a time)."""
        batches: set[asyncio.Task[None]] = set()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._leading.wait()
                batch = {name: ask for name, ask in self._open.items() if self._answering.get(name) != ask}
                if not batch:
                    continue
                self._answering.update(batch)
                task = asyncio.create_task(self._answer_batch(batch), name="tessera-claim-check-batch")
                batches.add(task)
                task.add_done_callback(batches.discard)
        finally:
            for task in batches:
                task.cancel()

    async def _answer_batch(self, batch: dict[str, _Ask]) -> None:
        try:
            holds = await self.fresh_claims.since(max(ask.arrived for ask in batch.values()))
        except (ApiError, OSError, TimeoutError) as error:
            log.warning("cannot list claims to answer claim checks; trying again", error=str(error))
            failed = True
        else:
            results = await asyncio.gather(*(self._send(name, ask, holds.by_pool.get(ask.node, ()))
                                             for name, ask in batch.items()))
            failed = any(results)
        finally:
            for name, ask in batch.items():
                if self._answering.get(name) == ask:
                    del self._answering[name]
        if failed:
            await self._again()

    async def _send(self, name: str, ask: _Ask, held: Iterable[ClaimHold]) -> BaseException | None:
        answer = ClaimCheckAnswer.of(ask.token, ask.node, (
            (hold.key, [device for pool, device in hold.devices if pool == ask.node]) for hold in held))
        try:
            async with self._sending:
                await self._answer(self.namespace, name, answer.encode())
        except ApiError as error:
            if error.status != 404:
                log.warning("cannot answer a claim check", claim=f"{self.namespace}/{name}", error=str(error))
                return error
            # The fence claim is gone: its agent asks again on a new one.
        except (OSError, TimeoutError, NotLeading) as error:
            log.warning("cannot answer a claim check", claim=f"{self.namespace}/{name}", error=str(error))
            return error
        else:
            self.answered += 1
            ANSWERS.inc()
            ANSWER_SECONDS.observe(time.monotonic() - ask.arrived)
        if self._open.get(name) == ask:
            del self._open[name]
        return None

    async def _again(self) -> None:
        await asyncio.sleep(self._retry_after)
        self._wake.set()


def _answered_token(text: object) -> str | None:
    if not isinstance(text, str):
        return None
    try:
        return ClaimCheckAnswer.decode(text).token
    except AnswerError:
        return None
