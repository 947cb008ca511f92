"""Two operators, one writer, against the real control plane.

The Lease elector on its own (two electors in this process, each with its own client and
fence): one leads; a dead leader (its task cancelled, no release) is replaced no sooner than a
lease duration after its last renewal; a released lease is taken at once; candidates racing
for an expired lease never both win. Then two operator processes: SIGKILL the leader and the
standby takes over and writes; SIGSTOP the leader for longer than the lease, SIGCONT it, and it
writes nothing (its client's write log, a line per mutating request as it reaches the wire, on
the machine-wide monotonic clock) until it leads again. Random timing is seeded
(``TESSERA_LEADER_SEED``) so a failure replays its pauses and moments.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.controller.leadership import Leadership, LeaseSettings
from tessera.kube.fence import NotLeading, WriteFence
from tessera.kube.http import KubeClient, resource_path
from tessera.kube.lease import LeaseElector, LeaseTiming
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tests.integration.campaign import read_write_log, writes_only
from tests.integration.kube_helpers import apply, get, gpu_node, policy, wait_policy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("TESSERA_LEADER_SEED", "21"))
FAST = LeaseTiming(lease_duration=4.0, renew_deadline=3.0, retry_period=0.5)  # elector tests only
# Operator processes share two cores with everything else here: a little more room to renew.
PROCESS_TIMING = {"TESSERA_LEASE_DURATION": "6", "TESSERA_RENEW_DEADLINE": "4", "TESSERA_RETRY_PERIOD": "1"}
NAMESPACE = "default"


# -- the elector on its own ----------------------------------------------------------------


class Candidate:
    def __init__(self, cluster: LocalCluster, lease: str, identity: str, rng: random.Random) -> None:
        self.fence = WriteFence()
        self.client = KubeClient.from_environment(str(cluster.kubeconfig))
        self.started: list[float] = []
        self.stopped: list[float] = []
        self.elector = LeaseElector(self.client, NAMESPACE, lease, identity, self.fence, timing=FAST,
                                    on_started_leading=lambda: self.started.append(time.monotonic()),
                                    on_stopped_leading=lambda: self.stopped.append(time.monotonic()), rng=rng)
        self.task: asyncio.Task[None] | None = None

    def run(self) -> None:
        self.task = asyncio.create_task(self.elector.run())

    async def die(self) -> None:
        """As SIGKILL would: the loop ends, nothing is released."""
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def lease_name(cluster: LocalCluster) -> AsyncIterator[str]:
    name = f"elect-{random.getrandbits(24):06x}"
    yield name
    cluster.kubectl("delete", "lease", name, "-n", NAMESPACE, "--ignore-not-found", check=False)


def read_lease(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return get(cluster, "lease", name, "-n", NAMESPACE)


async def test_one_of_two_electors_leads_and_a_dead_leader_is_replaced_only_after_its_lease(
    cluster: LocalCluster, lease_name: str
) -> None:
    rng = random.Random(SEED)
    a, b = (Candidate(cluster, lease_name, who, rng) for who in ("a", "b"))
    a.run()
    await wait_for(lambda: a.elector.leading, timeout=10, message="a to lead")
    b.run()
    await asyncio.sleep(FAST.lease_duration + rng.uniform(0.5, 1.5))
    assert a.elector.leading, "a renews, so b never takes over"
    assert not b.elector.leading
    assert a.fence.is_open()
    assert not b.fence.is_open()
    assert read_lease(cluster, lease_name)["spec"]["holderIdentity"] == "a"

    # a dies at a random moment between renewals; b must wait a whole lease from a's last renewal.
    await asyncio.sleep(rng.uniform(0, FAST.retry_period))
    last_renewal = a.fence.deadline - FAST.renew_deadline  # when a sent its last successful renewal
    await a.die()
    await wait_for(lambda: b.elector.leading, timeout=FAST.lease_duration + 5, interval=0.02, message="b to lead")
    taken = b.started[0]
    assert taken - last_renewal >= FAST.lease_duration, "b took the lease before a's could have expired"
    assert taken - last_renewal <= FAST.lease_duration + 1.5, "b watches the lease and takes it when it expires"
    assert a.fence.deadline < taken, "a's fence had shut before b could write"
    spec = read_lease(cluster, lease_name)["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 4

    # A clean shutdown hands over at once.
    c = Candidate(cluster, lease_name, "c", rng)
    c.run()
    await asyncio.sleep(0.5)
    assert not c.elector.leading
    assert b.task is not None
    b.task.cancel()
    await b.elector.release()
    released = time.monotonic()
    assert not b.fence.is_open()
    await wait_for(lambda: c.elector.leading, timeout=FAST.retry_period * 3, interval=0.02, message="c to lead")
    assert c.started[0] - released < FAST.retry_period * 2.5
    assert read_lease(cluster, lease_name)["spec"]["leaseTransitions"] == 2
    await c.die()
    for candidate in (a, b, c):
        await candidate.client.close()


async def test_candidates_racing_for_an_expired_lease_never_both_lead(cluster: LocalCluster, lease_name: str) -> None:
    rng = random.Random(SEED + 1)
    clients = []

    async def attempts(each: Candidate) -> list[bool]:
        out = []
        for _ in range(4):
            await asyncio.sleep(rng.uniform(0, 0.05))
            out.append(await each.elector.try_acquire_or_renew())
        return out

    for round_ in range(3):  # the first races to create the Lease, the others to take an expired one
        candidates = [Candidate(cluster, lease_name, f"racer-{round_}-{i}", rng) for i in range(4)]
        clients += [c.client for c in candidates]
        if round_:
            for c in candidates:  # each sees the lease as it is, then nobody renews for a whole lease
                assert not await c.elector.try_acquire_or_renew()
            await asyncio.sleep(FAST.lease_duration + 0.2)
        results = await asyncio.gather(*(attempts(c) for c in candidates))
        winners = [c.elector.identity for c, tried in zip(candidates, results, strict=True) if any(tried)]
        assert len(winners) == 1, f"round {round_}: {winners} all took the lease"
        assert read_lease(cluster, lease_name)["spec"]["holderIdentity"] == winners[0]
        assert sum(c.fence.is_open() for c in candidates) == 1
    assert read_lease(cluster, lease_name)["spec"]["leaseTransitions"] == 2
    for client in clients:
        await client.close()


async def test_a_shut_fence_refuses_a_write_before_it_reaches_the_apiserver(cluster: LocalCluster) -> None:
    fence = WriteFence()
    sent: list[str] = []
    async with KubeClient.from_environment(str(cluster.kubeconfig), fence=fence,
                                           on_write=lambda method, url: sent.append(method)) as client:
        path = resource_path("", "v1", "configmaps", namespace=NAMESPACE)
        name = f"fence-{random.getrandbits(24):06x}"
        with pytest.raises(NotLeading):
            await client.create(path, {"metadata": {"name": name}, "data": {"a": "1"}})
        assert sent == []
        fence.open_until(time.monotonic() + 30)
        created = await client.create(path, {"metadata": {"name": name}, "data": {"a": "1"}})
        assert sent == ["POST"]
        fence.shut()
        with pytest.raises(NotLeading):
            await client.patch(f"{path}/{name}", {"data": {"a": "2"}})
        assert (await client.get(f"{path}/{name}"))["metadata"]["resourceVersion"] == \
            created["metadata"]["resourceVersion"], "the refused patch never reached the apiserver"
        fence.open_until(time.monotonic() + 30)
        await client.delete(f"{path}/{name}")
        assert fence.refused == 2


class Follower:
    """What Leadership drives: records lead() and follow() as the operator's loop runs them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def lead(self) -> None:
        self.calls.append("lead")

    def follow(self) -> None:
        self.calls.append("follow")


