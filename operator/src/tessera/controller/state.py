"""The operator's in-memory view of the cluster, fed by watch events.

The Controller turns the watch events its handlers and watches pass on into the small values here
(policies, nodes with their NodeLayouts, our driver's allocations from ResourceClaims, and which
claims on Tessera's DeviceClasses wait for an allocation); the pure deciding code reads them. Nothing here does I/O.
Not for: deciding anything (``tessera.controller.decide``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from pydantic import ValidationError

from tessera import DRIVER_NAME
from tessera.dra.deviceclasses import device_classes
from tessera.models.allocation import held_devices
from tessera.models.layout import GpuLayout, NodeLayout
from tessera.models.policy import SharingPolicy
from tessera.planner.fleet import PlanMemo

DeviceKey = tuple[str, str]  # (pool, device)
TESSERA_CLASSES = frozenset(str(c["metadata"]["name"]) for c in device_classes())


def pending_on_our_classes(body: Mapping[str, Any]) -> bool:
    """A claim not allocated yet that asks for one of the DeviceClasses Tessera installs
    (``exactly`` or any ``firstAvailable`` alternative): demand the dashboard shows as pending."""
    if ((body.get("status") or {}).get("allocation")) or body.get("metadata", {}).get("deletionTimestamp"):
        return False
    requests = ((body.get("spec") or {}).get("devices") or {}).get("requests") or []
    names = set()
    for request in requests:
        names.add((request.get("exactly") or {}).get("deviceClassName"))
        names.update(alt.get("deviceClassName") for alt in request.get("firstAvailable") or [])
    return bool(names & TESSERA_CLASSES)


@dataclass(frozen=True)
class ClaimHold:
    """A ResourceClaim that holds some of our devices."""

    namespace: str
    name: str
    devices: frozenset[DeviceKey]
    pods: tuple[tuple[str, str], ...]  # (namespace, name) of the Pods it is reserved for
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_hold(body: Mapping[str, Any]) -> ClaimHold | None:
    """Our driver's devices a ResourceClaim holds (its allocation), or None if it holds none;
    the rules (admin access holds nothing) are ``tessera.models.allocation``'s."""
    meta = body.get("metadata", {})
    status = body.get("status") or {}
    devices = held_devices(body, DRIVER_NAME)
    if not devices:
        return None
    pods = tuple(
        sorted(
            (str(meta.get("namespace", "")), str(ref["name"]))
            for ref in status.get("reservedFor") or []
            if ref.get("resource") == "pods" and ref.get("name")
        )
    )
    return ClaimHold(str(meta.get("namespace", "")), str(meta.get("name", "")), devices, pods, str(meta.get("uid", "")))


def _pools(hold: ClaimHold | None) -> set[str]:
    return {pool for pool, _ in hold.devices} if hold is not None else set()


class Holds(tuple[ClaimHold, ...]):
    """Holds read together (a fresh list of every claim), with each pool's at hand: one list
    serves every node of a handover wave, and a node's decision looks up only its own."""

    by_pool: Mapping[str, tuple[ClaimHold, ...]]

    def __new__(cls, holds: Iterable[ClaimHold] = ()) -> Holds:
        self = super().__new__(cls, holds)
        pools: dict[str, list[ClaimHold]] = defaultdict(list)
        for hold in self:
            for pool in _pools(hold):
                pools[pool].append(hold)
        self.by_pool = {pool: tuple(held) for pool, held in pools.items()}
        return self


@dataclass(frozen=True)
class DrainState:
    """A GPU whose new layout waits until the devices it would change are handed over: tainted,
    checked against fresh claims, and held by none. ``claims`` empty: the handover itself."""

    node: str
    gpu_uuid: str
    gpu_index: int
    policy: str | None
    target: GpuLayout
    devices: frozenset[str]  # published devices the new layout changes or removes
    claims: tuple[str, ...]  # claims (namespace/name) that still hold some of them
    since: float  # monotonic time the drain began
    timed_out: bool = False

    def describe(self) -> str:
        n = len(self.claims)
        return f"{n} claim{'s' if n != 1 else ''} on {self.node} GPU {self.gpu_index}"


