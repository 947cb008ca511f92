"""SharingPolicy status from the operator's decisions: counts, conflicts, what drains wait
for, and the conditions Ready / Progressing / Degraded (Kubernetes conventions).

Pure. ``lastTransitionTime`` moves only when a condition's status changes, so a resync that
finds nothing new produces an identical status and no write.
Not for: writing the status (``tessera.controller.runtime`` does that).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.controller.decide import GpuDecision, NodeDecision
from tessera.controller.state import Fleet
from tessera.models.conditions import ConditionStatus, set_condition
from tessera.models.layout import NodeLayout
from tessera.models.policy import PolicyConflict, SharingPolicy, SharingPolicyStatus

MAX_LISTED = 20


@dataclass(frozen=True)
class PolicyTally:
    nodes: int
    gpus: int
    applied: int
    devices: int
    conflicts: tuple[PolicyConflict, ...]
    errors: tuple[str, ...]
    draining: tuple[str, ...]
    timed_out: tuple[str, ...]
    missing: tuple[str, ...] = ()  # claims allocated devices that no longer exist
    blocked: tuple[str, ...] = ()  # GPUs whose agent waits for something before it applies (InstanceInUse, ...)
    stuck: tuple[str, ...] = ()  # GPUs whose agent cannot apply without a person (ResetRequired, OperationFailed...)


def _applied(fleet: Fleet, node: NodeDecision, decision: GpuDecision) -> bool:
    """The agent reports the wanted layout as applied for the current NodeLayout generation,
    and (once the operator has carried the decision out) that report is what was published."""
    if not decision.settled:
        return False
    view = fleet.nodes.get(node.node)
    layout = view.layout if view is not None else None
    if layout is None:
        return False
    status = node.published if node.published is not None else layout.status
    generation = node.spec_generation if node.spec_generation is not None else layout.metadata.generation
    if status is None or status.observed_generation is None or status.observed_generation != generation:
        return False
    gpu = status.gpu(decision.uuid)
    return gpu is not None and gpu.applied and gpu.strategy == (decision.target.strategy if decision.target else None)


# Agent reasons that clear without anyone's help: a process or claim lets go of a device.
_WAITS_BY_ITSELF = frozenset({"InstanceInUse", "GpuInUse"})


def _blocked(fleet: Fleet, node: NodeDecision, decision: GpuDecision) -> tuple[str, bool] | None:
    """Why the agent does not apply the wanted layout, when its report for the current NodeLayout
    generation says so (``ResetRequired``: an Ampere GPU needs a reset; ``InstanceInUse``...), and
    whether that needs a person. Without it a policy says Applying forever while the agent waits."""
    if not decision.settled:
        return None
    view = fleet.nodes.get(node.node)
    layout = view.layout if view is not None else None
    status = layout.status if layout is not None else None
    if layout is None or status is None or status.observed_generation != layout.metadata.generation:
        return None
    gpu = status.gpu(decision.uuid)
    if gpu is None or gpu.applied or gpu.reason in ("", "Applying"):
        return None
    # (what, whether it needs a person); the agent's message starts "GPU <index>: "
    return f"{node.node} {gpu.message} ({gpu.reason})", gpu.reason not in _WAITS_BY_ITSELF


def _selector_errors(policy: str, decision: NodeDecision) -> list[str]:
    """GPUs of the node where ``policy``'s gpuSelector failed: the policy selects nothing there,
    so without these it would report AsExpected while its selector errors on every GPU."""
    return [
        f"{decision.node} GPU {plan.gpu.index}: gpuSelector failed: {why}"
        for plan in decision.plan.for_node(decision.node)
        for failed, why in plan.selector_errors
        if failed == policy
    ]


def node_tally(fleet: Fleet, policy: str, decision: NodeDecision, spec_pending: bool) -> PolicyTally:
    """``policy``'s counts on one node (``spec_pending``: its new NodeLayout.spec is not written
    yet, so its GPUs count as not applied)."""
    applied_here = gpus = applied = devices = 0
    errors = [*([decision.plan.policy_errors[policy]] if policy in decision.plan.policy_errors else []),
              *_selector_errors(policy, decision)]
    draining: list[str] = []
    timed_out: list[str] = []
    blocked: list[str] = []
    stuck: list[str] = []
    for gpu in decision.gpus:
        if gpu.policy != policy:
            continue
        applied_here = 1
        gpus += 1
        devices += decision.devices_of(gpu.uuid)
        if gpu.error:
            errors.append(f"{decision.node} GPU {gpu.index}: {gpu.error}")
        if gpu.drain is not None and gpu.drain.claims:  # a handover with no claim is not a drain
            (timed_out if gpu.drain.timed_out else draining).append(gpu.drain.describe())
        if not spec_pending and _applied(fleet, decision, gpu):
            applied += 1
        elif not spec_pending and (why := _blocked(fleet, decision, gpu)):
            (stuck if why[1] else blocked).append(why[0])
    return PolicyTally(
        applied_here, gpus, applied, devices, tuple(decision.plan.conflicts_of(policy)), tuple(errors),
        tuple(draining), tuple(timed_out), tuple(m.describe() for m in decision.missing if m.policy == policy),
        tuple(blocked), tuple(stuck),
    )


class TallyMemo:
    """Each node's :func:`node_tally` per policy, kept while what it was counted from stays
    the same (the decision and the NodeLayout, both replaced, never changed, when they move,
    and whether the spec is pending): a status pass then counts again only the nodes that
    changed since the last, not the whole fleet (35 ms a pass at 1,000 nodes before)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str], tuple[NodeDecision, NodeLayout | None, bool, PolicyTally]] = {}
        self._seen: dict[tuple[str, str], tuple[NodeDecision, NodeLayout | None, bool, PolicyTally]] = {}

    def node(self, fleet: Fleet, policy: str, decision: NodeDecision, spec_pending: bool) -> PolicyTally:
        view = fleet.nodes.get(decision.node)
        layout = view.layout if view is not None else None
        key = (policy, decision.node)
        kept = self._kept.get(key)
        if kept is not None and kept[0] is decision and kept[1] is layout and kept[2] == spec_pending:
            part = kept[3]
        else:
            part = node_tally(fleet, policy, decision, spec_pending)
        self._seen[key] = (decision, layout, spec_pending, part)
        return part

    def next_pass(self) -> None:
        """Forget what the last pass did not count (nodes gone, policies deleted)."""
        self._kept, self._seen = self._seen, {}


