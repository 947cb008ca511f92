"""Link events from the kernel: an uplink that goes down, comes back or disappears is known at
once, not at the agent's next pass.

``LinkWatcher`` is a thread with an rtnetlink socket bound to the link multicast group
(``RTMGRP_LINK``) of one network namespace (the host's on a node; a named one in tests). Every
``RTM_NEWLINK`` says an interface's operational state and every ``RTM_DELLINK`` that it is gone;
each becomes a call ``on_link(interface, LinkState)`` (the same reading of ``operstate`` as
sysfs: ``tessera.agent.nics.sysfs.link_state``). The agent turns a change of a shared NIC into
an at-once pass (the status, then the operator's taint) and into the NIC plugin's health stream.
The per-pass sysfs read stays the backstop: events can be lost when the socket's buffer
overflows (ENOBUFS), and then ``on_overflow`` asks for a full read and the socket is opened
again. The thread blocks in ``select`` on the socket and a pipe that ``stop`` writes to.
Not for: deciding what a link state means for a device (``tessera.agent.nics.health``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
from collections.abc import Callable
from typing import Any

import structlog
from pyroute2 import IPRSocket
from pyroute2.netlink.rtnl import RTMGRP_LINK

from tessera.agent.nics.sysfs import link_state
from tessera.models.nics import LinkState

log = structlog.get_logger("tessera.agent.nics")

OnLink = Callable[[str, LinkState], None]


def link_event(message: Any) -> tuple[str, LinkState] | None:
    """(interface, state) of one rtnetlink message, or None when it is not about a link."""
    get = getattr(message, "get", None)
    if get is None:
        return None
    event, name = get("event"), get("ifname")
    if not isinstance(name, str):
        return None
    if event == "RTM_DELLINK":
        return name, LinkState.ABSENT
    if event == "RTM_NEWLINK":
        operstate = get("IFLA_OPERSTATE")
        return name, link_state(str(operstate).lower() if operstate is not None else "unknown")
    return None


class LinkWatcher:
    """Calls ``on_link`` for every link event of the namespace; ``start`` returns once subscribed."""

    def __init__(
        self, on_link: OnLink, netns: str | None = None, on_overflow: Callable[[], None] | None = None
    ) -> None:
        self._on_link = on_link
        self._on_overflow = on_overflow
        self._netns = netns
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self.error: BaseException | None = None  # why the thread ended early, if it did

    def start(self, timeout: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name="nic-link-events", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) and self.error is None:
            raise TimeoutError("the link event socket did not open")
        if self.error is not None:
            raise RuntimeError(f"cannot watch link events: {self.error}") from self.error

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5.0)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _open(self) -> IPRSocket:
        if self._netns and not os.path.exists(f"/run/netns/{self._netns}"):
            # Said here: pyroute2 would make a missing namespace by default, or hang on one it cannot open.
            raise FileNotFoundError(f"no network namespace {self._netns!r}")
        # flags 0: open the named namespace, never make it
        sock = IPRSocket(netns=self._netns, flags=0) if self._netns else IPRSocket()
        sock.bind(groups=RTMGRP_LINK)
        return sock

    def _run(self) -> None:
        try:
            sock = self._open()
        except Exception as error:  # reported by start()
            self.error = error
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stopping:
                readable, _, _ = select.select([sock, self._wake_r], [], [])
                if self._wake_r in readable:
                    return
                try:
                    messages = sock.get()
                except OSError as error:
                    if error.errno != errno.ENOBUFS:
                        raise
                    log.warning("link events were lost (the socket's buffer overflowed); reading every link")
                    sock.close()
                    sock = self._open()
                    if self._on_overflow is not None:
                        self._on_overflow()
                    continue
                for message in messages:
                    seen = link_event(message)
                    if seen is not None:
                        self._on_link(*seen)
        except Exception as error:
            self.error = error
            log.error("link events stopped; link changes are seen at the agent's passes only", error=str(error))
        finally:
            sock.close()