async def test_a_leader_whose_loop_is_held_past_the_renew_deadline_keeps_its_lease(
        cluster: LocalCluster, lease_name: str) -> None:
    """The elector renews from its own thread: CPU-bound work on the operator's loop for twice
    the renew deadline costs the leadership nothing (before, the leader lost its own lease)."""
    leadership = Leadership(LeaseSettings(namespace=NAMESPACE, name=lease_name, identity="busy", timing=FAST),
                            str(cluster.kubeconfig))
    follower = Follower()
    leadership.start(follower)  # type: ignore[arg-type]  # a Controller's lead/follow only
    try:
        await wait_for(lambda: follower.calls == ["lead"], timeout=10, interval=0.05, message="busy to lead")
        renewed = read_lease(cluster, lease_name)["spec"]["renewTime"]
        time.sleep(FAST.renew_deadline * 2)  # noqa: ASYNC251  # the point: the loop held, no await for 6 s
        assert leadership.fence.is_open(), "the fence stayed open: renewals went on while the loop was held"
        await asyncio.sleep(0.1)
        assert follower.calls == ["lead"]
        spec = read_lease(cluster, lease_name)["spec"]
        assert (spec["holderIdentity"], spec.get("leaseTransitions", 0)) == ("busy", 0)
        assert spec["renewTime"] != renewed
        assert leadership.role() == "leader"
    finally:
        await leadership.stop()
    assert follower.calls == ["lead", "follow"], "stop hands over: the work is told to follow"
    assert not leadership.fence.is_open()
    assert read_lease(cluster, lease_name)["spec"]["holderIdentity"] == "", "released on stop"


