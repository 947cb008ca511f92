"""The write fence: a deadline on a monotonic clock after which a client must not write.

A replica that leads through a Lease may write only while its lease cannot have been taken by
another. The elector (``tessera.kube.lease``) opens the fence after each successful acquire or
renew, until the moment the request was sent plus the renew deadline (10 s by default, five
seconds inside the 15 s a standby waits after it last saw the lease change). The client
(``tessera.kube.http``) checks the fence as late as it can, when the request's bytes are about
to go onto the wire, not when the caller decides to write: so a process that was frozen
(SIGSTOP, a stalled VM, a long GC pause) and wakes up after its lease ran out finds the fence
shut on its very first write, before any loop of its own has noticed anything, and stays shut
until the elector acquires the lease again.

Not for: deciding who leads (``tessera.kube.lease``) or what to do when a write is refused
(the operator's work loop puts the node back until it leads again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class NotLeading(Exception):  # noqa: N818 (a state, like asyncio.CancelledError, not an "Error")
    """A write refused by the fence: this replica does not hold the lease (or cannot be sure)."""


class WriteFence:
    """Open until a deadline on ``clock`` (``time.monotonic``, which keeps counting while a
    process is stopped), shut before the first ``open_until`` and after ``shut``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until = float("-inf")
        self.refused = 0  # writes refused so far

    def open_until(self, deadline: float) -> None:
        """Writes are allowed until ``deadline`` (a reading of ``clock``)."""
        self._until = deadline

    def shut(self) -> None:
        """No writes from now on, until ``open_until`` again."""
        self._until = float("-inf")

    @property
    def deadline(self) -> float:
        return self._until

    def remaining(self) -> float:
        """Seconds the fence stays open (0 when shut)."""
        return max(0.0, self._until - self.clock())

    def is_open(self) -> bool:
        return self.clock() < self._until

    def check(self, method: str, url: object) -> None:
        """Raise :class:`NotLeading` for a mutating ``method`` while the fence is shut."""
        if method in MUTATING_METHODS and not self.is_open():
            self.refused += 1
            raise NotLeading(f"{method} {url} refused: this replica does not hold the lease")
