"""A clock a test moves by hand: calling it says ``now``, which the test sets (monotonic seconds,
or whatever the code under test reads from the clock it is given)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
