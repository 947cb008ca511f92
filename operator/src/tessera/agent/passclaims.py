"""One fence per agent pass: the claim guard's reads within one reconcile pass share the proof
the pass's first destroying operation paid for, for at most ``max_age`` seconds.

The guard (``tessera.agent.claimguard``) reads the claims naming this node's devices right
before each operation that destroys or reshapes a published device. Proved current
(``tessera.agent.claimview``: ask the operator and wait for its answer, or write a token on
this agent's fence claim and wait for its echo on the claim watch), each read costs a write and
a wait; a pass that repartitions 8 GPUs would make 8 of them.
Here the first destroying operation of a pass fences, and every later one in the same pass,
while that fence is at most ``max_age`` old (measured from the moment the fence write was
sent, not from its echo), reads the watch's view *as it is at that operation*, without a new
fence. Past ``max_age`` the next operation fences again. ``max_age = 0`` fences every time.

What a reused read sees, exactly. A fresh fence proves: every claim change committed before
the fence write was sent is in the view (the watch delivers one resource's events in
resourceVersion order, and the fence's echo comes after all of them). A reused read is the
view now, so it holds everything the first fence proved plus everything the watch delivered
since: it lacks only an allocation committed after the first fence was sent and not yet
delivered by the watch. A fence per operation never closes the window either (the destroy
runs after the read returns, and an allocation committed while the echo is awaited is not in
it): while the watch is healthy the two miss about the same, an allocation committed in the last
few milliseconds before the operation. What reuse gives up is the proof: were the watch to stall
right after the first fence, a reused read could miss an allocation committed up to ``max_age``
before the operation, where a fence would have waited for it (or timed out and refused).
An agent that asks the operator has no watch of claims: its reused read is the pass's answer
itself, so it lacks every allocation committed after the operator's list started, up to
``max_age`` before the operation, not only while a watch stalls. The argument below is what
makes that safe.

Why no allocation the guard must see can be committed in that window — the handover's
invariant. An agent applies a spec the operator wrote, and the operator writes a spec that
destroys or reshapes a published device only after it (a) published that device tainted
``NoSchedule`` (or withdrew it from the slices), the write acknowledged, (b) waited the
handover grace (``tessera.controller.handover``, 1 s by default) for scheduling cycles under
way, and (c) read every claim afresh, started after the grace, and found none holding it. The
device stays tainted (``changing`` in ``tessera.controller.decide``) until this agent's status
reports it gone, which is after this pass. The scheduler allocates only devices that are
published and untainted in its view (unless the claim tolerates the taint), so from (a) plus
the grace on, no new allocation of the device is made; any made before is committed before the
read of (c) started, and the agent's first fence (or ask) of the pass, sent after the spec was
written, is later still. So every allocation of a device this pass destroys is committed before
the first fence: it is in every read of the pass, reused or not. ``max_age`` equal to the grace keeps the
agent's own exposure to the cases outside that argument — a scheduling cycle whose view was
older than the taint and whose allocation commits later than the grace, a claim that tolerates
Tessera's drain taint (``DRAIN_TAINT_KEY``), a NodeLayout.spec written by hand rather than by
the operator — within one grace more than a fence per operation gives (for an agent with a
watch, only while the watch stalls).
Where that is not enough, ``AgentConfig.claim_reuse_seconds = 0`` fences every operation.
tests/test_agent_passclaims.py checks both halves on a seeded model of the watch.

Not for: proving the view current (``ClaimView.fresh``) or deciding whether a claim holds a
device (``tessera.agent.claimguard``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

Claims = list[dict[str, Any]]


class PassClaimReads:
    """The guard's claim reads for one pass: the first (and one after each ``max_age``) fenced
    through ``fresh``, the others the live view ``held``. Make one per pass."""

    def __init__(self, fresh: Callable[[], Awaitable[Claims]], held: Callable[[], Claims], max_age: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fresh = fresh
        self._held = held
        self.max_age = max_age
        self._clock = clock
        self._proved_at: float | None = None  # when the last successful fence of this pass was sent
        self.fenced = 0  # reads proved by a fence of their own
        self.reused = 0  # reads that relied on an earlier fence of this pass

    async def read(self) -> Claims:
        """The claims naming this node's pool: every change committed before this pass's last
        fence (sent at most ``max_age`` ago), and every one the watch has delivered since.
        Raises what ``fresh`` raises (the guard refuses then)."""
        now = self._clock()
        if self._proved_at is not None and now - self._proved_at <= self.max_age:
            self.reused += 1
            return self._held()
        claims = await self._fresh()
        self._proved_at = now  # the fence was sent after this reading of the clock
        self.fenced += 1
        return claims
