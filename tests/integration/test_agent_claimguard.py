"""The agent is the last line against the real control plane: a ResourceClaim allocated a device
just before the agent would destroy it keeps its device, and the agent says which claim.

1. The race, exactly: the reconciler plans a destroy from the hardware, and the allocation is
   written (acknowledged by the apiserver) after that plan and before the destroy runs. The
   guard reads claims right before the destroy, so it sees the allocation. Seeded rounds pick
   which instance is claimed and whether the claim lands before or after the plan. The claims
   come from a cluster-wide quorum list, or from the agent's ``ClaimView``, one read proved per
   pass (``tessera.agent.passclaims``): by the operator's answer to its ask (the operator's
   ``ClaimChecks``, with its own watch of every claim), or by its own claim watch and fence.
   Each must see the allocation just as surely.
2. The agent process: a claim allocated, then at once a spec that would remove its instance;
   the agent keeps it, reports ``InstanceInUse`` naming the claim, and finishes the layout once
   the claim is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tessera import DRIVER_NAME, INSTALL_NAMESPACE
from tessera.agent.backends.base import GpuInfo, Inventory
from tessera.agent.backends.simulated import SimulatedBackend, SimulatedHardware, parse_simulate_spec
from tessera.agent.claimguard import ClaimGuard
from tessera.agent.claimview import ClaimView
from tessera.agent.passclaims import PassClaimReads
from tessera.agent.reconciler import BlockReason, OpKind, apply_layout
from tessera.agent.service import AgentConfig, NodeAgent
from tessera.agent.status import build_status
from tessera.controller.claimchecks import ClaimChecks
from tessera.kube.claims import list_resource_claims, write_claim_check_answer
from tessera.kube.http import KubeClient
from tessera.kube.nodelayouts import GROUP, PLURAL, VERSION
from tessera.kube.watch import ListWatch
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.models.layout import GpuLayout, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import Strategy
from tests.integration.kube_helpers import get_or_none

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "crds" / "tessera.dev_nodelayouts.yaml"
NAMESPACE_YAML = Path(__file__).resolve().parents[2] / "manifests" / "namespace.yaml"  # the fence claims' home
SEED = int(os.environ.get("TESSERA_RACE_SEED", "20261202"))


def mig(uuid: str, *placed: tuple[str, int]) -> GpuLayout:
    instances = [PlacedInstance(profile=p, start=s) for p, s in placed]
    return GpuLayout(uuid=uuid, strategy=Strategy.MIG, mig_instances=instances)


def create_claim(cluster: LocalCluster, namespace: str, name: str) -> None:
    cluster.apply_objects([{
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.tessera.dev"}}]}},
    }])


def allocate(cluster: LocalCluster, namespace: str, name: str, node: str, device: str) -> None:
    """Write the allocation as the scheduler does (status subresource); returns once acknowledged."""
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": node, "device": device}]}}
    cluster.kubectl(
        "patch", "resourceclaim", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"allocation": allocation}}),
    )


class AllocateAfterPlan(SimulatedBackend):
    """The backend under the reconciler: once the plan's inventory has been read, the claim's
    allocation is written (so it lands between the plan and the destroy)."""

    def __init__(self, hardware: SimulatedHardware) -> None:
        super().__init__(hardware)
        self.on_next_inventory: Any = None

    def inventory(self) -> Inventory:
        seen = super().inventory()
        hook, self.on_next_inventory = self.on_next_inventory, None
        if hook is not None:
            hook()
        return seen


@pytest.mark.parametrize("source", ["list", "operator-answer", "fenced-watch"])
async def test_a_claim_allocated_between_plan_and_destroy_keeps_its_instance(
    cluster: LocalCluster, namespace: str, source: str
) -> None:
    rng = random.Random(SEED)
    api = KubeClient.from_environment(str(cluster.kubeconfig))
    loop = asyncio.get_running_loop()
    cluster.apply(NAMESPACE_YAML)
    views: list[ClaimView] = []
    # The operator's side, for "operator-answer": its claim checks, with their own watch of claims.
    leading = asyncio.Event()
    leading.set()
    checks = ClaimChecks(api, lambda ns, name, answer: write_claim_check_answer(api, ns, name, answer),
                         INSTALL_NAMESPACE, leading)
    if source == "operator-answer":
        checks.start()

    async def claims_of(node: str) -> Callable[[], Sequence[Mapping[str, Any]]]:
        if source == "list":
            return lambda: asyncio.run_coroutine_threadsafe(list_resource_claims(api), loop).result(30)
        view = ClaimView(api, driver=DRIVER_NAME, node=node, fence_namespace=INSTALL_NAMESPACE)
        await view.use(asking=source == "operator-answer")
        views.append(view)
        reads = PassClaimReads(view.fresh, view.held, max_age=30.0)  # the round is one pass: one read proved
        return lambda: asyncio.run_coroutine_threadsafe(reads.read(), loop).result(30)

    try:
        for round_no in range(6):
            node = f"race-{uuidlib.uuid4().hex[:6]}"
            list_claims = await claims_of(node)
            backend = AllocateAfterPlan(SimulatedHardware(node, parse_simulate_spec("1xH100-80GB")))
            gpu: GpuInfo = backend.inventory().gpus[0]
            two = NodeLayoutSpec(gpus=[mig(gpu.uuid, ("3g.40gb", 0), ("3g.40gb", 4))])
            first = await asyncio.to_thread(apply_layout, backend, two)
            published = build_status(first.inventory, two, first.plans, backend="simulated", agent_version="t",
                                     observed_generation=1)
            start = rng.choice([0, 4])
            device = f"gpu-0-mig-3g-40gb-{start}"
            name = f"held-{round_no}"
            create_claim(cluster, namespace, name)
            after_plan = rng.random() < 0.75
            if after_plan:
                backend.on_next_inventory = lambda n=name, nd=node, d=device: allocate(cluster, namespace, n, nd, d)
            else:
                await asyncio.to_thread(allocate, cluster, namespace, name, node, device)
            whole = NodeLayoutSpec(gpus=[mig(gpu.uuid, ("7g.80gb", 0))])
            guard = ClaimGuard(list_claims, driver=DRIVER_NAME, node=node, spec=whole, published=published)

            result = await asyncio.to_thread(apply_layout, backend, whole, guard=guard)

            when = "after" if after_plan else "before"
            where = f"round {round_no} (seed {SEED}): claim on {device}, allocated {when} the plan"
            left = [(i.profile, i.start) for i in backend.inventory().gpus[0].instances]
            assert ("3g.40gb", start) in left, f"{where}: the claimed instance was destroyed"
            refused = [(op.kind, op.start, b.reason) for op, b in result.refusals]
            assert refused == [(OpKind.DESTROY_INSTANCE, start, BlockReason.INSTANCE_IN_USE)], where
            assert f"ResourceClaim {namespace}/{name} is allocated device {device}" in result.refusals[0][1].message
            if start == 4:  # destroys run in slice order: the unclaimed 3g.40gb@0 went first
                assert ("3g.40gb", 0) not in left, f"{where}: the unclaimed instance was spared"
        for view in views:
            proved = view.asks if source == "operator-answer" else view.fences
            assert proved == 1, "the round's reads (two destroys when gpu-0 is claimed at 4) shared one proof"
            assert view.asks + view.fences == 1
            assert view.fallback_lists == 0, "no cluster-wide list by the agent"
        if source == "operator-answer":
            # The operator counts an answer once its write returns; the agent may read it off its
            # watch a moment before that.
            await wait_for(lambda: checks.answered >= 6, timeout=10, message="the operator to count its answers")
            assert checks.answered == 6, "one answer per round"
    finally:
        await checks.stop()
        for view in views:
            await view.stop()
        await api.close()


# -- the agent process ------------------------------------------------------------------------


@pytest.fixture
def agent(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Ready Node and its agent process (1 simulated H100, no kubelet plugin)."""
    cluster.apply(CRD, NAMESPACE_YAML)
    node = f"guard-{uuidlib.uuid4().hex[:8]}"
    cluster.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    state = tmp_path / "gpus.json"
    log_path = tmp_path / "agent.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "tessera.cli.agent",
                "--node-name", node, "--simulate", "1xH100-80GB", "--state-file", str(state),
                "--kubeconfig", str(cluster.kubeconfig), "--metrics-port", "-1", "--resync-seconds", "1",
                "--mps-root", str(tmp_path / "mps"), "--no-kubelet-plugin", "--log-json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield node, state
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        print(log_path.read_text()[-4000:])


