"""GPU health as the agent knows it, and how a GPU gets healthy again.

Backends report two things: events (a fatal XID, a double-bit ECC error, GPU lost, a GPU reset)
and, at every inventory, what a probe can tell right now (a lost GPU does not answer). The
``HealthTracker`` turns them into one health per GPU:

- a fatal XID or ECC error marks the GPU ``Unhealthy``; an application XID (13, 31, 43, 45,
  68, 109) does not;
- ``Lost`` while the probe says the GPU does not answer (and after a GPU_LOST event);
- cleared when the GPU is healthy again: a lost GPU as soon as it answers again (after a reset
  or a reboot); an unhealthy one when the driver reports a reset of it and the probe passes,
  or after ``recovery_seconds`` without a new fatal event (``--health-recovery-seconds``;
  0 or None: only a reset clears it). A restarted agent starts from the health it last
  reported (``seed``), so a restart alone clears nothing.

It also keeps, per GPU, the names of the devices published for it (from the status the agent
wrote), so the kubelet plugin's health stream (``NodeWatchResources``) can report every
device (``device_health``); subscribers are woken on every change. Thread-safe: events arrive
on the health thread.

What a health stream needs of any device family is ``HealthSource``: the devices' health now
(``DeviceHealth``) and ``ChangeListeners`` to wake it; the NIC family's link health
(``tessera.agent.nics.health``) is the other source, served by the same stream code
(``tessera.agent.plugin.health``).
Not for: reading GPUs (the backends), or writing status (``tessera.agent.status``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from tessera.agent.backends.base import HealthEvent, HealthEventKind, Inventory
from tessera.dra.devices import build_gpu_devices
from tessera.models.layout import Health, NodeLayoutStatus


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One published device's health, as a health stream reports it."""

    device: str
    healthy: bool
    message: str = ""  # why it is not healthy


