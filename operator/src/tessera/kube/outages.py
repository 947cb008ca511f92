"""When the apiserver could not be reached, as one client saw it: the spells from a call's
failure (a refused or broken connection) to the next answer. A 5xx or 429 neither begins nor
ends one: an apiserver that is starting answers so until it serves (the spell that began when
it went away goes on), and one that is up answers so when etcd or a webhook fails, or when
priority and fairness turn a request away, none of which takes its watchers away.

What it is for: every other client of the apiserver lost it for the same spell, kube-scheduler
among them, and a client-go informer comes back on its own backoff, seconds to a minute after
the apiserver does. Until it has, the scheduler allocates from the slices it saw before the
spell; the operator's handover reads these spells to wait for it (``tessera.controller.handover``).
A spell is seen from this client only: its start is this client's first failure (a watch
breaks at once), its end this client's next answer (which may come a retry later than the
apiserver's return, so a spell is seen longer, never shorter, than it was, as long as this
client was calling throughout; a process that started after a spell never saw it). A spell
that began before this client's first answer is *blind*: the process started into it (its
first call failed, or the apiserver was still starting and answered 5xx), so when it began is
unknown, and it may have lasted any time before.
Not for: retrying (``tessera.kube.http.retry_delay``) or telling a caller what failed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import structlog

log = structlog.get_logger("tessera.kube")

KEPT = 32  # spells remembered: enough to chain every spell of the last minutes


class Spell(NamedTuple):
    began: float  # this client's first failure (monotonic seconds)
    ended: float  # this client's next answer
    blind: bool = False  # began before this client's first answer: it may have begun any time before


class Outages:
    """Spells without an answer from the apiserver, oldest first, and the one under way."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.since: float | None = None  # when the spell under way began; None: the last call was answered
        self.spells: deque[Spell] = deque(maxlen=KEPT)
        self.heard = False  # some call was answered
        self._blind = False  # the spell under way began before any answer

    def failed(self) -> None:
        """A call found no apiserver (refused, or broken off)."""
        if self.since is None:
            self.since = self._clock()
            self._blind = not self.heard

    def answered(self) -> None:
        """A call was answered: the spell under way, if any, is over."""
        self.heard = True
        if self.since is not None:
            began, self.since = self.since, None
            ended = self._clock()
            self.spells.append(Spell(began, ended, self._blind))
            log.info("the apiserver answers again", unanswered_s=round(ended - began, 1), blind=self._blind)

    def learned(self, ended: float) -> None:
        """A spell this client did not see ended at ``ended`` (monotonic seconds; an apiserver
        started then, ``tessera.kube.apiserverstarts``): kept as a blind one, in its place."""
        self.spells.append(Spell(ended, ended, True))
        self.spells = deque(sorted(self.spells), maxlen=KEPT)

    def answer(self, status: int) -> None:
        """An HTTP status came back: an answer, unless a 5xx or 429, which change nothing once
        this client has been answered; before that, they begin a blind spell (an apiserver
        still starting answers 503 until it serves)."""
        if status < 500 and status != 429:
            self.answered()
        elif not self.heard:
            self.failed()
