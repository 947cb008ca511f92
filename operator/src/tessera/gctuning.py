"""The operator's cyclic garbage collector: collected less often, and its time counted.

CPython frees almost every object by reference counting; the cyclic collector exists for
reference cycles, and by default it runs a young collection every 700 net allocations of
container objects. The operator's heap is large and long-lived (the fleet view: every node's
layout as models), and a rollout replaces much of it while it parses watch events and builds
slices, so at the default it collected all the time and promoted its temporaries into the old
generation, whose full collections walk the whole heap. Measured with ``gc.callbacks`` over a
1,000-node rollout (``benchmarks/bench_operator.py --nodes 1000``): 2,790 young, 253 middle and
19 full collections took 6.3 of the operator's 18.1 CPU seconds (a full one up to 0.39 s);
with a young threshold of 20,000, 15 young and 1 middle collection took 0.7 of 15.6 s, and the
peak RSS stayed at 130 MiB. Cycles are still collected, 20,000 allocations later at most.

Once the start's lists have built the view (the most the operator allocates at once),
``freeze`` puts that heap out of the collector's walks.
``tessera_gc_seconds_total`` (by generation) keeps the collector's time in view.
Not for: the node agent, whose heap is one node's and whose collections cost little.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Counter

YOUNG_THRESHOLD = 20_000  # net container allocations between young collections (CPython's default: 700)

GC_SECONDS = Counter("tessera_gc_seconds_total", "Time spent in Python's cyclic garbage collector",
                     ["generation"])


class _Timer:
    """A ``gc.callbacks`` entry: the time of each collection, into ``GC_SECONDS``."""

    def __init__(self) -> None:
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            GC_SECONDS.labels(str(info["generation"])).inc(time.perf_counter() - self.started)


def tune(young: int = YOUNG_THRESHOLD) -> None:
    """Collect young objects every ``young`` allocations (the older generations keep their
    ratios) and count the collector's time; calling it again changes only the threshold."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
    if not any(isinstance(callback, _Timer) for callback in gc.callbacks):
        gc.callbacks.append(_Timer())


def freeze() -> None:
    """Every object alive now is left out of later collections' walks (``gc.freeze``), after a
    collection of the young and middle generations. Frozen objects are still freed by reference
    counting; only a reference cycle among them that becomes garbage is kept, which bounds what
    this can keep to the heap of the moment it is called, once."""
    gc.collect(1)
    gc.freeze()
