"""Fleet-wide figures the operator exports for dashboards (the chart's Grafana dashboard): GPUs
per sharing strategy, and the published devices allocated to claims and free.

Pure: the operator's ``Fleet`` view and its latest decisions in, counts out. A device shared by
several claims counts once as allocated; DynamicMIG placements count as published devices.
Not for: exporting them (``tessera.controller.runtime`` sets the gauges after each status pass).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.controller.decide import NodeDecision
from tessera.controller.state import Fleet
from tessera.models.policy import Strategy


@dataclass(frozen=True)
class FleetFigures:
    gpus_by_strategy: dict[str, int]  # strategy the agent reports applied → GPUs
    devices_published: int
    devices_allocated: int

    @property
    def devices_free(self) -> int:
        return max(self.devices_published - self.devices_allocated, 0)


def fleet_figures(fleet: Fleet, decisions: Iterable[NodeDecision]) -> FleetFigures:
    """GPUs per strategy over every node's reported status; devices published by the latest
    decision of each node, and how many of those a claim holds."""
    strategies: Counter[Strategy] = Counter()
    for view in fleet.nodes.values():
        status = view.layout.status if view.layout is not None else None
        if status is not None:
            strategies.update(gpu.strategy for gpu in status.gpus)
    gpus = {strategy.value: count for strategy, count in strategies.items()}
    decided = list(decisions)
    published = sum(sum(d.device_counts.values()) for d in decided)
    held = sum(fleet.devices_held(node) for node in {d.node for d in decided})
    return FleetFigures(dict(sorted(gpus.items())), published, min(held, published))
