"""The handover's clock: which GPUs have had their changing devices published tainted for at
least the grace, so that a fresh read of the claims may clear them for a new layout.

The handover, so that no claim ends up on a device that is about to go: a change to a GPU's
published devices is (a) published first as those devices tainted ``NoSchedule`` — the write
acknowledged; then, after a grace for scheduling cycles already under way, (b) the claims are
read again, directly (:class:`~tessera.controller.freshclaims.FreshClaims`, a list after that
moment, shared by every node waiting for one), and only when neither that read nor the watch
shows a claim holding them is (c) the new layout written to NodeLayout.spec (the Controller
does (a) and (c); ``decide`` judges the holds). The agent checks the claims once more before
it destroys anything.

After an apiserver outage the grace is not enough: kube-scheduler's informers come back on
client-go's backoff (a reflector retries after 0.8 s, doubling to 30 s, each wait stretched by
up to as much again, the doubling reset only after 2 min without a failure: client-go
``tools/cache/reflector.go``), and until its slice informer has, the scheduler allocates from
the slices it saw before the outage, a device's taint unseen. So no grace ends before
``watchers_back_by`` the outages this operator's client saw (``tessera.kube.outages``), and
none while one is under way. ``benchmarks/bench_stale_scheduler.py`` shows the scheduler doing
it on the real control plane; the fault campaign caught the operator recutting a GPU the
scheduler then allocated that way, with a 1 s grace after an apiserver kill. An outage this
process started into (its first calls failed) may have begun any time before, so it is taken
as long: 65 s after it ends. One that ended before this process started, it learns of at
its start from the apiservers' identity Leases (``tessera.kube.apiserverstarts``; a standby
saw it, and keeps what it saw when it comes to lead). What this cannot see: with several
apiservers, one restarting while this process talks to another; a cluster whose Leases it may
not read. There the agent's check and ``MissingDevice`` remain.

This room keeps, per node and GPU, which devices were published tainted and when; it asks
for the node back when a grace ends: with ``after_wave`` (the Controller's), once a claim list
started at the end of the node's wave has been read, so that the reconcile that hands the GPU
over has its list at hand; else through ``come_back`` at that moment. It does not care why a
GPU's layout changes: a policy edit, a GPU taken over, or a recut of an idle GPU that the
adaptive layouts chose from a policy's menu (``tessera.adaptive``). Such a recut reaches the
handover as any other change of the wanted layout does (through ``decide_node``), so it is
tainted, waited on and checked against fresh claims the same way; no second path exists to
write a spec.
Not for: deciding (``decide``), reading claims (``freshclaims``) or any write.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Gauge

from tessera.controller.decide import NodeDecision
from tessera.controller.freshclaims import FreshClaims
from tessera.controller.state import Holds
from tessera.kube.outages import Outages

Cleared = dict[str, tuple[frozenset[str], float]]  # GPU UUID -> (devices published tainted, grace over at)

REFLECTOR_FIRST_S = 0.8  # client-go's reflector: its first wait after a failed list or watch,
REFLECTOR_CAP_S = 30.0  # the wait it doubles to (each stretched by up to as much again: jitter 1.0),
REFLECTOR_RESET_S = 120.0  # and how long without a failure before it starts from the first again
CATCH_UP_S = 5.0  # a reconnected informer's relist (a large fleet's slices) and a scheduling cycle under way
STARTING_S = 5.0  # an apiserver's identity Lease is written as it starts; requests may fail a while after
# An apiserver start longer ago than this is past any informer's wait (a blind spell: 2 * 30 + 5 s after it)
APISERVER_START_WAIT_S = STARTING_S + 2 * REFLECTOR_CAP_S + CATCH_UP_S

HELD = Gauge("tessera_operator_handover_held_seconds",
             "How long no GPU may be handed over yet: kube-scheduler's informers may still be coming back from an "
             "apiserver outage (+Inf while the apiserver does not answer, and until the operator has read, at its "
             "start, what it did not see itself)")


def watchers_back_by(outages: Outages) -> float:
    """When every client-go informer that lost the apiserver in ``outages`` has listed or
    watched again (monotonic seconds): -inf after none, inf while one is under way. An informer
    that failed for ``t`` seconds in a row of spells less than the reset apart waits at most
    twice ``min(30, t + 0.8)`` before its next try (its waits so far add up to at least its
    current one less 0.8 s, and the jitter at most doubles it). A blind spell (this process
    started into it) is taken to have failed long enough for the longest wait: 65 s after it."""
    if outages.since is not None:
        return math.inf
    failing, ended = 0.0, -math.inf
    for began, until, blind in outages.spells:
        if began - ended > REFLECTOR_RESET_S:
            failing = 0.0
        failing += until - began
        if blind:  # this process started into it: it may have been failing for long already
            failing = max(failing, REFLECTOR_CAP_S)
        ended = until
    if ended == -math.inf:
        return ended
    return ended + 2 * min(REFLECTOR_CAP_S, failing + REFLECTOR_FIRST_S) + CATCH_UP_S


class Handover:
    """Taint times per node and GPU, the grace, and the shared fresh read of claims."""

    def __init__(self, fresh_claims: FreshClaims, grace: float, come_back: Callable[[str, float], None],
                 outages: Outages | None = None, known: Callable[[], bool] = lambda: True,
                 after_wave: Callable[[str, float], None] | None = None) -> None:
        self.fresh_claims = fresh_claims
        self.grace = grace
        self._come_back = come_back  # (node, in how many seconds)
        # (node, the monotonic moment its wave ends): for a node whose grace is running. Without
        # it, the node comes back through ``come_back`` at that moment.
        self._after_wave = after_wave
        self.outages = Outages() if outages is None else outages  # the operator client's
        # Whether ``outages`` holds all there is to know: the operator's start adds the apiserver
        # starts it did not see (``tessera.kube.apiserverstarts``), and hands nothing over before.
        self.known = known
        HELD.set_function(self.held_s)
        # node -> GPU UUID -> (devices published tainted, when that write was acknowledged)
        self._tainted: dict[str, Cleared] = {}

    def held_s(self, now: float | None = None) -> float:
        """Seconds until a GPU may be handed over, as far as outages go: +Inf while the
        apiserver does not answer, and until ``known``."""
        if not self.known():
            return math.inf
        now = time.monotonic() if now is None else now
        return max(0.0, watchers_back_by(self.outages) - now)

    def handed_over(self, node: str, decision: NodeDecision, now: float | None = None) -> Cleared:
        """GPUs whose changing devices have been published tainted for at least the grace and
        that no claim in the watch's view holds: ready for the fresh read. Call it right after
        publishing ``decision``'s devices: a GPU seen handing over for the first time (or with
        more devices than before) counts as tainted from ``now``. Others are tracked, and the
        node comes back when their grace is over."""
        now = time.monotonic() if now is None else now
        tainted = self._tainted.setdefault(node, {})
        handing = {uuid: drain for uuid, drain in decision.drains.items() if not drain.claims}
        for uuid in [u for u in tainted if u not in decision.drains]:
            del tainted[uuid]  # settled, or it became something else: a new handover starts afresh
        ready: Cleared = {}
        watchers_back = watchers_back_by(self.outages)
        for uuid, drain in handing.items():
            known = tainted.get(uuid)
            if known is None or not drain.devices <= known[0]:
                known = tainted[uuid] = (drain.devices, now)  # published just now by the caller
            due = max(known[1] + self.grace, watchers_back)
            if due <= now:
                ready[uuid] = (known[0], due)
            elif due == math.inf:  # the apiserver is away: look again in a while
                self._come_back(node, max(self.grace, 1.0))
            elif self._after_wave is not None:
                self._after_wave(node, self.wave_end(due))
            else:
                self._come_back(node, self.wave_end(due) - now)  # the earliest due wins
        if not tainted:
            self._tainted.pop(node, None)
        return ready

    # One grace and one fresh claim list per wave (issue 22). Nodes handed over together end
    # their grace together: a grace that would end at ``due`` ends at the next wave boundary
    # (a multiple of half the grace), so every node whose taint was acknowledged in the same
    # half-grace comes back at the same moment and asks for a list started at or after it;
    # FreshClaims gives them all the one list (the first starts it, the others join it or take
    # its answer). Safety is the same as one list per node: every node's list still starts
    # after its own taint's grace (a boundary is never before the due it rounds up), so a
    # scheduling cycle that began before the taint has had its grace, and any claim it
    # allocated is in the list. The list may also be up to one grace older than the decision it
    # serves (not older): that can only add holds a claim's deletion has since removed, which
    # delays a GPU (it drains, and the node comes back), never cuts a device a claim holds.
    def wave_end(self, due: float) -> float:
        """The wave boundary at or after ``due``: where a grace ending at ``due`` ends."""
        step = max(self.grace / 2, 0.01)
        return math.ceil(due / step) * step

    def read_after(self, cleared: Cleared, now: float | None = None) -> float:
        """The moment a fresh claim list for ``cleared`` must start after: its wave's end, and
        no more than one grace before now (a later reconcile of the node, e.g. after a drain,
        reads claims again instead of reusing an old answer)."""
        now = time.monotonic() if now is None else now
        return max(self.wave_end(max(due for _, due in cleared.values())), now - self.grace)

    def claims_since(self, moment: float) -> Awaitable[Holds]:
        """Every claim's hold from a list started no earlier than ``moment``."""
        return self.fresh_claims.since(moment)

    def forget(self, node: str) -> None:
        """The node has no decision any more (gone, or no agent): nothing of it is handing over."""
        self._tainted.pop(node, None)

    def tracking(self, node: str) -> dict[str, frozenset[str]]:
        """GPU UUID -> devices being handed over on ``node`` (for tests and debugging)."""
        return {uuid: devices for uuid, (devices, _) in self._tainted.get(node, {}).items()}
