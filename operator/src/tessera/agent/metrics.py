"""The node agent's Prometheus metrics: counters, gauges and histograms with labels, and their
text exposition exactly as prometheus_client (the pinned version) writes and labels it.

The operator uses prometheus_client itself. The agent, which runs on every GPU node, keeps to
this small subset instead: importing prometheus_client loads its HTTP and WSGI servers and
collectors too, about 1.4 MiB resident. A test holds the output byte for byte to
prometheus_client's for the same metrics. Samples are what prometheus_client writes by default:
``<name>_total`` and ``<name>_created`` for a counter, ``_bucket``/``_count``/``_sum``/``_created``
for a histogram.
Not for: OpenMetrics negotiation, exemplars, summaries, or process and platform collectors.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"  # prometheus_client's CONTENT_TYPE_LATEST
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf)

Sample = tuple[str, dict[str, str], float]  # (name, labels, value)


class MetricsRegistry:
    """The metrics of one agent, in the order they were made."""

    def __init__(self) -> None:
        self.metrics: list[_Metric[Any]] = []

    def exposition(self) -> bytes:
        """Every metric in the text format, as prometheus_client's ``generate_latest``."""
        out: list[str] = []
        for metric in self.metrics:
            shown = metric.name + ("_total" if metric.kind == "counter" else "")
            out += [f"# HELP {shown} {_escape_help(metric.help_text)}\n", f"# TYPE {shown} {metric.kind}\n"]
            created: list[str] = []
            for name, labels, value in metric.samples():
                (created if name == metric.name + "_created" else out).append(_sample_line(name, labels, value))
            if created:
                shown = metric.name + "_created"
                out += [f"# HELP {shown} {_escape_help(metric.help_text)}\n", f"# TYPE {shown} gauge\n", *created]
        return "".join(out).encode()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """One sample's value, or None (for tests and benchmarks)."""
        for metric in self.metrics:
            for sample_name, sample_labels, value in metric.samples():
                if sample_name == name and sample_labels == (labels or {}):
                    return value
        return None


class _Series:
    """The value(s) of one metric for one set of label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the health thread counts events beside the event loop
        self.created = time.time()

    def samples(self) -> list[Sample]:
        raise NotImplementedError


S = TypeVar("S", bound=_Series)


class _Metric(Generic[S]):
    """One metric: a series per set of label values (one series when it has no labels)."""

    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = (), *,
                 registry: MetricsRegistry) -> None:
        self.name, self.help_text, self.labelnames = name, help_text, tuple(labelnames)
        self._children: dict[tuple[str, ...], S] = {}
        self._lock = threading.Lock()
        self._unlabelled = None if self.labelnames else self._new()
        registry.metrics.append(self)

    def _new(self) -> S:
        raise NotImplementedError

    def labels(self, *values: str) -> S:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, not {values}")
        key = tuple(str(v) for v in values)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new()
            return child

    def clear(self) -> None:
        with self._lock:
            self._children.clear()

    def _only(self) -> S:
        if self._unlabelled is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}: call labels() first")
        return self._unlabelled

    def samples(self) -> Iterator[Sample]:
        if self._unlabelled is not None:
            series: list[tuple[dict[str, str], S]] = [({}, self._unlabelled)]
        else:
            with self._lock:
                series = [(dict(zip(self.labelnames, key, strict=True)), s) for key, s in self._children.items()]
        for labels, one in series:
            for suffix, extra, value in one.samples():
                yield self.name + suffix, {**labels, **extra}, value


class CounterSeries(_Series):
    def __init__(self) -> None:
        super().__init__()
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            self.value += amount

    def samples(self) -> list[Sample]:
        return [("_total", {}, self.value), ("_created", {}, self.created)]


class GaugeSeries(_Series):
    def __init__(self) -> None:
        super().__init__()
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = float(value)

    def samples(self) -> list[Sample]:
        return [("", {}, self.value)]


class HistogramSeries(_Series):
    def __init__(self, bounds: Sequence[float]) -> None:
        super().__init__()
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        with self._lock:
            self.sum += value
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    self.counts[i] += 1
                    break

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        total = 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            total += count
            out.append(("_bucket", {"le": _go_float(bound)}, total))
        return [*out, ("_count", {}, total), ("_sum", {}, self.sum), ("_created", {}, self.created)]


class Counter(_Metric[CounterSeries]):
    kind = "counter"

    def _new(self) -> CounterSeries:
        return CounterSeries()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)


class Gauge(_Metric[GaugeSeries]):
    kind = "gauge"

    def _new(self) -> GaugeSeries:
        return GaugeSeries()

    def set(self, value: float) -> None:
        self._only().set(value)


class Histogram(_Metric[HistogramSeries]):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = (), *, registry: MetricsRegistry,
                 buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        self.bounds = tuple(sorted(float(b) for b in buckets))
        if self.bounds[-1] != math.inf:
            self.bounds += (math.inf,)
        super().__init__(name, help_text, labelnames, registry=registry)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self.bounds)

    def observe(self, value: float) -> None:
        self._only().observe(value)


def _go_float(value: float) -> str:
    """A float as Prometheus (Go) writes it: ``+Inf``, ``NaN``, exponents from 1e7 up (as prometheus_client)."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _sample_line(name: str, labels: dict[str, str], value: float) -> str:
    if not labels:
        return f"{name} {_go_float(value)}\n"
    escaped = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{escaped}}} {_go_float(value)}\n"
