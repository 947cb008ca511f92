"""Where a kubelet call's time goes: each prepare and unprepare timed step by step (waiting for
the claim's lock, the claim from the agent's watch and the read that confirms it, or the read
alone, checks, the hardware, the CDI spec, the checkpoint; and,
after the answer, the claim's status write), as a histogram with an ``operation`` and a
``step`` label and one debug log line per call.

``StepTimes`` is one call's stopwatch: ``with times.step("cdi_write"): ...`` adds the time
spent to that step (a step run twice, such as the checkpoint of a DynamicMIG claim, adds up).
``PluginMetrics`` owns the histogram in the agent's registry (``tessera.agent.metrics``: no
prometheus_client in the agent).
Not for: deciding anything; the steps themselves live in ``prepare`` and ``statuswrites``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

from tessera.agent.metrics import Counter, Histogram, MetricsRegistry

log = structlog.get_logger("tessera.agent.plugin")

# From half a millisecond (a hold, a small file) to ten seconds (an API outage's timeout).
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StepTimes:
    """The seconds one call spent in each step, in the order the steps first ran."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.steps: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def add(self, name: str, seconds: float) -> None:
        self.steps[name] = self.steps.get(name, 0.0) + seconds

    @property
    def total(self) -> float:
        return time.perf_counter() - self.started


class PluginMetrics:
    """The kubelet plugin's metrics, in the agent's registry (or one of their own)."""

    def __init__(self, registry: MetricsRegistry | None = None) -> None:
        self.registry = registry or MetricsRegistry()
        r = self.registry
        self.steps = Histogram(
            "tessera_agent_plugin_step_seconds", "Time of each step of a kubelet prepare or unprepare call",
            ["operation", "step"], registry=r, buckets=STEP_BUCKETS,
        )
        self.status_writes = Counter(
            "tessera_agent_claim_status_writes", "Claim device status writes after the answer, by result",
            ["result"], registry=r,
        )
        self.claim_reads = Counter(
            "tessera_agent_plugin_claim_reads",
            "Fresh prepares by the copy of the claim they were built from: view (the agent's claim watch, "
            "confirmed by a read alongside), get (read first), view_stale (the watch's disagreed; redone)",
            ["source"], registry=r,
        )

    def record(self, operation: str, times: StepTimes, claim: str, outcome: str) -> None:
        """Observe one call's steps; one debug line with all of them and the total. (The whole
        call per claim is the agent's ``tessera_agent_claim_seconds``, through the plugin's
        ``observe`` hook.)"""
        total = times.total
        for step, seconds in times.steps.items():
            self.steps.labels(operation, step).observe(seconds)
        log.debug(f"{operation} steps", claim=claim, outcome=outcome, total_ms=round(total * 1000, 2),
                  steps_ms={step: round(seconds * 1000, 2) for step, seconds in times.steps.items()})
