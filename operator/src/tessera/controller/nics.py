"""The NIC family's room in the operator: NetworkSharingPolicies and the NICs agents report in
NodeLayout status, into one ``nic.tessera.dev`` ResourceSlice per node and each policy's status.

A room of its own beside the GPU controller, sharing with it the API client and, in the operator,
the GPU room's Node and NodeLayout watches (``Controller.share_watches``: the NodeLayouts are the
cluster's largest objects, watched and decoded once); its own list-watches of
NetworkSharingPolicies and of its slices (the NIC driver's only), its own state, its own
slices (another driver, so the GPU publisher leaves them alone), one worker that publishes
the nodes an event touched. There is no handover: a share of a NIC is not reshaped under a
claim, only the request policy of new claims changes, and a NIC that leaves a policy is
withdrawn (claims allocated on it keep their allocation).

Pure parts (``policy_statuses``) take values and return values; ``NicPublisher`` holds the I/O.
Not for: building devices (``tessera.dra.nics``) or anything of GPUs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from tessera import API_GROUP, API_VERSION
from tessera.dra.nics import NIC_DRIVER, NodeNics, choose_shared_nics, nic_slice
from tessera.dra.slices import MANAGED_BY, MANAGED_BY_LABEL, NodeRef
from tessera.kube.fence import NotLeading
from tessera.kube.http import ApiError, resource_path
from tessera.kube.objects import LAYOUTS, NODES, SLICES, Api
from tessera.kube.watch import ListWatch
from tessera.models.conditions import Condition, set_condition
from tessera.models.network import NetworkSharingPolicy
from tessera.models.nics import NicStatus
from tessera.tasks import cancel

log = structlog.get_logger("tessera.operator.nics")

NETWORK_POLICIES = (API_GROUP, API_VERSION, "networksharingpolicies")
_OURS = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


@dataclass(frozen=True, slots=True)
class PolicyCounts:
    nodes: int
    nics: int
    problems: tuple[str, ...]


def policy_statuses(
    policies: Mapping[str, NetworkSharingPolicy], per_node: Mapping[str, NodeNics]
) -> dict[str, PolicyCounts]:
    """Per policy: the nodes where it sells a NIC, how many NICs, and its problems (by node)."""
    out: dict[str, PolicyCounts] = {}
    for name in policies:
        nodes = nics = 0
        problems: list[str] = []
        for node, chosen in sorted(per_node.items()):
            mine = [s for s in chosen.shared if s.policy == name]
            nodes += bool(mine)
            nics += len(mine)
            problems += [f"{node}: {p.split(': ', 1)[1]}" for p in chosen.problems if p.startswith(f"{name}: ")]
        out[name] = PolicyCounts(nodes, nics, tuple(problems))
    return out


def status_body(counts: PolicyCounts, generation: int | None, previous: list[Condition]) -> dict[str, Any]:
    """The status subresource a policy gets: Ready unless a selected interface is missing or
    cannot be sold (Degraded, with every problem named by node)."""
    conditions = list(previous)
    if counts.problems:
        message = "; ".join(counts.problems)[:32000]
        conditions = set_condition(conditions, "Ready", False, "InterfaceProblem", message, generation)
        conditions = set_condition(conditions, "Degraded", True, "InterfaceProblem", message, generation)
    else:
        message = f"{counts.nics} NICs shared on {counts.nodes} nodes"
        conditions = set_condition(conditions, "Ready", True, "Published", message, generation)
        conditions = set_condition(conditions, "Degraded", False, "AsExpected", "", generation)
    return {
        "observedGeneration": generation,
        "conditions": [c.to_kube() for c in sorted(conditions, key=lambda c: c.type)],
        "nodes": counts.nodes,
        "nics": counts.nics,
        "missing": list(counts.problems[:50]),
    }


@dataclass
class _Node:
    ref: NodeRef
    labels: dict[str, str]


class NicPublisher:
    """Keeps every node's NIC slice and every NetworkSharingPolicy's status current."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.policies: dict[str, NetworkSharingPolicy] = {}
        self._generations: dict[str, int | None] = {}
        self._conditions: dict[str, list[Condition]] = {}
        self.nodes: dict[str, _Node] = {}
        self.nics: dict[str, list[NicStatus]] = {}
        self._slices: dict[str, dict[str, Any]] = {}  # node -> our slice as last read or written
        self._reported: dict[str, dict[str, Any]] = {}  # policy -> status as last written
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._watches: list[ListWatch] = []
        self._worker: asyncio.Task[None] | None = None

    # -- events (the watches call these) ----------------------------------------------------

    def policy_seen(self, kind: str, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        if kind == "DELETED":
            self.policies.pop(name, None)
            self._reported.pop(name, None)
        else:
            try:
                self.policies[name] = NetworkSharingPolicy.from_kube(
                    {"metadata": {"name": name}, "spec": body.get("spec", {})}
                )
            except ValidationError as error:  # admission keeps these out; an older schema might not
                log.warning("NetworkSharingPolicy not understood; ignored", policy=name, error=str(error))
                self.policies.pop(name, None)
                return
            self._generations[name] = body["metadata"].get("generation")
            self._conditions[name] = [
                Condition.from_kube(c) for c in (body.get("status") or {}).get("conditions", [])
            ]
        self._mark(*self.nodes)

    def node_seen(self, kind: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        name = str(meta["name"])
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.nics.pop(name, None)
            self._slices.pop(name, None)  # owned by the node: the garbage collector takes it
            self._mark()
            return
        node = _Node(NodeRef(name, str(meta.get("uid", ""))), dict(meta.get("labels") or {}))
        if self.nodes.get(name) != node:
            self.nodes[name] = node
            self._mark(name)

    def layout_seen(self, kind: str, body: dict[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        raw = [] if kind == "DELETED" else (body.get("status") or {}).get("nics", [])
        try:
            nics = [NicStatus.from_kube(n) for n in raw]
        except ValidationError as error:
            log.warning("NodeLayout NICs not understood; ignored", node=name, error=str(error))
            return
        if self.nics.get(name, []) != nics:
            self.nics[name] = nics
            self._mark(name)

    def slice_seen(self, kind: str, body: dict[str, Any]) -> None:
        spec = body.get("spec") or {}
        if spec.get("driver") != NIC_DRIVER:
            return
        node = str(spec.get("nodeName", ""))
        if kind == "DELETED":
            if self._slices.get(node, {}).get("metadata", {}).get("name") == body["metadata"]["name"]:
                self._slices.pop(node, None)
                self._mark(node)
        else:
            self._slices[node] = body

    def _mark(self, *nodes: str) -> None:
        self._dirty.update(nodes)
        self._wake.set()

    # -- running ----------------------------------------------------------------------------

    async def start(self, watch_nodes: bool = True) -> None:
        """Watch and publish. ``watch_nodes=False``: Nodes and NodeLayouts come from another
        room's watches (the GPU room's ``Controller.share_watches``, its start's lists already
        handed on), not from watches of this room's own."""
        client = self.api.client
        self._watches = [
            # Only the NIC driver's slices: the GPU room's (large, and many) are not decoded here too.
            ListWatch(client, *SLICES, self.slice_seen, label_selector=_OURS,
                      field_selector=f"spec.driver={NIC_DRIVER}"),
            ListWatch(client, *NETWORK_POLICIES, self.policy_seen),
        ]
        if watch_nodes:
            self._watches += [
                ListWatch(client, *NODES, self.node_seen, page_size=100),  # pages of 100, as the GPU room's:
                ListWatch(client, *LAYOUTS, self.layout_seen, page_size=100),  # large objects, a small start peak
            ]
        for watch in self._watches:
            watch.start()
            await watch.listed.wait()
        self._mark(*self.nodes, *self._slices)
        self._worker = asyncio.create_task(self._run(), name="nic-publisher")

    async def stop(self) -> None:
        await cancel(self._worker)
        for watch in self._watches:
            await watch.stop()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            try:
                for node in sorted(dirty):
                    await self._publish(node)
                await self._report()
            except NotLeading:  # a standby replica: the leader publishes; the same nodes again after a pause
                self._dirty |= dirty
                await asyncio.sleep(2)
                self._wake.set()
            except Exception as error:  # an apiserver away, a conflict: the same nodes again after a pause
                log.warning("NIC publishing failed; trying again", error=str(error), kind=type(error).__name__)
                self._dirty |= dirty
                await asyncio.sleep(2)
                self._wake.set()

    def _chosen(self, node: str) -> NodeNics:
        known = self.nodes.get(node)
        if known is None:
            return NodeNics((), ())
        return choose_shared_nics(self.policies.values(), known.labels, self.nics.get(node, []))

    async def _publish(self, node: str) -> None:
        known = self.nodes.get(node)
        existing = self._slices.get(node)
        chosen = self._chosen(node)
        if known is None or not chosen.shared:
            if existing is not None:
                await self.api.delete_slice(existing["metadata"]["name"], existing["metadata"].get("uid"))
                self._slices.pop(node, None)
            return
        built = nic_slice(known.ref, chosen.shared)
        if existing is not None and _same(existing, built):
            return
        if existing is None:
            written = await self.api.create_slice(built)
        else:
            built["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            written = await self.api.replace_slice(built)
        self._slices[node] = written
        log.info("published NICs", node=node, devices=len(built["spec"]["devices"]))

    async def _report(self) -> None:
        per_node = {node: self._chosen(node) for node in self.nodes}
        for name, counts in policy_statuses(self.policies, per_node).items():
            body = status_body(counts, self._generations.get(name), self._conditions.get(name, []))
            if self._reported.get(name) == body:
                continue
            path = resource_path(*NETWORK_POLICIES, name, subresource="status")
            try:
                await self.api.client.patch(path, {"status": body})
            except ApiError as error:
                if error.status != 404:
                    raise
            self._reported[name] = body
            self._conditions[name] = [Condition.from_kube(c) for c in body["conditions"]]


def _same(stored: Mapping[str, Any], built: Mapping[str, Any]) -> bool:
    """Whether the stored slice already says what was built (its spec and owner)."""
    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    return canonical(stored.get("spec")) == canonical(built["spec"]) and canonical(
        stored["metadata"].get("ownerReferences")
    ) == canonical(built["metadata"]["ownerReferences"])