@dataclass
class NodeView:
    name: str
    uid: str
    labels: dict[str, str]
    layout: NodeLayout | None = None
    layout_error: str | None = None  # a NodeLayout we could not read


@dataclass
class Fleet:
    """Everything the operator knows, keyed the way the decisions need it."""

    policies: dict[str, SharingPolicy] = field(default_factory=dict)
    policy_bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    policy_errors: dict[str, str] = field(default_factory=dict)  # policies we could not parse
    nodes: dict[str, NodeView] = field(default_factory=dict)
    layouts: dict[str, NodeLayout] = field(default_factory=dict)  # NodeLayouts seen before their Node
    claims: dict[str, ClaimHold] = field(default_factory=dict)
    # GPU UUID -> the menu layout an Adaptive policy's GPU gets (``tessera.controller.demand``
    # chooses; a GPU not here keeps the one its NodeLayout.spec records, else the idle one).
    adaptive_choices: dict[str, str] = field(default_factory=dict)
    # node -> GPUs (UUIDs) whose devices are published with the reservation taint: the Adaptive
    # GPUs of a node kept for a waiting claim that needs several of them (``demand``).
    adaptive_reserved: dict[str, frozenset[str]] = field(default_factory=dict)
    pending_claims: set[str] = field(default_factory=set)  # namespace/name: unallocated, on our classes
    # pool -> namespace/name -> hold: ``claims`` by the node whose devices they hold (kept beside
    # it by set_claim and remove_claim), so that a node's decision reads its own claims, not the
    # cluster's (a rollout decides every node three or four times: bench_decide.py).
    _pool_claims: dict[str, dict[str, ClaimHold]] = field(default_factory=dict, init=False, repr=False)
    # pool -> device -> how many claims hold it (the fleet metrics' allocated devices)
    _pool_devices: dict[str, Counter[str]] = field(default_factory=dict, init=False, repr=False)
    # The GPU plans of the shapes this fleet has, kept between decisions (``planner.fleet``).
    plan_memo: PlanMemo = field(default_factory=PlanMemo, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key, hold in self.claims.items():
            self._reindex(key, None, hold)

    # -- updates from watch events ---------------------------------------------------------

    def set_policy(self, body: Mapping[str, Any]) -> bool:
        """Record a policy; True when what it asks for changed (its spec, or whether it parses)."""
        name = str(body["metadata"]["name"])
        before = self.policies.get(name), self.policy_errors.get(name)
        self.policy_bodies[name] = dict(body)
        try:
            policy = SharingPolicy.model_validate(
                {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
            )
            if before[0] is not None and before[0].spec == policy.spec:
                # The same spec object as before (a status write's echo changes only metadata):
                # the plans memoised for it stay good.
                policy = policy.model_copy(update={"spec": before[0].spec})
            self.policies[name] = policy
            self.policy_errors.pop(name, None)
        except ValidationError as exc:
            self.policies.pop(name, None)
            self.policy_errors[name] = _validation_message(exc)
        after = self.policies.get(name), self.policy_errors.get(name)
        return (before[0].spec if before[0] else None, before[1]) != (after[0].spec if after[0] else None, after[1])

    def remove_policy(self, name: str) -> None:
        self.policies.pop(name, None)
        self.policy_bodies.pop(name, None)
        self.policy_errors.pop(name, None)

    def set_node(self, body: Mapping[str, Any]) -> bool:
        """Record a Node; True when its labels (what policies select on) changed."""
        meta = body["metadata"]
        name = str(meta["name"])
        labels = dict(meta.get("labels") or {})
        view = self.nodes.get(name)
        if view is None:
            self.nodes[name] = NodeView(name, str(meta.get("uid", "")), labels, self.layouts.pop(name, None))
            return True
        changed = view.labels != labels
        view.labels, view.uid = labels, str(meta.get("uid", view.uid))
        return changed

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.layouts.pop(name, None)

    def set_layout(self, body: Mapping[str, Any]) -> str:
        name = str(body["metadata"]["name"])
        try:
            layout = NodeLayout.model_validate(
                {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}
            )
            error = None
        except ValidationError as exc:
            layout, error = None, _validation_message(exc)
        view = self.nodes.get(name)
        if view is None:
            # Held until its Node arrives; an unreadable one replaces what came before, so the
            # Node never starts out with a layout that is no longer true.
            if layout is not None:
                self.layouts[name] = layout
            else:
                self.layouts.pop(name, None)
        elif layout is not None:
            view.layout, view.layout_error = layout, None
        else:
            # Keep the last NodeLayout we could read: acting on "no layout" would unpublish
            # every device of the node over what may be a version skew between agent and us.
            view.layout_error = error
        return name

    def remove_layout(self, name: str) -> None:
        self.layouts.pop(name, None)
        if (view := self.nodes.get(name)) is not None:
            view.layout, view.layout_error = None, None

    def set_claim(self, body: Mapping[str, Any]) -> set[str]:
        """Record a claim's allocation; returns the nodes (pools) whose holds changed."""
        meta = body["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        hold = claim_hold(body)
        if pending_on_our_classes(body):
            self.pending_claims.add(key)
        else:
            self.pending_claims.discard(key)
        before = self.claims.get(key)
        if hold is None:
            self.claims.pop(key, None)
        else:
            self.claims[key] = hold
        self._reindex(key, before, hold)
        if before == hold:
            return set()
        return _pools(before) | _pools(hold)

    def remove_claim(self, namespace: str, name: str) -> set[str]:
        key = f"{namespace}/{name}"
        self.pending_claims.discard(key)
        before = self.claims.pop(key, None)
        self._reindex(key, before, None)
        return _pools(before)

    def _reindex(self, key: str, before: ClaimHold | None, after: ClaimHold | None) -> None:
        for pool in _pools(before) - _pools(after):
            held = self._pool_claims[pool]
            del held[key]
            if not held:
                del self._pool_claims[pool]
        for pool, device in before.devices if before is not None else ():
            counts = self._pool_devices[pool]
            counts[device] -= 1
            if not counts[device]:
                del counts[device]
                if not counts:
                    del self._pool_devices[pool]
        if after is not None:
            for pool in _pools(after):
                self._pool_claims.setdefault(pool, {})[key] = after
            for pool, device in after.devices:
                self._pool_devices.setdefault(pool, Counter())[device] += 1

    # -- queries ---------------------------------------------------------------------------

    def holders(self, node: str, fresh: Iterable[ClaimHold] = ()) -> dict[str, list[ClaimHold]]:
        """Device name → the claims that hold it, for one node's pool: by the watch's view and
        by ``fresh`` (claims read directly), so a device either view sees held counts as held.
        Costs what the node's claims cost: the watch's are indexed by pool, and so is a fresh
        list read as :class:`Holds`."""
        out: dict[str, list[ClaimHold]] = defaultdict(list)
        mine = fresh.by_pool.get(node, ()) if isinstance(fresh, Holds) else fresh
        for hold in chain(self._pool_claims.get(node, {}).values(), mine):
            for pool, device in hold.devices:
                if pool == node and hold not in out[device]:
                    out[device].append(hold)
        return out

    def devices_held(self, node: str) -> int:
        """How many of ``node``'s devices some claim holds."""
        return len(self._pool_devices.get(node, ()))

    def gpu_nodes(self) -> list[NodeView]:
        """Nodes with a NodeLayout (an agent runs there), sorted by name."""
        return sorted((v for v in self.nodes.values() if v.layout is not None), key=lambda v: v.name)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "object"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