def tally(
    fleet: Fleet, policy: str, decisions: Iterable[NodeDecision], spec_pending: Mapping[str, bool],
    memo: TallyMemo | None = None,
) -> PolicyTally:
    """Counts for ``policy`` over every node's latest decision, in node order. ``spec_pending``:
    nodes whose new NodeLayout.spec is not written yet (their GPUs count as not applied)."""
    nodes = gpus = applied = devices = 0
    conflicts: list[PolicyConflict] = []
    errors: list[str] = []
    draining: list[str] = []
    timed_out: list[str] = []
    missing: list[str] = []
    blocked: list[str] = []
    stuck: list[str] = []
    for decision in sorted(decisions, key=lambda d: d.node):
        pending = spec_pending.get(decision.node, False)
        part = (memo.node(fleet, policy, decision, pending) if memo is not None
                else node_tally(fleet, policy, decision, pending))
        nodes += part.nodes
        gpus += part.gpus
        applied += part.applied
        devices += part.devices
        conflicts.extend(part.conflicts)
        errors.extend(part.errors)
        draining.extend(part.draining)
        timed_out.extend(part.timed_out)
        missing.extend(part.missing)
        blocked.extend(part.blocked)
        stuck.extend(part.stuck)
    return PolicyTally(
        nodes, gpus, applied, devices, tuple(conflicts), tuple(dict.fromkeys(errors)), tuple(draining),
        tuple(timed_out), tuple(missing), tuple(blocked), tuple(stuck),
    )