# -- two operator processes ----------------------------------------------------------------


@pytest.fixture
def replicas(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TesseraProcesses]:
    cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
    processes = TesseraProcesses(cluster, tmp_path_factory.mktemp("ld"))  # short: unix socket paths live under it
    try:
        yield processes
    finally:
        for process in processes.processes:
            process.thaw()
        cluster.kubectl("delete", "sharingpolicies", "-l", "tessera.dev/leader-test", "--timeout=60s",
                        check=False, timeout=90)
        processes.stop_all()


def start_operator(processes: TesseraProcesses, name: str) -> tuple[TesseraProcess, Path]:
    log = processes.folder / f"{name}.writes"
    log.touch()
    env = {**PROCESS_TIMING, "TESSERA_LEASE_NAME": "leader-test", "TESSERA_FAULT_WRITE_LOG": str(log)}
    return processes.operator(name, env=env), log


def writes_in(log: Path, since: float = float("-inf")) -> list[tuple[float, str]]:
    """The writes of an operator's write log whose wire time (monotonic seconds) is ``since`` or later."""
    return writes_only(read_write_log(log), since)


async def roles(*processes: TesseraProcess) -> list[str | None]:
    return await asyncio.gather(*(asyncio.to_thread(p.role) for p in processes))


async def one_leader(*processes: TesseraProcess, timeout: float = 40) -> TesseraProcess:
    async def find() -> TesseraProcess | None:
        found = await roles(*processes)
        leaders = [p for p, r in zip(processes, found, strict=True) if r == "leader"]
        assert len(leaders) <= 1, f"two leaders: {found}"
        return leaders[0] if leaders and all(r in ("leader", "standby") for r in found) else None

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = await find()
        if leader is not None:
            return leader
        await asyncio.sleep(0.2)
    raise AssertionError(f"no single leader among {[p.name for p in processes]}: {await roles(*processes)}; "
                         + "\n".join(p.tail(15) for p in processes))


def flip(name: str, label: str, rng: random.Random) -> dict[str, Any]:
    layouts: list[dict[str, Any]] = [{"strategy": "MIG", "mig": {"preset": "all-1g"}},
                         {"strategy": "MIG", "mig": {"preset": "all-balanced"}},
                         {"strategy": "TimeSlicing", "timeSlicing": {"replicas": rng.randint(2, 6)}},
                         {"strategy": "Exclusive"}]
    body = policy(name, label, rng.choice(layouts))
    body["metadata"]["labels"] = {"tessera.dev/leader-test": "yes"}
    return body


