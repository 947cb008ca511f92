"""The kubelet's device-health stream (``v1alpha1.DRAResourceHealth/NodeWatchResources``),
served from the agent's ``HealthTracker``.

The kubelet opens one stream per plugin and shows what it hears in
``pod.status.containerStatuses[].allocatedResourcesStatus``. It marks a device ``Unknown`` when
it has heard nothing about it for 30 s, so the stream sends every device of the node on
connect, again at once on every change (a GPU goes unhealthy or lost, or recovers; a new
layout publishes other devices), and again every ``refresh_s`` seconds in between. Every
published device of a GPU has that GPU's health. ``health_response`` is the pure part.
Not for: deciding health (``tessera.agent.health``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

from tessera.agent.health import GpuHealth, HealthTracker
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2 as pb
from tessera.models.layout import Health

HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
MAX_MESSAGE = 1024  # what the kubelet keeps


def health_response(gpus: Sequence[GpuHealth], pool: str, now: int, timeout_s: int) -> pb.NodeWatchResourcesResponse:
    """One message: every published device of every GPU, with its GPU's health."""
    response = pb.NodeWatchResourcesResponse()
    for gpu in gpus:
        healthy = gpu.health is Health.HEALTHY
        message = "" if healthy else f"GPU {gpu.index} ({gpu.uuid}) is {gpu.health.value}: {gpu.message}"
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        for name in gpu.devices:
            response.devices.add(
                device=pb.DeviceIdentifier(pool_name=pool, device_name=name),
                health=pb.HEALTHY if healthy else pb.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=timeout_s,
                message=message,
            )
    return response


async def watch_resources(
    tracker: HealthTracker, pool: str, refresh_s: float, stopping: asyncio.Event
) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
    """The stream: now, on every change, and every ``refresh_s``; ends when ``stopping`` is set."""
    changed = tracker.subscribe()
    timeout_s = max(1, int(3 * refresh_s))  # three refreshes may be lost before the kubelet doubts us
    try:
        while not stopping.is_set():
            changed.clear()
            yield health_response(tracker.snapshot(), pool, int(time.time()), timeout_s)
            waits = {asyncio.ensure_future(changed.wait()), asyncio.ensure_future(stopping.wait())}
            try:
                await asyncio.wait(waits, timeout=refresh_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await w
    finally:
        tracker.unsubscribe(changed)