def _first(items: tuple[str, ...], limit: int = 3) -> str:
    more = len(items) - limit
    return "; ".join(items[:limit]) + (f"; and {more} more" if more > 0 else "")


def policy_status(policy: SharingPolicy, t: PolicyTally, previous: SharingPolicyStatus | None) -> SharingPolicyStatus:
    """The status to write for ``policy``."""
    generation = policy.metadata.generation
    conditions = list(previous.conditions) if previous is not None else []
    if t.missing:  # first: a workload has lost its device, whatever else is wrong
        conditions = set_condition(
            conditions, "Degraded", True, "AllocatedDeviceMissing", _first(t.missing), generation
        )
    elif t.errors:
        conditions = set_condition(conditions, "Degraded", True, "PlanFailed", _first(t.errors), generation)
    elif t.timed_out:
        conditions = set_condition(
            conditions, "Degraded", True, "DrainTimeout",
            f"drain timed out, still waiting for {_first(t.timed_out)}", generation,
        )
    elif t.stuck:
        conditions = set_condition(conditions, "Degraded", True, "ApplyBlocked", _first(t.stuck), generation)
    else:
        conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", generation)

    waiting = t.draining + t.timed_out
    if waiting:
        conditions = set_condition(
            conditions, "Progressing", True, "Draining", f"waiting for {_first(waiting)}", generation
        )
    elif t.applied < t.gpus:
        conditions = set_condition(
            conditions, "Progressing", True, "Applying", f"{t.applied}/{t.gpus} GPUs applied", generation
        )
    else:
        conditions = set_condition(conditions, "Progressing", False, "Stable", "", generation)

    where = f"{t.gpus} GPU{'s' if t.gpus != 1 else ''} on {t.nodes} node{'s' if t.nodes != 1 else ''}"
    if t.gpus == 0:
        reason, message, ready = "NoMatchingGPUs", "the policy selects no GPU that it wins", False
    elif t.applied == t.gpus:
        reason, message, ready = "Applied", f"{t.applied}/{where}", True
    else:
        degraded = t.errors or t.timed_out or t.missing or t.stuck
        reason = "Degraded" if degraded else ("Draining" if waiting else ("Blocked" if t.blocked else "Applying"))
        message, ready = f"{t.applied}/{where} applied", False
        if reason == "Blocked":
            message += f"; the agent waits: {_first(t.blocked)}"
    conditions = set_condition(conditions, "Ready", ready, reason, message, generation)
    order = {"Ready": 0, "Progressing": 1, "Degraded": 2}
    conditions.sort(key=lambda c: order.get(c.type, 9))
    return SharingPolicyStatus(
        observed_generation=generation,
        conditions=conditions,
        nodes=t.nodes,
        gpus=t.gpus,
        gpus_applied=t.applied,
        devices_published=t.devices,
        conflicts=len(t.conflicts),
        conflicting=list(t.conflicts[:MAX_LISTED]),
        draining=list(waiting[:50]),
    )


def transitions(before: SharingPolicyStatus | None, after: SharingPolicyStatus) -> list[tuple[str, str, str]]:
    """Events worth posting: (type, reason, message) for conditions that entered a notable
    state: a new status, or a new reason under the same status (a drain that starts while
    Progressing is already True for Applying, a Degraded policy whose drain now times out)."""
    old = {c.type: (c.status, c.reason) for c in (before.conditions if before else [])}
    out = []
    for c in after.conditions:
        if old.get(c.type) == (c.status, c.reason):
            continue
        if c.type == "Ready" and c.status is ConditionStatus.TRUE:
            out.append(("Normal", c.reason, c.message))
        elif c.type == "Degraded" and c.status is ConditionStatus.TRUE:
            out.append(("Warning", c.reason, c.message))
        elif c.type == "Progressing" and c.status is ConditionStatus.TRUE and c.reason == "Draining":
            out.append(("Normal", "Draining", c.message))
    return out
