"""The policy sweep: a SharingPolicy the view holds but the API no longer has (deleted while
Kopf's watch was starting over, which says nothing of it) is forgotten, only once a read by
name says 404; reads come every ``every`` seconds, at once after an outage ends, never during."""

from __future__ import annotations

from typing import Any

from tessera.controller.policysweep import PolicySweep
from tessera.kube.outages import Outages
from tests.fakeclock import FakeClock


class Api:
    """The policies as the API has them; which were listed and read by name."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.lists = 0
        self.gets: list[str] = []

    async def list(self) -> list[dict[str, Any]]:
        self.lists += 1
        return [{"metadata": {"name": n}} for n in sorted(self.names)]

    async def get(self, name: str) -> dict[str, Any] | None:
        self.gets.append(name)
        return {"metadata": {"name": name}} if name in self.names else None


def sweep_of(api: Api, view: set[str], clock: FakeClock, outages: Outages | None = None) -> PolicySweep:
    return PolicySweep(api.list, api.get, lambda: set(view), view.discard,
                       Outages(clock) if outages is None else outages, every=30.0, clock=clock)


async def test_a_policy_the_api_no_longer_has_is_forgotten_and_one_it_has_is_not_read_again() -> None:
    api, clock = Api("kept"), FakeClock(100.0)
    view = {"kept", "gone"}
    sweep = sweep_of(api, view, clock)

    await sweep.run_pass()

    assert view == {"kept"}
    assert api.gets == ["gone"], "only what the list lacks is read by name"
    assert sweep.deletions == 1


async def test_a_policy_created_after_the_list_began_is_kept() -> None:
    """In the view (its watch event came) but not in a list that began before it was made: the
    read by name finds it."""
    api, clock = Api("old"), FakeClock(100.0)
    view = {"old", "new"}
    listed = api.list

    async def list_then_create() -> list[dict[str, Any]]:
        items = await listed()
        api.names.add("new")
        return items

    sweep = PolicySweep(list_then_create, api.get, lambda: set(view), view.discard, Outages(clock),
                        every=30.0, clock=clock)
    await sweep.run_pass()

    assert view == {"old", "new"}
    assert sweep.deletions == 0


async def test_reads_come_every_period_at_once_after_an_outage_and_never_during_one() -> None:
    api, clock = Api(), FakeClock(100.0)
    outages = Outages(clock)
    sweep = sweep_of(api, set(), clock, outages)
    await sweep.run_pass()
    assert api.lists == 1

    clock.now += 10
    await sweep.run_pass()
    assert api.lists == 1, "not before the period"

    outages.failed()
    clock.now += 30
    await sweep.run_pass()
    assert api.lists == 1, "not while the apiserver is away"

    clock.now += 2
    outages.answered()
    await sweep.run_pass()
    assert api.lists == 2, "at once when it is back: a watch may have started over"

    clock.now += 1
    await sweep.run_pass()
    assert api.lists == 2, "and then after the period again"
    clock.now += 30
    await sweep.run_pass()
    assert api.lists == 3
