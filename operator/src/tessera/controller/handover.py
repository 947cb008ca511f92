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

This room keeps, per node and GPU, which devices were published tainted and when, and one
timer per wave end: when a wave's grace ends, the timer starts the wave's claim list, and the
wave's nodes come back (``enqueue``) once it is read, so that the reconcile that hands their
GPUs over finds it at hand (``fresh_for``) instead of each node deciding once only to ask for
it. While the apiserver is away, a node comes back (``come_back``) to look again. It does not care why a
GPU's layout changes: a policy edit, a GPU taken over, or a recut of an idle GPU that the
adaptive layouts chose from a policy's menu (``tessera.adaptive``). Such a recut reaches the
handover as any other change of the wanted layout does (through ``decide_node``), so it is
tainted, waited on and checked against fresh claims the same way; no second path exists to
write a spec.
Not for: deciding (``decide``), how claims are read (``freshclaims``) or any write.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

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
LIST_SHARE = 4.0  # a wave's step is at least this many times what the last fresh claim list took

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
    """Taint times per node and GPU, the grace, and each wave's fresh read of claims."""

    def __init__(self, fresh_claims: FreshClaims, grace: float, come_back: Callable[[str, float], None],
                 enqueue: Callable[..., None], outages: Outages | None = None,
                 known: Callable[[], bool] = lambda: True) -> None:
        self.fresh_claims = fresh_claims
        self.grace = grace
        self._come_back = come_back  # (node, in how many seconds): the apiserver is away, look again
        self._enqueue = enqueue  # (*nodes): their claim list is read, hand over
        self.outages = Outages() if outages is None else outages  # the operator client's
        # Whether ``outages`` holds all there is to know: the operator's start adds the apiserver
        # starts it did not see (``tessera.kube.apiserverstarts``), and hands nothing over before.
        self.known = known
        HELD.set_function(self.held_s)
        # node -> GPU UUID -> (devices published tainted, when that write was acknowledged)
        self._tainted: dict[str, Cleared] = {}
        # wave end (monotonic) -> the nodes whose grace ends there, and the timer that lists claims then
        self._waves: dict[float, tuple[set[str], asyncio.TimerHandle]] = {}
        # node -> the start of the claim list it came back for (a wave's, or one it asked for)
        self._asked: dict[str, float] = {}

    def stop(self) -> None:
        """Cancel the waves' timers (the operator stops, or a new term starts a new handover)."""
        for _, timer in self._waves.values():
            timer.cancel()
        self._waves.clear()

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
            else:
                self._join_wave(node, self.wave_end(due))
        if not tainted:
            self._tainted.pop(node, None)
        return ready

    # One grace and one fresh claim list per wave (issue 22). Nodes handed over together end
    # their grace together: a grace that would end at ``due`` ends at the next wave boundary
    # (a multiple of the wave's step), so every node whose taint was acknowledged in the same
    # step shares one timer there, which starts one claim list for them all (a node
    # that asks for a list itself joins one in flight or takes the last answer when it
    # qualifies: FreshClaims). Safety is the same as one list per node: every node's list still starts
    # after its own taint's grace (a boundary is never before the due it rounds up), so a
    # scheduling cycle that began before the taint has had its grace, and any claim it
    # allocated is in the list. The list may also be up to one grace older than the decision it
    # serves (not older): that can only add holds a claim's deletion has since removed, which
    # delays a GPU (it drains, and the node comes back), never cuts a device a claim holds.
    # The step follows what a list costs: four times the last list's time, between a tenth of
    # the grace and half of it (half before any list). Cheap lists (a cluster of few claims)
    # end a node's grace at most a tenth of a grace late; lists of a large cluster's claims keep
    # to one per half-grace, as before, so listing never takes more than about a quarter of the
    # time it has.
    def wave_step(self) -> float:
        """The spacing of wave boundaries now (seconds)."""
        longest, shortest = self.grace / 2, self.grace / 10
        listed = self.fresh_claims.seconds
        step = longest if listed is None else min(longest, max(shortest, LIST_SHARE * listed))
        return max(step, 0.01)

    def wave_end(self, due: float) -> float:
        """The wave boundary at or after ``due``: where a grace ending at ``due`` ends."""
        step = self.wave_step()
        return max(due, math.ceil(due / step) * step)  # max: a step of no exact binary value may round below

    def read_after(self, cleared: Cleared, now: float | None = None) -> float:
        """The moment a fresh claim list for ``cleared`` must start after: the end of every
        grace it has (its wave's list, started at the wave's end, is later still), and no more
        than one grace before now (a later reconcile of the node, e.g. after a drain, reads
        claims again instead of reusing an old answer). Not the wave's end recomputed: the
        step may have changed since the node joined its wave, and a boundary on a new grid
        can fall after the list its wave read."""
        now = time.monotonic() if now is None else now
        return max(max(due for _, due in cleared.values()), now - self.grace)

    def fresh_for(self, node: str, cleared: Cleared, now: float | None = None) -> Holds | None:
        """Every claim's hold from a list started after every grace of ``cleared`` (its wave's
        end): the list the node came back for, or one no more than a grace old. None when no
        such list is read yet: one is started (or joined), and the node comes back once it is."""
        moment = self.read_after(cleared, now)
        asked = self._asked.pop(node, None)
        if asked is not None:  # the list this node came back for serves, if after its grace
            moment = min(moment, max(asked, self.read_after(cleared, now=-math.inf)))
        fresh = self.fresh_claims.ready(moment)
        if fresh is None:
            self._asked[node] = moment
            self.fresh_claims.prefetch(moment, lambda: self._enqueue(node))
        return fresh

    def _join_wave(self, node: str, wave_end: float) -> None:
        """``node``'s grace ends with its wave at ``wave_end``. One timer per wave starts the
        wave's claim list there, and its nodes come back once the list is read. The list counts
        for the handover only through ``fresh_for``'s check (it started after every grace the
        node's cleared GPUs had), as any list a node asked for does."""
        wave = self._waves.get(wave_end)
        if wave is None:
            delay = max(0.0, wave_end - time.monotonic())  # the event loop's clock is time.monotonic
            timer = asyncio.get_running_loop().call_later(delay, self._wave_over, wave_end)
            wave = self._waves[wave_end] = (set(), timer)
        wave[0].add(node)

    def _wave_over(self, wave_end: float) -> None:
        nodes, _ = self._waves.pop(wave_end)
        moment = time.monotonic()
        for node in nodes:
            self._asked[node] = moment
        self.fresh_claims.prefetch(moment, lambda: self._enqueue(*sorted(nodes)))

    def forget(self, node: str) -> None:
        """The node has no decision any more (gone, or no agent): nothing of it is handing over."""
        self._tainted.pop(node, None)
        self._asked.pop(node, None)

    def tracking(self, node: str) -> dict[str, frozenset[str]]:
        """GPU UUID -> devices being handed over on ``node`` (for tests and debugging)."""
        return {uuid: devices for uuid, (devices, _) in self._tainted.get(node, {}).items()}

    def waves(self) -> dict[float, frozenset[str]]:
        """Wave end -> the nodes that come back after it (for tests and debugging)."""
        return {end: frozenset(nodes) for end, (nodes, _) in self._waves.items()}
