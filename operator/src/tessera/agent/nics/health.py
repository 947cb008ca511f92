"""The NICs' health as the NIC plugin's health stream reports it: a NIC is healthy while its
link is up.

Two inputs keep it: every agent pass's inventory (``observe``: sysfs, the backstop, and where
the set of NICs comes from) and the kernel's link events between passes (``link_changed``, from
``tessera.agent.nics.linkwatch``), so a link that goes down is reported at once and the agent
can run a pass for it (the status, then the operator's ``nic.tessera.dev/link`` taint) without
waiting for its resync. Thread-safe: events arrive on the link-event thread.
Not for: the taint itself (``tessera.dra.nics``), or the stream (``tessera.agent.plugin.health``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

from tessera.agent.health import ChangeListeners, DeviceHealth
from tessera.dra.nics import nic_device_name
from tessera.models.nics import LinkState, NicStatus


class NicHealth:
    """Each known NIC's link state, as device health (``tessera.agent.health.HealthSource``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[str, LinkState] = {}
        self._listeners = ChangeListeners()

    def observe(self, nics: Sequence[NicStatus]) -> None:
        """The pass's inventory: these NICs, in these states (the set of NICs follows it)."""
        links = {n.interface: n.link for n in nics}
        with self._lock:
            changed = links != self._links
            self._links = links
        if changed:
            self._listeners.notify()

    def observing(self, inventory: Callable[[], Sequence[NicStatus]]) -> Callable[[], Sequence[NicStatus]]:
        """``inventory``, each answer also observed here."""

        def read() -> Sequence[NicStatus]:
            nics = inventory()
            self.observe(nics)
            return nics

        return read

    def link_changed(self, interface: str, state: LinkState) -> bool:
        """A link event; True when it changed a known NIC's state (an interface that is not a
        NIC this agent reports is none of its business)."""
        with self._lock:
            if self._links.get(interface, state) is state:
                return False
            self._links[interface] = state
        self._listeners.notify()
        return True

    def links(self) -> dict[str, LinkState]:
        with self._lock:
            return dict(self._links)

    def device_health(self) -> list[DeviceHealth]:
        """One device per NIC (``nic-<interface>``), healthy while its link is up."""
        return [
            DeviceHealth(nic_device_name(interface), state is LinkState.UP,
                         "" if state is LinkState.UP else f"the link of {interface} is {state.value}")
            for interface, state in sorted(self.links().items())
        ]  # fmt: skip

    def subscribe(self) -> asyncio.Event:
        return self._listeners.subscribe()

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._listeners.unsubscribe(event)
