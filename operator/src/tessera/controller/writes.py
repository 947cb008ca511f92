"""The one door every operator write goes through: counted per kind, and shut by a gate.

Every API write the operator makes (NodeLayout spec, ResourceSlices, evictions, Events,
SharingPolicy status) is handed here as ``(what, call)``. The gate is the seam for leader
election: with two replicas, the one that does not hold (or cannot renew) the Lease must
stop writing before anything else, and it does so by shutting this gate — the write is
refused with :class:`NotLeading` and never sent, so the reconcile fails and is tried again
later, while reads and the warm caches go on. With one replica the gate stays open. The gate
is the early check; the client's write fence (``tessera.kube.fence``, checked where a request
meets the wire) is the one that holds even for a process frozen between the two.
Not for: what to write (the Controller's rooms) or retrying (``workqueue``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from tessera.kube.fence import NotLeading

API_WRITES = Counter("tessera_operator_api_writes_total", "API writes the operator made", ["what"])
REFUSED_WRITES = Counter("tessera_operator_writes_refused_total", "Writes the gate refused (not leading)", ["what"])


__all__ = ["API_WRITES", "REFUSED_WRITES", "ApiWrites", "NotLeading", "always_open"]


def always_open() -> bool:
    return True


class ApiWrites:
    """Sends writes while ``gate()`` says so; refuses them otherwise."""

    def __init__(self, gate: Callable[[], bool] = always_open) -> None:
        self.gate = gate

    async def __call__(self, what: str, call: Awaitable[Any]) -> Any:
        if not self.gate():
            if inspect.iscoroutine(call):
                call.close()  # never started: nothing reaches the apiserver
            REFUSED_WRITES.labels(what).inc()
            raise NotLeading(f"not leading: {what} not written")
        API_WRITES.labels(what).inc()
        return await call
