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

This room keeps, per node and GPU, which devices were published tainted and when; it asks
for the node back (``come_back``) when a grace ends. It does not care why a GPU's layout
changes: a policy edit, a GPU taken over, or — the adaptive layouts' recut room, when it
lands — a recut of an idle GPU chosen from a policy's menu. Such a recut reaches the
handover as any other change of the wanted layout does (through ``decide_node``), so it is
tainted, waited on and checked against fresh claims the same way; no second path exists to
write a spec.
Not for: deciding (``decide``), reading claims (``freshclaims``) or any write.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

from tessera.controller.decide import NodeDecision
from tessera.controller.freshclaims import FreshClaims
from tessera.controller.state import ClaimHold

Cleared = dict[str, tuple[frozenset[str], float]]  # GPU UUID -> (devices published tainted, grace over at)


class Handover:
    """Taint times per node and GPU, the grace, and the shared fresh read of claims."""

    def __init__(self, fresh_claims: FreshClaims, grace: float, come_back: Callable[[str, float], None]) -> None:
        self.fresh_claims = fresh_claims
        self.grace = grace
        self._come_back = come_back
        # node -> GPU UUID -> (devices published tainted, when that write was acknowledged)
        self._tainted: dict[str, Cleared] = {}

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
        for uuid, drain in handing.items():
            known = tainted.get(uuid)
            if known is None or not drain.devices <= known[0]:
                known = tainted[uuid] = (drain.devices, now)  # published just now by the caller
            due = known[1] + self.grace
            if due <= now:
                ready[uuid] = (known[0], due)
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

    def claims_since(self, moment: float) -> Awaitable[list[ClaimHold]]:
        """Every claim's hold from a list started no earlier than ``moment``."""
        return self.fresh_claims.since(moment)

    def forget(self, node: str) -> None:
        """The node has no decision any more (gone, or no agent): nothing of it is handing over."""
        self._tainted.pop(node, None)

    def tracking(self, node: str) -> dict[str, frozenset[str]]:
        """GPU UUID -> devices being handed over on ``node`` (for tests and debugging)."""
        return {uuid: devices for uuid, (devices, _) in self._tainted.get(node, {}).items()}
