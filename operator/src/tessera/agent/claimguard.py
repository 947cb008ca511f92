"""The agent as the last line: no device a ResourceClaim is allocated is destroyed or reshaped.

The operator hands a GPU over safely before it writes a new layout (taint, wait, check claims),
but the scheduler, the operator and the agent race, and a claim allocated in between must
still keep its device. So right before the reconciler runs an operation that destroys or
reshapes published devices (``tessera.agent.reconciler.devices_changed``: destroy a MIG
instance, toggle MIG mode, start or stop MPS, change time-slicing), ``ClaimGuard`` reads the
claims as fresh as a quorum read (the agent's ``ClaimView``: the operator's answer to its
ask, or its own watch proved current by a fence; or a list of every claim) and refuses with
``InstanceInUse`` — naming the claim — when an allocation of our driver in this node's pool
names one of those devices. When the claims
cannot be read, it refuses with ``ClaimCheckFailed``: nothing is destroyed on a guess.

``allocated_devices_on_node`` is pure: claims in, (claim, device) pairs out.
Not for: the kubelet plugin's reading of a claim it prepares (``tessera.agent.plugin.claims``);
the two stay independent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.agent.backends.base import GpuInfo
from tessera.agent.reconciler import Blocker, BlockReason, Operation, devices_changed
from tessera.models.allocation import allocation_results, claim_key
from tessera.models.layout import NodeLayoutSpec, NodeLayoutStatus


@dataclass(frozen=True, slots=True)
class ClaimedDevice:
    """One device of one claim's allocation."""

    claim: str  # "<namespace>/<name>"
    device: str
    shared: bool  # the result has a shareID: one of several allocations of the device


def allocated_devices_on_node(claims: Sequence[Mapping[str, Any]], driver: str, node: str) -> list[ClaimedDevice]:
    """Every device of ``driver`` in ``node``'s pool (pool name = node name) that an allocation
    names, whether or not the claim is prepared or reserved yet; what a claim holds (an
    admin-access result holds nothing) is ``tessera.models.allocation``'s answer, the same one
    the operator's handover reads."""
    out = [
        ClaimedDevice(claim=claim_key(claim), device=result.device, shared=result.shared)
        for claim in claims
        for result in allocation_results(claim, driver, pool=node)
    ]
    return sorted(out, key=lambda c: (c.device, c.claim))


class ClaimGuard:
    """A reconciler guard: refuse an operation that would change a device a claim is allocated.

    ``list_claims`` returns ResourceClaims, at least every one whose allocation names this node's
    pool, with every change committed before the call (blocking; it is called from the
    reconciler's worker thread). ``published`` is the status the agent last
    wrote, i.e. what the slices show; ``spec`` is the layout being applied."""

    def __init__(
        self,
        list_claims: Callable[[], Sequence[Mapping[str, Any]]],
        *,
        driver: str,
        node: str,
        spec: NodeLayoutSpec,
        published: NodeLayoutStatus | None,
    ) -> None:
        self._list_claims = list_claims
        self._driver = driver
        self._node = node
        self._spec = spec
        self._published = published
        self.checks = 0  # how many times the claims were read (tests, metrics)

    def __call__(self, op: Operation, gpu: GpuInfo) -> Blocker | None:
        published = self._published.gpu(gpu.uuid) if self._published is not None else None
        changed = devices_changed(op, gpu, self._spec.for_gpu(gpu.uuid), published)
        if changed is None:
            return None
        step = op.describe().split(": ", 1)[1]
        self.checks += 1
        try:
            claims = self._list_claims()
        except Exception as e:  # any failure to read means "cannot tell": refuse, retry next pass
            return Blocker(
                BlockReason.CLAIM_CHECK_FAILED,
                f"GPU {gpu.index}: {step} waits: cannot read ResourceClaims to check that no claim "
                f"holds {changed.describe()} ({type(e).__name__}: {e})",
            )
        hits = [c for c in allocated_devices_on_node(claims, self._driver, self._node) if changed.covers(c.device)]
        if not hits:
            return None
        named = ", ".join(f"ResourceClaim {c.claim} is allocated device {c.device}" for c in hits[:5])
        more = f" (and {len(hits) - 5} more)" if len(hits) > 5 else ""
        return Blocker(
            BlockReason.INSTANCE_IN_USE,
            f"GPU {gpu.index}: {step} refused: {named}{more}; it goes when the claim is released",
        )