def _layout(cluster: LocalCluster, node: str) -> dict[str, Any]:
    """The node's NodeLayout; {} until the agent has created it."""
    return get_or_none(cluster, "nodelayouts.tessera.dev", node) or {}


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})


def _set_spec(cluster: LocalCluster, node: str, gpus: list[dict[str, Any]]) -> int:
    out = cluster.kubectl("patch", "nodelayouts.tessera.dev", node, "--type", "merge", "-o", "json",
                          "-p", json.dumps({"spec": {"gpus": gpus}}))
    generation: int = json.loads(out.stdout)["metadata"]["generation"]
    return generation


async def test_the_agent_refuses_to_destroy_a_claimed_instance_and_names_the_claim(
    cluster: LocalCluster, namespace: str, agent: tuple[str, Path]
) -> None:
    node, state = agent
    await wait_for(lambda: _layout(cluster, node).get("status", {}).get("gpus"), timeout=60,
                   message="the agent's first status")
    gpu = _layout(cluster, node)["status"]["gpus"][0]["uuid"]
    generation = _set_spec(cluster, node, [{"uuid": gpu, "strategy": "MIG", "migInstances": [
        {"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]}])

    def settled(gen: int, reason: str) -> dict[str, Any] | None:
        obj = _layout(cluster, node)
        done = obj.get("status", {}).get("observedGeneration") == gen and _ready(obj).get("reason") == reason
        return obj if done else None

    await wait_for(lambda: settled(generation, "Applied"), timeout=30, message="two 3g.40gb instances")

    # The scheduler allocates 3g.40gb@4 to a claim; the next moment the spec asks for one 7g.
    create_claim(cluster, namespace, "vllm-0")
    allocate(cluster, namespace, "vllm-0", node, "gpu-0-mig-3g-40gb-4")
    generation = _set_spec(cluster, node, [{"uuid": gpu, "strategy": "MIG", "migInstances": [
        {"profile": "7g.80gb", "start": 0}]}])

    obj = await wait_for(lambda: settled(generation, "InstanceInUse"), timeout=30,
                         message="Ready=False InstanceInUse naming the claim")
    assert f"ResourceClaim {namespace}/vllm-0 is allocated device gpu-0-mig-3g-40gb-4" in _ready(obj)["message"]
    hw = SimulatedHardware.open(state)
    assert [(i.profile_id, i.start) for i in hw.snapshot().gpus[0].instances] == [(9, 4)], (
        "the unclaimed 3g.40gb@0 went, the claimed one stays"
    )

    # The claim is released (deleted): the agent finishes the layout.
    cluster.kubectl("delete", "resourceclaim", "vllm-0", "-n", namespace)
    obj = await wait_for(lambda: settled(generation, "Applied"), timeout=30, message="7g.80gb once the claim is gone")
    assert [(i["profile"], i["start"]) for i in obj["status"]["gpus"][0]["migInstances"]] == [("7g.80gb", 0)]


async def test_a_pass_that_repartitions_every_gpu_makes_three_requests_or_two_from_the_watch(
        cluster: LocalCluster) -> None:
    """The agent's own pass (``NodeAgent.reconcile_once``) turning two GPUs to MIG — two
    destroying operations — reads its NodeLayout, writes its fence once and its status once,
    over the version it read: the requests of a pass do not grow with the GPUs or the cluster.
    A pass its watch woke works from the NodeLayout the watch delivered: no read, two requests.
    One whose copy is older than the apiserver's (a newer spec not yet delivered) applies what
    it has, its status write conflicts and goes over a fresh read, reporting the generation it
    applied, so the newer one still asks for a pass."""
    cluster.apply(CRD, NAMESPACE_YAML)
    node = f"pass-{uuidlib.uuid4().hex[:8]}"
    cluster.add_node(node, labels={"nvidia.com/gpu.present": "true"})
    api = KubeClient.from_environment(str(cluster.kubeconfig))
    agent = NodeAgent(AgentConfig(node, metrics_port=None), SimulatedBackend.from_spec(node, "2xH100-80GB"), api)
    sent: list[tuple[str, str, int]] = []
    send = api._send

    async def counted(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        kind = path.rsplit("/", 3)[-3] if path.endswith("/status") else path.rsplit("/", 3)[-2]
        response = await send(method, path, *args, **kwargs)
        sent.append((method, kind, response.status))
        return response

    def mig(*profiles: tuple[str, int]) -> list[dict[str, Any]]:
        return [{"uuid": u, "strategy": "MIG", "migInstances": [{"profile": p, "start": s} for p, s in profiles]}
                for u in uuids]

    watch = ListWatch(api, GROUP, VERSION, PLURAL, agent.layout_seen,
                      field_selector=f"metadata.name={node}")
    try:
        assert await agent.reconcile_once() is not None  # makes the NodeLayout and its first status
        await agent.claims.ensure_fence()  # as NodeAgent.run does at start
        uuids = [g.uuid for g in agent.backend.inventory().gpus]
        _set_spec(cluster, node, mig(("7g.80gb", 0)))
        api._send = counted  # type: ignore[method-assign]
        status = await agent.reconcile_once()
        assert status is not None
        assert all(g.applied for g in status.gpus), status
        assert [method for method, _, _ in sent] == ["GET", "PATCH", "PUT"], sent
        assert agent.claims.fences == 1
        assert agent.metrics.registry.get_sample_value("tessera_agent_claim_checks_total") == 2, (
            "both GPUs' MIG mode changes were checked")

        watch.start()
        halves = _set_spec(cluster, node, mig(("3g.40gb", 0), ("3g.40gb", 4)))
        await wait_for(lambda: agent.wants_pass("MODIFIED", agent._seen or {}) and
                       (agent._seen or {}).get("metadata", {}).get("generation") == halves,
                       timeout=30, message="the watch delivers the new spec")
        sent.clear()
        status = await agent.reconcile_once(fresh=False)
        assert status is not None
        assert status.observed_generation == halves
        assert all(g.applied for g in status.gpus), status
        assert [method for method, _, _ in sent] == ["PATCH", "PUT"], f"no read of the NodeLayout: {sent}"

        await wait_for(lambda: (agent._seen or {}).get("status", {}).get("observedGeneration") == halves,
                       timeout=30, message="the status write's echo")
        quarters = _set_spec(cluster, node, mig(("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)))
        await wait_for(lambda: (agent._seen or {}).get("metadata", {}).get("generation") == quarters,
                       timeout=30, message="the watch delivers the next spec")
        await watch.stop()  # what the apiserver has next, this agent has not heard
        whole = _set_spec(cluster, node, mig(("7g.80gb", 0)))
        sent.clear()
        status = await agent.reconcile_once(fresh=False)
        assert status is not None
        assert status.observed_generation == quarters
        reads_and_writes = [(m, code) for m, _, code in sent if m in ("PUT", "GET")]
        assert reads_and_writes == [("PUT", 409), ("GET", 200), ("PUT", 200)], (
            f"the write over the old copy's version conflicts and goes over a fresh read: {sent}")
        written = json.loads(cluster.kubectl("get", f"{PLURAL}.{GROUP}", node, "-o", "json").stdout)
        assert written["metadata"]["generation"] == whole
        assert written["status"]["observedGeneration"] == quarters, "the status says what was applied"
        assert agent.wants_pass("MODIFIED", written), "and the newer spec still asks for a pass"
    finally:
        await watch.stop()
        await agent.claims.stop()
        await api.close()
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