class ChangeListeners:
    """asyncio Events to set whenever something changes; ``notify`` may be called from any
    thread, and sets each event on the loop that subscribed it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def subscribe(self) -> asyncio.Event:
        """An event set on every change; call from the loop that waits on it."""
        event = asyncio.Event()
        with self._lock:
            self._listeners.append((asyncio.get_running_loop(), event))
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        with self._lock:
            self._listeners = [(loop, e) for loop, e in self._listeners if e is not event]

    def notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for loop, event in listeners:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)


class HealthSource(Protocol):
    """What a health stream reads: every device's health now, and a wake-up on each change."""

    def device_health(self) -> list[DeviceHealth]: ...

    def subscribe(self) -> asyncio.Event: ...

    def unsubscribe(self, event: asyncio.Event) -> None: ...


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health and the devices published for it."""

    uuid: str
    index: int
    health: Health
    message: str
    since: float  # unix seconds of the last change
    devices: tuple[str, ...]  # published device names


@dataclass(slots=True)
class _Mark:
    health: Health
    message: str
    since: float
    last_event: float
    reset_seen: bool = False


class HealthTracker:
    """Per-GPU health from events and probes, with recovery; see the module docstring."""

    def __init__(self, recovery_seconds: float | None = 600.0, clock: Callable[[], float] = time.time) -> None:
        self.recovery_seconds = recovery_seconds if recovery_seconds and recovery_seconds > 0 else None
        self._clock = clock
        self._lock = threading.Lock()
        self._marks: dict[str, _Mark] = {}
        self._gpus: dict[str, GpuHealth] = {}
        self._seeded = False
        self._listeners = ChangeListeners()
        self.recoveries = 0  # GPUs cleared since start (metrics)

    # -- input --

    def seed(self, previous: NodeLayoutStatus | None) -> None:
        """Start from the health the agent last reported (once; later calls do nothing)."""
        with self._lock:
            if self._seeded:
                return
            self._seeded = True
            now = self._clock()
            for g in previous.gpus if previous is not None else []:
                if g.health is not Health.HEALTHY and g.uuid not in self._marks:
                    self._marks[g.uuid] = _Mark(g.health, g.health_message or g.health.value, now, now)

    def record_events(self, events: Iterable[HealthEvent]) -> bool:
        """Apply events; True when some GPU's health changed."""
        changed = False
        with self._lock:
            now = self._clock()
            for e in events:
                mark = self._marks.get(e.gpu_uuid)
                if e.kind is HealthEventKind.GPU_RESET:
                    if mark is not None:
                        mark.reset_seen = True  # cleared at the next probe that passes
                    continue
                if not e.fatal:
                    continue
                if e.kind is HealthEventKind.GPU_LOST:
                    health, message = Health.LOST, e.message or "GPU has fallen off the bus (GPU_IS_LOST)"
                else:
                    if mark is not None and mark.health is Health.LOST:
                        mark.last_event = now
                        continue
                    health, message = Health.UNHEALTHY, f"fatal {e.message or e.kind.value}; drain the GPU and reset it"
                if mark is None or mark.health is not health or mark.message != message:
                    changed = True
                    self._marks[e.gpu_uuid] = _Mark(health, message, now, now)
                else:
                    mark.last_event = now
                    mark.reset_seen = False
                if e.gpu_uuid in self._gpus:
                    self._gpus[e.gpu_uuid] = replace(self._gpus[e.gpu_uuid], health=health, message=message, since=now)
        if changed:
            self._notify()
        return changed

    def observe(self, inventory: Inventory) -> Inventory:
        """Apply the probe: mark lost GPUs, clear the ones that are healthy again. Returns the
        inventory with each GPU's health as tracked (what the status reports)."""
        with self._lock:
            now = self._clock()
            gpus = []
            for g in inventory.gpus:
                mark = self._marks.get(g.uuid)
                if g.health is not Health.HEALTHY:  # the probe itself says lost (or unhealthy)
                    if mark is None or mark.health is not g.health:
                        self._marks[g.uuid] = _Mark(g.health, g.health_message, now, now)
                elif mark is not None and self._recovered(mark, now):
                    del self._marks[g.uuid]
                    self.recoveries += 1
                mark = self._marks.get(g.uuid)
                gpus.append(g if mark is None else replace(g, health=mark.health, health_message=mark.message))
            return replace(inventory, gpus=tuple(gpus))

    def _recovered(self, mark: _Mark, now: float) -> bool:
        """The probe passed; is that enough to clear ``mark``?"""
        if mark.health is Health.LOST or mark.reset_seen:
            return True  # it answers again / it was reset: the probe is the truth
        return self.recovery_seconds is not None and now - mark.last_event >= self.recovery_seconds

    def publish(self, status: NodeLayoutStatus) -> None:
        """The status just written: each GPU's health and published device names."""
        gpus: dict[str, GpuHealth] = {}
        for g in status.gpus:
            names = tuple(sorted(str(d["name"]) for d in build_gpu_devices(g).devices))
            gpus[g.uuid] = GpuHealth(g.uuid, g.index, g.health, g.health_message, 0.0, names)
        with self._lock:
            changed = False
            for uuid, new in gpus.items():
                old = self._gpus.get(uuid)
                key = (new.health, new.message, new.devices)
                same = old is not None and (old.health, old.message, old.devices) == key
                gpus[uuid] = replace(new, since=old.since if same and old is not None else self._clock())
                changed = changed or not same
            changed = changed or set(gpus) != set(self._gpus)
            self._gpus = gpus
        if changed:
            self._notify()

    # -- output --

    def snapshot(self) -> list[GpuHealth]:
        """Every GPU, by index, with the health tracked now."""
        with self._lock:
            return sorted(self._gpus.values(), key=lambda g: g.index)

    def marked(self) -> dict[str, Health]:
        """GPU UUID -> health, for the GPUs not healthy now."""
        with self._lock:
            return {uuid: m.health for uuid, m in self._marks.items()}

    def device_health(self) -> list[DeviceHealth]:
        """Every published device of every GPU, with its GPU's health (``HealthSource``)."""
        out: list[DeviceHealth] = []
        for gpu in self.snapshot():
            healthy = gpu.health is Health.HEALTHY
            message = "" if healthy else f"GPU {gpu.index} ({gpu.uuid}) is {gpu.health.value}: {gpu.message}"
            out.extend(DeviceHealth(name, healthy, message) for name in gpu.devices)
        return out

    def subscribe(self) -> asyncio.Event:
        """An event set on every change; call from the loop that waits on it."""
        return self._listeners.subscribe()

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._listeners.unsubscribe(event)

    def _notify(self) -> None:
        self._listeners.notify()