async def test_a_killed_leader_is_replaced_by_the_standby_which_then_writes(
    cluster: LocalCluster, replicas: TesseraProcesses
) -> None:
    rng = random.Random(SEED + 2)
    (a, a_log), (b, b_log) = start_operator(replicas, "op-a"), start_operator(replicas, "op-b")
    gpu_node(cluster, replicas, "leader-kill", "leader-kill", "2xH100-80GB")
    leader = await one_leader(a, b)
    standby, standby_log = (b, b_log) if leader is a else (a, a_log)
    apply(cluster, flip("leader-kill", "leader-kill", rng))
    await wait_policy(cluster, "leader-kill", "Ready", "True", timeout=90)
    assert writes_in(standby_log) == [], "the standby wrote while the other led"
    assert standby.metrics().get("tessera_operator_leader") == 0
    assert leader.metrics().get("tessera_operator_leader") == 1

    await asyncio.sleep(rng.uniform(0, 1))
    killed = time.monotonic()
    leader.kill()
    change = flip("leader-kill", "leader-kill", rng)
    change["spec"]["priority"] = 7  # a change for the new leader to carry out, whatever layout was drawn
    apply(cluster, change)
    assert await one_leader(standby, timeout=30) is standby
    await wait_for(lambda: writes_in(standby_log), timeout=30, message="the new leader's first write")
    first = min(at for at, _ in writes_in(standby_log))
    assert first - killed >= 6 - 1.5, "the standby wrote before the old lease could have expired"
    body = await wait_policy(cluster, "leader-kill", "Ready", "True", timeout=60)
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    lease = get(cluster, "lease", "leader-test", "-n", "default")["spec"]
    assert lease["leaseTransitions"] >= 1
    assert standby.metrics().get("tessera_operator_lease_transitions", 0) >= 1


async def test_a_frozen_leader_writes_nothing_after_it_wakes_until_it_leads_again(
    cluster: LocalCluster, replicas: TesseraProcesses
) -> None:
    rng = random.Random(SEED + 3)
    (a, a_log), (b, b_log) = start_operator(replicas, "op-c"), start_operator(replicas, "op-d")
    nodes = ["leader-freeze-0", "leader-freeze-1"]
    for node in nodes:
        gpu_node(cluster, replicas, node, "leader-freeze", "2xH100-80GB")
    frozen = await one_leader(a, b)
    frozen_log, other, other_log = (a_log, b, b_log) if frozen is a else (b_log, a, a_log)
    apply(cluster, flip("leader-freeze", "leader-freeze", rng))
    await wait_policy(cluster, "leader-freeze", "Ready", "True", timeout=90)

    # Churn, so the leader is busy writing when it freezes and has work queued when it wakes.
    churning = True

    async def churn() -> None:
        while churning:
            await asyncio.to_thread(apply, cluster, flip("leader-freeze", "leader-freeze", rng))
            await asyncio.sleep(rng.uniform(0.2, 0.8))

    churner = asyncio.create_task(churn())
    try:
        await asyncio.sleep(rng.uniform(0.5, 3.0))
        stopped = time.monotonic()
        frozen.freeze()
        assert await one_leader(other, timeout=6 + 10) is other
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        woke = time.monotonic()
        frozen.thaw()
        await asyncio.sleep(5 + rng.uniform(0, 2))  # the woken process runs its backlog
        assert await roles(frozen, other) == ["standby", "leader"]
        assert writes_in(frozen_log, since=stopped) == [], "the frozen leader wrote after it woke"
        assert writes_in(other_log, since=stopped), "the new leader carried the churn on"
        refused = frozen.metrics().get("tessera_operator_fenced_writes", 0)
    finally:
        churning = False
        await churner

    # It writes again once it leads again (the fence reopens, nothing is stuck).
    other.kill()
    taken_back = time.monotonic()
    assert await one_leader(frozen, timeout=20) is frozen
    change = flip("leader-freeze", "leader-freeze", rng)
    change["spec"]["priority"] = 3  # a change to carry out, whatever layout was drawn
    apply(cluster, change)
    await wait_for(lambda: writes_in(frozen_log, since=taken_back), timeout=30,
                   message="the woken replica to write once it leads again")
    print(f"seed {SEED}: froze for {woke - stopped:.1f} s; writes refused by the fence after waking: {refused:.0f}")
