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
from tessera.models.layout import NodeLayoutStatus
from tessera.models.policy import Strategy


@dataclass(frozen=True)
class FleetFigures:
    gpus_by_strategy: dict[str, int]  # strategy the agent reports applied → GPUs
    devices_published: int
    devices_allocated: int

    @property
    def devices_free(self) -> int:
        return max(self.devices_published - self.devices_allocated, 0)


# node -> (the NodeLayout status counted, its GPUs per strategy): what the last figures counted.
StrategyMemo = dict[str, tuple[NodeLayoutStatus, tuple[tuple[Strategy, int], ...]]]


def fleet_figures(fleet: Fleet, decisions: Iterable[NodeDecision], memo: StrategyMemo | None = None) -> FleetFigures:
    """GPUs per strategy over every node's reported status; devices published by the latest
    decision of each node, and how many of those a claim holds. With ``memo`` (kept by the
    caller from one call to the next) a node's GPUs are counted again only when its status
    is a new one: every status pass of a large fleet counted every GPU (4% of the operator's
    CPU in a rollout over 1,000 nodes)."""
    strategies: Counter[Strategy] = Counter()
    seen: StrategyMemo = {}
    for node, view in fleet.nodes.items():
        status = view.layout.status if view.layout is not None else None
        if status is None:
            continue
        kept = memo.get(node) if memo is not None else None
        if kept is not None and kept[0] is status:
            counts = kept[1]
        else:
            counts = tuple(Counter(gpu.strategy for gpu in status.gpus).items())
        seen[node] = (status, counts)
        for strategy, count in counts:
            strategies[strategy] += count
    if memo is not None:
        memo.clear()
        memo.update(seen)
    gpus = {strategy.value: count for strategy, count in strategies.items()}
    decided = list(decisions)
    published = sum(sum(d.device_counts.values()) for d in decided)
    held = sum(fleet.devices_held(node) for node in {d.node for d in decided})
    return FleetFigures(dict(sorted(gpus.items())), published, min(held, published))
