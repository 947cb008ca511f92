"""The kubelet's device-health stream (``v1alpha1.DRAResourceHealth/NodeWatchResources``), for
any device family: served from a ``HealthSource`` (``tessera.agent.health``), the agent's GPU
``HealthTracker`` for ``gpu.tessera.dev`` and the NICs' link health for ``nic.tessera.dev``.

The kubelet opens one stream per plugin and shows what it hears in
``pod.status.containerStatuses[].allocatedResourcesStatus``. It marks a device ``Unknown`` when
it has heard nothing about it for 30 s, so the stream sends every device of the node on
connect, again at once on every change (a GPU goes unhealthy or lost, or recovers; a link goes
down; a new layout publishes other devices), and again every ``refresh_s`` seconds in between.
``health_response`` is the pure part; ``health_service`` is the gRPC service either plugin adds
to its DRA socket.
Not for: deciding health (``tessera.agent.health``, ``tessera.agent.nics.health``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tessera.agent.health import DeviceHealth, HealthSource
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2 as pb
from tessera.agent.plugin.rpc import ServerStream, Service
from tessera.tasks import cancel

HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
MAX_MESSAGE = 1024  # what the kubelet keeps


def health_response(
    devices: Sequence[DeviceHealth], pool: str, now: int, timeout_s: int
) -> pb.NodeWatchResourcesResponse:
    """One message: every device, with its health."""
    response = pb.NodeWatchResourcesResponse()
    for device in devices:
        message = device.message
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        response.devices.add(
            device=pb.DeviceIdentifier(pool_name=pool, device_name=device.device),
            health=pb.HEALTHY if device.healthy else pb.UNHEALTHY,
            last_updated_time=now,
            health_check_timeout_seconds=timeout_s,
            message="" if device.healthy else message,
        )
    return response


async def watch_resources(
    source: HealthSource, pool: str, refresh_s: float, stopping: asyncio.Event
) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
    """The stream: now, on every change, and every ``refresh_s``; ends when ``stopping`` is set."""
    changed = source.subscribe()
    timeout_s = max(1, int(3 * refresh_s))  # three refreshes may be lost before the kubelet doubts us
    try:
        while not stopping.is_set():
            changed.clear()
            yield health_response(source.device_health(), pool, int(time.time()), timeout_s)
            waits = {asyncio.ensure_future(changed.wait()), asyncio.ensure_future(stopping.wait())}
            try:
                await asyncio.wait(waits, timeout=refresh_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel(*waits)
    finally:
        source.unsubscribe(changed)


def health_service(source: HealthSource, pool: str, refresh_s: float, stopping: asyncio.Event) -> Service:
    """The ``DRAResourceHealth`` service over ``source``'s devices of ``pool``."""

    def stream(request: Any) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
        return watch_resources(source, pool, refresh_s, stopping)

    return Service(HEALTH_SERVICE, {
        "NodeWatchResources": ServerStream(stream, pb.NodeWatchResourcesRequest, pb.NodeWatchResourcesResponse),
    })
