"""Every SharingPolicy's status, written in debounced passes over the whole fleet.

A pass waits until every node known at start has been reconciled once (a half-swept fleet
would count half the GPUs and write that), then runs whenever something marks the statuses
dirty, after letting a burst of reconciles land: at least 0.2 s, and ten times what the last
pass spent computing, so statuses take at most a tenth of the time. Only a status that
differs is written, with an Event for each condition that changed. The policies' epoch goes
up whenever what a policy asks for changes; a node decided in an older epoch does not count
as applied. After each pass it exports what the chart's alerts and dashboard read: the Degraded
policies (``tessera_operator_policy_degraded``), GPUs per strategy and devices allocated and free
(``fleetmetrics``); the pending claims' gauge is read from the fleet whenever it is scraped.
With a ``gate`` (the Controller's ``leading``), a pass runs only while it is set, each time
after the sweep of the current term; a pass the write fence refuses is due again next term.
Not for: computing a status (``policystatus``, pure) or the decisions it counts (``decide``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from tessera.controller.decide import NodeDecision
from tessera.controller.fleetmetrics import StrategyMemo, fleet_figures
from tessera.controller.policystatus import TallyMemo, policy_status, tally, transitions
from tessera.controller.state import Fleet
from tessera.kube.fence import NotLeading
from tessera.kube.http import ApiError
from tessera.models.policy import SharingPolicy, SharingPolicyStatus

log = structlog.get_logger("tessera.operator")

STATUS_PASSES = Counter("tessera_operator_policy_status_passes", "Passes over every SharingPolicy status")
DEGRADED = Gauge(
    "tessera_operator_policy_degraded", "SharingPolicies whose Degraded condition is True, by reason",
    ["policy", "reason"],
)
GPUS = Gauge("tessera_operator_gpus", "GPUs on Tessera's nodes, by the sharing strategy applied", ["strategy"])
DEVICES = Gauge("tessera_operator_devices", "Published devices, allocated to a claim or free", ["state"])
PENDING_CLAIMS = Gauge(
    "tessera_operator_pending_claims", "ResourceClaims on Tessera's DeviceClasses not allocated yet (read when scraped)"
)

PatchStatus = Callable[[str, dict[str, Any]], Awaitable[object]]
PostEvent = Callable[[dict[str, Any], str, str, str], Awaitable[object]]
ExtendStatus = Callable[[SharingPolicy, SharingPolicyStatus], SharingPolicyStatus]


class PolicyStatusWriter:
    """The policies' epoch, the dirty flag, and the loop that writes statuses."""

    def __init__(self, fleet: Fleet, decisions: Mapping[str, NodeDecision], patch_status: PatchStatus,
                 post_event: PostEvent, extend: ExtendStatus | None = None) -> None:
        self._fleet = fleet
        self._extend = extend  # adds what another room knows (adaptive layouts: each GPU's choice)
        self._decisions = decisions
        self._patch_status = patch_status
        self._post_event = post_event
        self.epoch = 0  # goes up whenever what a policy asks for changes
        self._dirty = asyncio.Event()
        self._pass_cost = 0.0  # seconds the last pass spent computing
        self._tallies = TallyMemo()  # each node's counts, counted again only when the node changed
        self._strategies: StrategyMemo = {}  # each node's GPUs per strategy, the same way
        PENDING_CLAIMS.set_function(lambda: len(fleet.pending_claims))  # follows every claim event

    def policies_changed(self) -> None:
        self.epoch += 1
        self.changed()

    def changed(self) -> None:
        self._dirty.set()

    async def run(self, swept: asyncio.Event, gate: asyncio.Event | None = None) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(max(0.2, 10 * self._pass_cost))
            if gate is not None:
                await gate.wait()
            await swept.wait()
            self._dirty.clear()
            try:
                await self.write_all()
                STATUS_PASSES.inc()
            except NotLeading:
                self._dirty.set()  # the next term writes it
            except Exception:  # keep the loop alive whatever one pass hit
                log.exception("writing SharingPolicy status failed; will retry")
                await asyncio.sleep(1.0)
                self._dirty.set()

    async def write_all(self) -> None:
        pending = {node: d.epoch < self.epoch for node, d in self._decisions.items()}
        decisions = list(self._decisions.values())
        self._pass_cost = 0.0
        degraded: set[tuple[str, str]] = set()
        try:
            await self._write_each(decisions, pending, degraded)
        finally:
            self._tallies.next_pass()
            started = time.perf_counter()
            self._export(decisions, degraded)
            self._pass_cost += time.perf_counter() - started

    def _export(self, decisions: list[NodeDecision], degraded: set[tuple[str, str]]) -> None:
        DEGRADED.clear()
        for policy_name, reason in sorted(degraded):
            DEGRADED.labels(policy_name, reason).set(1)
        figures = fleet_figures(self._fleet, decisions, self._strategies)
        GPUS.clear()
        for strategy, count in figures.gpus_by_strategy.items():
            GPUS.labels(strategy).set(count)
        DEVICES.labels("allocated").set(figures.devices_allocated)
        DEVICES.labels("free").set(figures.devices_free)

    async def _write_each(
        self, decisions: list[NodeDecision], pending: Mapping[str, bool], degraded: set[tuple[str, str]]
    ) -> None:
        for name, body in sorted(self._fleet.policy_bodies.items()):
            policy = self._fleet.policies.get(name)
            if policy is None:
                continue  # the CRD schema refuses what pydantic would; nothing to report on
            previous_raw = body.get("status")
            try:
                previous = SharingPolicyStatus.model_validate(previous_raw) if previous_raw else None
            except ValueError:
                previous = None
            started = time.perf_counter()
            status = policy_status(policy, tally(self._fleet, name, decisions, pending, self._tallies), previous)
            if self._extend is not None:
                status = self._extend(policy, status)
            self._pass_cost += time.perf_counter() - started
            degraded.update((name, c.reason) for c in status.conditions if c.type == "Degraded" and c.status == "True")
            if previous is not None and status == previous:
                continue
            try:
                await self._patch_status(name, status.to_kube())
            except ApiError as error:
                if error.status != 404:
                    raise
                continue  # deleted since the view last saw it (its DELETED event is on its way): nothing to report
            body["status"] = status.to_kube()
            for type_, reason, message in transitions(previous, status):
                await self._post_event(body, type_, reason, message)
