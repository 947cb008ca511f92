"""Apiserver starts read from identity Leases (tessera.kube.apiserverstarts): only a start after
something of ours existed counts, its age is never overstated (the apiserver's own clock,
creationTimestamp's whole second taken off), and a start the operator learns of holds the
handover as an outage it started into would (tessera.kube.outages, tessera.controller.handover)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.controller.handover import APISERVER_START_WAIT_S, STARTING_S, watchers_back_by
from tessera.kube.apiserverstarts import started_ago
from tessera.kube.outages import Outages


def lease(created: str | None, renewed: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "apiserver-x", **({"creationTimestamp": created} if created else {})},
            "spec": {"holderIdentity": "apiserver-x_1", **({"renewTime": renewed} if renewed else {})}}


def test_a_start_counts_only_after_something_of_ours_existed_and_its_age_is_never_overstated() -> None:
    restarted = lease("2026-12-06T23:21:03Z", "2026-12-06T23:21:13.340056Z")
    # renewed 10.34 s after its creationTimestamp, which may read up to 1 s early: at least 9.34 s old
    assert started_ago([restarted], "2026-12-06T23:20:00Z") == [pytest.approx(9.340056)]
    assert started_ago([restarted], "2026-12-06T23:21:03Z") == [], "a slice made as it started: a new cluster"
    assert started_ago([restarted], "2026-12-06T23:25:00Z") == [], "everything of ours came after it"
    assert started_ago([restarted], None) == [], "nothing of ours exists: no scheduler saw any of it"
    just = lease("2026-12-06T23:21:03Z", "2026-12-06T23:21:03.5Z")
    assert started_ago([just], "2026-12-06T23:20:00Z") == [0.0], "never below zero"
    assert started_ago([lease(None, "2026-12-06T23:21:03Z"), lease("2026-12-06T23:21:03Z", None),
                        lease("yesterday", "2026-12-06T23:21:03Z")], "2026-12-06T23:20:00Z") == []
    two = [restarted, lease("2026-12-06T20:00:00Z", "2026-12-06T23:21:10Z")]
    assert started_ago(two, "2026-12-06T23:00:00Z") == [pytest.approx(9.340056)], "the other was up before ours"


def test_a_start_learned_of_holds_the_handover_as_long_as_a_blind_outage() -> None:
    now = 1000.0
    outages = Outages(lambda: now)
    outages.answered()
    outages.failed()
    now = 1003.0
    outages.answered()  # a spell this process saw: 3 s
    (age,) = started_ago([lease("2026-12-06T23:21:03Z", "2026-12-06T23:21:23Z")], "2026-12-06T23:00:00Z")
    assert age == 19.0
    outages.learned(now - age + STARTING_S)  # an apiserver started 19 s ago, before the spell
    assert [s.blind for s in outages.spells] == [True, False], "kept in time order"
    # Chained with the spell seen 3 s after it (less than 2 min apart): the longest wait, then 5 s.
    assert watchers_back_by(outages) == 1003.0 + 60.0 + 5.0
    alone = Outages(lambda: now)
    alone.learned(now - age + STARTING_S)
    assert watchers_back_by(alone) == now - age + APISERVER_START_WAIT_S
