"""The agent's metrics write what prometheus_client writes for the same metrics, byte for byte
(the ``_created`` timestamps aside), and refuse what prometheus_client refuses."""

from __future__ import annotations

import math
import re
from typing import Any

import prometheus_client
import pytest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tessera.agent import metrics
from tessera.agent.service import AgentMetrics

CREATED = re.compile(rb"^(\S+_created(?:\{.*\})?) \S+$", re.MULTILINE)


def exercise(module: Any, registry: Any) -> None:
    """The same metrics and calls, on either implementation."""
    passes = module.Counter("passes", "Passes, by result", ["result"], registry=registry)
    passes.labels("ok").inc()
    passes.labels("ok").inc(2)
    passes.labels('a "quoted"\\ \n value').inc(0.5)
    module.Counter("untouched_by_label", "No label values yet", ["kind"], registry=registry)
    writes = module.Counter("writes", "Writes with a\nnewline and a \\ in the help", registry=registry)
    writes.inc(12345678)
    seconds = module.Histogram("pass_seconds", "Time of one pass", registry=registry)
    for value in (0.001, 0.005, 0.3, 7.0, 11.0, 1e9):
        seconds.observe(value)
    sizes = module.Histogram("sizes", "Sizes, by kind", ["kind"], registry=registry, buckets=[1, 10, 100])
    sizes.labels("mig").observe(5)
    gpus = module.Gauge("gpus", "GPUs, by health", ["health"], registry=registry)
    gpus.labels("Healthy").set(2)
    gpus.labels("Lost").set(1)
    blocked = module.Gauge("blocked", "Blocked, by reason", ["reason"], registry=registry)
    blocked.labels("gone").set(3)
    blocked.clear()
    blocked.labels("kept").set(1)
    extremes = module.Gauge("extremes", "Infinities and large numbers", ["which"], registry=registry)
    for which, value in (("inf", math.inf), ("-inf", -math.inf), ("nan", math.nan), ("big", 1.5e22),
                         ("tiny", 1e-7), ("negative", -12345678.0), ("time", 1767225600.123)):
        extremes.labels(which).set(value)


def test_the_exposition_is_prometheus_clients_byte_for_byte() -> None:
    ours = metrics.MetricsRegistry()
    theirs = prometheus_client.CollectorRegistry()
    exercise(metrics, ours)
    exercise(prometheus_client, theirs)
    expected = prometheus_client.generate_latest(theirs)
    assert CREATED.sub(rb"\1 T", ours.exposition()) == CREATED.sub(rb"\1 T", expected)
    assert metrics.CONTENT_TYPE == CONTENT_TYPE_LATEST


def test_the_agents_own_metrics_are_written_as_prometheus_client_would() -> None:
    agent = AgentMetrics()
    agent.passes.labels("ok").inc()
    agent.gpus.labels("Healthy").set(2)
    agent.pass_seconds.observe(0.2)
    text = agent.registry.exposition().decode()
    assert 'tessera_agent_reconcile_passes_total{result="ok"} 1.0\n' in text
    assert "# TYPE tessera_agent_reconcile_passes_created gauge\n" in text
    assert 'tessera_agent_reconcile_seconds_bucket{le="0.25"} 1.0\n' in text
    assert agent.registry.get_sample_value("tessera_agent_gpus", {"health": "Healthy"}) == 2.0
    assert agent.registry.get_sample_value("tessera_agent_status_writes_total") == 0.0
    assert agent.registry.get_sample_value("tessera_agent_gpus", {"health": "Lost"}) is None


def test_misuse_is_refused() -> None:
    registry = metrics.MetricsRegistry()
    counter = metrics.Counter("c", "A counter", ["kind"], registry=registry)
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("x", "y")
    with pytest.raises(ValueError, match="call labels"):
        counter.inc()
