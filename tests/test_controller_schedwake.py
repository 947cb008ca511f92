"""The scheduler wake: which refused claims are suspects of kube-scheduler's double count of a
shared device (refused within the window of a share's allocation), when the DeviceClass is
written (after the settle, once per suspect, at most once per gap), and what a failed or
refused write leaves (the suspect waits for the next try)."""

from __future__ import annotations

from typing import Any

from tessera.controller.schedwake import SchedulerWake
from tessera.controller.writes import NotLeading
from tessera.kube.http import ApiError
from tests.fakeclock import FakeClock

OURS = "gpu.tessera.dev"
SHARED = "shared-gpu.tessera.dev"
WHOLE = "whole-gpu.tessera.dev"


def claim(name: str, device_class: str = SHARED, *, allocated: bool = False, share: bool = True,
          driver: str = OURS) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": "team", "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
    }
    if allocated:
        result = {"request": "gpu", "driver": driver, "pool": "n1", "device": "gpu-0"}
        if share:
            result["shareID"] = "4e2f0c8a-0000-4000-8000-000000000001"
        body["status"] = {"allocation": {"devices": {"results": [result]}}}
    return body


class Room:
    """A wake over a fake clock, the refusals as the demand's Pod watch records them, and the
    DeviceClass writes it made."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.clock = FakeClock(1000.0)
        self.refused: dict[str, float] = {}
        self.writes: list[str] = []
        self.fail = fail
        self.wake = SchedulerWake([SHARED, WHOLE], [OURS], self.refused, self.write, clock=self.clock)

    async def write(self, device_class: str, at: str) -> None:
        if self.fail is not None:
            raise self.fail
        assert at.endswith("+00:00"), "the annotation's time is UTC"
        self.writes.append(device_class)

    def waits(self, name: str, device_class: str = SHARED) -> None:
        self.wake.claim_seen("ADDED", claim(name, device_class))

    def allocated(self, name: str, device_class: str = SHARED, **kwargs: Any) -> None:
        self.wake.claim_seen("MODIFIED", claim(name, device_class, allocated=True, **kwargs))

    def refuse(self, name: str) -> None:
        self.refused[f"team/{name}"] = self.clock.now

    def later(self, seconds: float) -> None:
        self.clock.now += seconds


async def test_a_claim_refused_beside_a_shares_allocation_wakes_the_scheduler_once_after_the_settle() -> None:
    room = Room()
    room.waits("a")
    room.waits("c")
    room.allocated("a")
    room.later(0.3)
    room.refuse("c")
    room.later(1.0)
    assert not await room.wake.run_pass(), "not before the settle: the double count may still be in flight"
    room.later(1.5)
    assert await room.wake.run_pass()
    assert room.writes == [SHARED]
    for _ in range(30):
        room.later(1.0)
        assert not await room.wake.run_pass()
    assert room.writes == [SHARED], "each suspect wakes the scheduler once"


async def test_a_refusal_just_before_the_allocation_is_seen_counts_too() -> None:
    room = Room()
    room.waits("a")
    room.waits("c")
    room.refuse("c")  # the Pod's condition reached the operator before the other claim's allocation
    room.later(0.8)
    room.allocated("a")
    room.later(3.0)
    assert await room.wake.run_pass()
    assert room.writes == [SHARED]


async def test_refusals_far_from_any_share_or_beside_other_allocations_wake_nothing() -> None:
    room = Room()
    for name in ("a", "b", "c", "d", "e"):
        room.waits(name, WHOLE if name == "b" else SHARED)
    room.allocated("a")
    room.later(5.0)
    room.refuse("c")  # 5 s after the share: a real lack of room
    room.allocated("b", WHOLE, share=False)  # an exclusive device: nothing is counted twice
    room.refuse("d")
    room.allocated("e", share=True, driver="other.example.com")  # another driver's share
    room.later(60.0)
    assert not await room.wake.run_pass()
    assert room.writes == []


async def test_one_write_wakes_every_suspect_and_writes_wait_for_the_gap() -> None:
    room = Room()
    for name in ("a", "b", "c", "d", "x"):
        room.waits(name)
    room.allocated("a")
    room.refuse("c")
    room.refuse("d")
    room.later(2.5)
    assert await room.wake.run_pass()
    assert room.writes == [SHARED]
    room.allocated("b")
    room.refuse("x")
    room.later(2.5)
    assert not await room.wake.run_pass(), "within the gap of the last write"
    room.later(room.wake.min_gap)
    assert await room.wake.run_pass()
    assert room.writes == [SHARED, SHARED]


async def test_a_claim_allocated_or_deleted_meanwhile_is_no_longer_a_suspect() -> None:
    room = Room()
    for name in ("a", "c", "d"):
        room.waits(name)
    room.allocated("a")
    room.refuse("c")
    room.refuse("d")
    room.allocated("c")  # the scheduler tried it again on its own and it fitted
    room.wake.claim_seen("DELETED", claim("d"))
    room.later(3.0)
    assert not await room.wake.run_pass()
    assert room.wake.waiting == {}


async def test_a_refused_or_failed_write_leaves_the_suspect_for_a_later_try() -> None:
    for fail in (NotLeading("a standby"), ApiError(403, "Forbidden", "deviceclasses is forbidden")):
        room = Room(fail)
        room.waits("a")
        room.waits("c")
        room.allocated("a")
        room.refuse("c")
        room.later(3.0)
        assert not await room.wake.run_pass()
        assert room.wake.woken == set()
        room.fail = None
        room.later(room.wake.min_gap)
        assert await room.wake.run_pass()
        assert room.writes == [SHARED]


async def test_shares_older_than_a_minute_are_forgotten() -> None:
    room = Room()
    for i in range(100):
        room.waits(f"s{i}")
        room.allocated(f"s{i}")
        room.later(1.0)
    assert room.wake.due() is None
    assert len(room.wake.shares) <= 61


async def test_the_window_is_two_seconds_either_side_of_the_share() -> None:
    room = Room()
    for name in ("a", "late", "b", "early", "c", "close"):
        room.waits(name)
    room.allocated("a")
    room.later(2.5)
    room.refuse("late")  # 2.5 s after a share
    room.later(10.0)
    room.refuse("early")  # 2.5 s before the next
    room.later(2.5)
    room.allocated("b")
    room.later(3.0)
    assert room.wake.due() is None
    room.refuse("close")  # 1.5 s before the next
    room.later(1.5)
    room.allocated("c")
    room.later(3.0)
    assert room.wake.due() == (SHARED, ["team/close"])
