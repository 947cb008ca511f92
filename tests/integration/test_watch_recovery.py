"""Every watch comes back after an apiserver crash: the kube-apiserver is SIGKILLed and started
again, and a change made after it is back must reach each watch within a bound, measured stage
by stage on the real control plane with a real operator and a simulated node agent:

- the operator's Kopf watch of SharingPolicies (a policy edit becomes a new NodeLayout spec);
- the agent's NodeLayout watch (the agent applies the new spec: ``status.observedGeneration``);
- the Controller's NodeLayout list-watch (the operator publishes the applied layout's devices);
- then the operator's Kopf watch of ResourceClaims (a new pending claim shows in the operator's
  ``tessera_operator_pending_claims``, which follows every claim event), timed from its creation.

The first three stages need a new NodeLayout spec, which the operator writes only once its
handover hold after the outage is over (kube-scheduler's informers may still be coming back:
``tessera.controller.handover``): they are timed from the apiserver's return like the others,
their bound is the hold plus ``STAGE_BOUND_S``, and the spec must not come before the hold ends.

Twice: with the operator up through the outage; and with the operator and the node's agent
killed and started again while the apiserver is away (that operator saw only the outage's
tail, so its hold is the longest: 65 s after it) and, in the same outage, a second operator
started only after it (it never sees the outage: it learns of it from the apiserver's identity
Lease, ``tessera.kube.apiserverstarts``, and holds as long). The two elect one leader between
them, and whichever leads must hold; both gauges are checked (one outage for both: each hold
costs a minute of CI). The restarted operator's start is the path of the 55 s quiet period
issue #21 names: the operator's start failed on its first list and Kopf retries a failed
startup handler only after 60 s (fixed in 2c2ede5: the start's lists are retried on Tessera's
schedule); with that fix reverted this test fails. An agent started then died of its first
read (a refused connection is an OSError, which its start did not retry; a fault campaign
found it): with that fix reverted the agent stage fails. The bound (``STAGE_BOUND_S``, 30 s)
is the lease duration (a restarted operator waits for its predecessor's lease to expire: 15 s)
with room for a loaded 2-core machine, and below Kopf's 60 s startup retry and its 70 s
inactivity timeout for a silent watch. The agent's watch is also backed by its 30 s resync, so for the agent this
bounds the pair, not the watch alone.
Not for: long churn (``benchmarks/bench_churn.py``) or the fault campaign's invariants.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest

from tessera import RESOURCE_API_VERSION
from tessera.controller.state import pending_on_our_classes
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tests.integration.kube_helpers import (
    apply,
    get,
    get_or_none,
    gpu_node,
    mig_profiles,
    node_devices,
    policy,
    wait_policy,
)

pytestmark = pytest.mark.integration

STAGE_BOUND_S = 30.0  # from the apiserver's /readyz back to each watch's delivery
NODE = "watch-recovery"
LABEL = "watch-recovery"


def _pending_claims(tessera: TesseraProcesses) -> float | None:
    return tessera.operators()[0].metrics().get("tessera_operator_pending_claims")


def _held_until(operator: TesseraProcess) -> float | None:
    """When the operator's handover hold ends (monotonic), once it knows (not while the
    apiserver is away to it)."""
    held = operator.metrics().get("tessera_operator_handover_held_seconds")
    return None if held is None or math.isinf(held) else time.monotonic() + held


def _layout(cluster: LocalCluster) -> dict[str, Any]:
    return get(cluster, "nodelayout", NODE)


def _claims(cluster: LocalCluster) -> int:
    """The claims the gauge counts, read from the apiserver: unallocated, on Tessera's GPU
    classes (the session's other tests leave claims of other classes waiting, a NIC's 21st
    share for one; the agents' fence claims ask for nothing)."""
    return sum(1 for c in cluster.get_json("resourceclaims", "--all-namespaces")["items"] if pending_on_our_classes(c))


# The two layouts the policy switches between, and what each publishes.
LAYOUTS = ({"3g.40gb": 1, "2g.20gb": 1}, {"3g.40gb": 2, "2g.20gb": None})
PUBLISHED = (["2g.20gb", "3g.40gb"], ["3g.40gb", "3g.40gb"])


@pytest.mark.parametrize("operator", ["up", "restarted"], ids=["operator-up", "operator-restarted-and-started-after"])
async def test_every_watch_delivers_a_change_made_after_the_apiserver_restarts(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str, operator: str
) -> None:
    """With the operator up through the outage; or killed and started again while the apiserver
    is away (its start then meets a dead apiserver: the path of the earlier 55 s quiet period,
    when a failed Kopf startup handler was retried only after 60 s), with a second replica
    started once the outage is over (it never sees the outage: it learns of it from the
    apiserver's identity Lease)."""
    if get_or_none(cluster, "node", NODE) is None:
        gpu_node(cluster, tessera, NODE, LABEL, "1xH100-80GB")
        apply(cluster, policy(LABEL, LABEL, {"strategy": "MIG", "mig": {"profiles": LAYOUTS[0]}}))
    now = 0 if mig_profiles(node_devices(cluster, NODE)) != PUBLISHED[1] else 1
    await wait_for(lambda: mig_profiles(node_devices(cluster, NODE)) == PUBLISHED[now], timeout=120,
                   message="the first MIG layout published")
    await wait_policy(cluster, LABEL, "Ready", "True", gpus=1)
    await wait_for(lambda: _pending_claims(tessera) == _claims(cluster), timeout=30, message="the operator's metrics")
    generation_before = int(_layout(cluster)["metadata"]["generation"])

    # Let every watch settle into a long-running stream before the crash.
    await asyncio.sleep(3)
    await asyncio.to_thread(cluster.kill_apiserver)
    if operator == "restarted":
        old = tessera.operators()[0]
        old.kill()
        tessera.processes.remove(old)
        tessera.operator()
        agent = next(p for p in tessera.processes if p.name == f"agent-{NODE}")
        agent.kill()  # the agent too: its start must wait for the apiserver, not die of it
        tessera.processes.remove(agent)
        tessera.agent(NODE, "1xH100-80GB")
        await asyncio.sleep(5)  # the new operator and agent start (and meet no apiserver)
    else:
        await asyncio.sleep(2)
    await asyncio.to_thread(cluster.start_apiserver)
    back = time.monotonic()
    if operator == "restarted":
        tessera.operator("operator-after")  # a replica that never saw the outage
    # The operator holds every handover until kube-scheduler's informers can be back from the
    # outage (tessera.controller.handover.watchers_back_by): the stages that need the new spec
    # get that hold on top of their bound, and must not come before it ends. With two replicas
    # either may lead: both must hold.
    ends = []
    for replica in tessera.operators():
        ends.append(await wait_for(lambda r=replica: _held_until(r), timeout=STAGE_BOUND_S, interval=0.2,
                                   message=f"the handover hold after the outage ({replica.name})"))
    holds = [max(0.0, end - back) for end in ends]
    assert min(holds) > 5.0, f"the operator saw the outage and holds handovers for it (held {holds} s)"
    if operator != "up":  # each saw only the outage's tail, or none of it: taken as long
        assert min(holds) > 55.0, f"an outage a replica did not see whole holds the longest wait (held {holds} s)"
    held_until, hold = min(ends), max(holds)

    took: dict[str, float] = {}

    async def stage(name: str, done: Any, since: float, after: float = -math.inf) -> None:
        await wait_for(done, timeout=STAGE_BOUND_S * 3 + hold, interval=0.2, message=name)
        took[name] = time.monotonic() - since
        assert time.monotonic() > after - 0.5, f"{name}: before the handover hold ended"

    # A policy edit travels through three watches; the claim goes afterwards, so that a pending
    # claim does not hold the layout change back (the drain waits for claims).
    cluster.kubectl("patch", "sharingpolicy", LABEL, "--type=merge",
                    "-p", json.dumps({"spec": {"mig": {"profiles": LAYOUTS[1 - now]}}}))
    await asyncio.gather(
        stage("kopf SharingPolicies -> NodeLayout spec (after the hold)",
              lambda: int(_layout(cluster)["metadata"]["generation"]) > generation_before, back, held_until),
        stage("agent NodeLayout watch -> spec applied",
              lambda: (lambda body: int(body["metadata"]["generation"]) > generation_before
                       and body.get("status", {}).get("observedGeneration") == body["metadata"]["generation"])(
                  _layout(cluster)), back),
        stage("controller NodeLayout list-watch -> new layout published",
              lambda: mig_profiles(node_devices(cluster, NODE)) == PUBLISHED[1 - now], back),
    )
    claimed = time.monotonic()
    apply(cluster, {
        "apiVersion": RESOURCE_API_VERSION, "kind": "ResourceClaim",
        "metadata": {"name": "after-restart", "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
    })
    await stage("kopf ResourceClaims -> pending claim counted",
                lambda: _pending_claims(tessera) == _claims(cluster), claimed)
    print("watch recovery after the apiserver restart (s):", {k: round(v, 1) for k, v in took.items()})
    print("handover hold after the outage, each replica (s):", [round(h, 1) for h in holds])
    bounds = {name: STAGE_BOUND_S + (hold if "ResourceClaims" not in name else 0.0) for name in took}
    slow = {name: round(seconds, 1) for name, seconds in took.items() if seconds > bounds[name]}
    assert not slow, f"watches slow to recover after the apiserver restart (s): {slow}; all: {took}"
