"""Drains (tessera.controller.drains): a drain that has not timed out brings its node back at its
deadline (its policy's timeout, an hour without one); each Pod is evicted once, and forgotten
once no claim is reserved for it; the gauge counts GPUs waiting for claims across nodes."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import cast

from prometheus_client import REGISTRY

from tessera.controller.decide import NodeDecision
from tessera.controller.drains import DEFAULT_DRAIN_TIMEOUT, Drains
from tessera.controller.state import DrainState, Fleet
from tessera.models.layout import GpuLayout
from tests.controller_fleet import NODE, claim_body, policy_body


def drain(uuid: str, claims: tuple[str, ...], policy: str | None = "p", since: float = 0.0,
          timed_out: bool = False) -> DrainState:
    return DrainState(node=NODE, gpu_uuid=uuid, gpu_index=0, policy=policy, target=cast(GpuLayout, None),
                      devices=frozenset({"gpu-0"}), claims=claims, since=since, timed_out=timed_out)


def deciding(*drains: DrainState, evict: tuple[tuple[str, str], ...] = ()) -> NodeDecision:
    return cast(NodeDecision, SimpleNamespace(drains={d.gpu_uuid: d for d in drains}, evict=evict))


def draining_gauge() -> float | None:
    return REGISTRY.get_sample_value("tessera_operator_draining_gpus")


def rooms(fleet: Fleet, evictions: list[tuple[str, str]], calls: list[tuple[str, float]],
          refuse: set[str] | None = None) -> Drains:
    async def evict_pod(namespace: str, pod: str) -> bool:
        evictions.append((namespace, pod))
        return pod not in (refuse or set())

    return Drains(fleet, evict_pod, lambda node, delay: calls.append((node, delay)))


def test_a_drain_comes_back_at_its_policys_timeout_and_the_gauge_counts_gpus_waiting() -> None:
    fleet = Fleet()
    fleet.set_policy(
        policy_body("p", strategy="MIG", mig={"preset": "all-1g"}, drain={"mode": "Wait", "timeout": "5m"})
    )
    calls: list[tuple[str, float]] = []
    drains = rooms(fleet, [], calls)
    since = time.monotonic()
    decision = deciding(drain("GPU-a", ("default/c",), since=since), drain("GPU-b", ()))

    drains.follow(NODE, decision, None)
    assert len(calls) == 1
    assert 299.0 < calls[0][1] <= 300.05
    assert drains.total == 1, "a handover without claims is not draining"
    assert draining_gauge() == 1

    drains.follow("node-2", deciding(drain("GPU-c", ("default/d",), policy="gone", since=since)), None)
    assert DEFAULT_DRAIN_TIMEOUT - 1 < calls[-1][1] <= DEFAULT_DRAIN_TIMEOUT + 0.05
    assert draining_gauge() == 2
    drains.forget(NODE)
    assert draining_gauge() == 1
    drains.forget("node-2")


async def test_each_pod_is_evicted_once_and_forgotten_when_no_claim_holds_it() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", ["gpu-0"], pods=["p1", "p2"]))
    evictions: list[tuple[str, str]] = []
    drains = rooms(fleet, evictions, [], refuse={"p2"})
    timed_out = deciding(evict=(("default", "p1"), ("default", "p2")))

    await drains.evict(NODE, timed_out)
    await drains.evict(NODE, timed_out)
    assert evictions == [("default", "p1"), ("default", "p2"), ("default", "p2")], "a refused one is asked again"
    assert drains.evicted == {("default", "p1")}

    fleet.remove_claim("default", "c")
    await drains.evict(NODE, deciding(evict=(("default", "p3"),)))
    assert drains.evicted == {("default", "p3")}, "p1 is no claim's any more: forgotten"
