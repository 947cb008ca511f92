"""The handover under real races: a SharingPolicy and a ResourceClaim applied together, with
random timing, against the real kube-scheduler, operator and agent. Whichever wins, the
claim must end on a device that exists; and GPUs no policy selects are never changed.

The seed is printed and can be set (``TESSERA_RACE_SEED``) so a failure replays its timing."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tessera import INSTALL_NAMESPACE
from tessera.agent.backends.simulated import SimulatedHardware, parse_simulate_spec
from tessera.agent.claimview import fence_claim_name
from tessera.controller.decide import published_device_names
from tessera.kube.claims import ANSWER_ANNOTATION, ASK_ANNOTATION
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tessera.models.claimcheck import ClaimCheckAnswer
from tessera.models.layout import NodeLayout
from tests.integration.kube_helpers import (
    DRIVER,
    allocated_devices,
    apply,
    claim_template,
    condition,
    delete_pod_now,
    get,
    get_or_none,
    gpu_node,
    mig_profiles,
    node_devices,
    on_node,
    pod_with_claim,
    policy,
    wait_devices,
    wait_policy,
)

ROOT = Path(__file__).resolve().parents[2]  # so the operator's Python finds tests.integration.lagging_operator

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("TESSERA_RACE_SEED", "20261202"))
ROUNDS = 20
MIG_ALL_1G: dict[str, Any] = {"strategy": "MIG", "mig": {"preset": "all-1g"}}
WHOLE: dict[str, Any] = {"strategy": "Exclusive"}


def agent_devices(cluster: LocalCluster, node: str) -> frozenset[str]:
    """The devices the node's agent says exist now (what its NodeLayout.status describes)."""
    body = get(cluster, "nodelayout", node)
    layout = NodeLayout.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status")})
    gpus = layout.status.gpus if layout.status is not None else []
    return frozenset().union(*(published_device_names(g) for g in gpus))


def claim_device(cluster: LocalCluster, namespace: str, pod: str, node: str) -> str | None:
    """The device the Pod's claim was allocated, checked against the agent: an allocated
    device that the agent no longer has is the failure this module exists to catch."""
    results = allocated_devices(cluster, namespace, pod)
    if not results:
        return None
    device = str(results[0]["device"])
    exists = agent_devices(cluster, node)
    if device not in exists:
        raise AssertionError(f"{namespace}/{pod}'s claim holds {device}; the agent has only {sorted(exists)}")
    return device


async def apply_together(
    cluster: LocalCluster, rng: random.Random, first: dict[str, Any], second: dict[str, Any]
) -> None:
    """Apply two objects with a random gap (0-300 ms), in a random order."""
    a, b = (first, second) if rng.random() < 0.5 else (second, first)
    apply(cluster, a)
    await asyncio.sleep(rng.uniform(0.0, 0.3))
    apply(cluster, b)


async def test_a_policy_and_a_claim_applied_together_leave_the_claim_on_a_device_that_exists(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    rng = random.Random(SEED)
    print(f"TESSERA_RACE_SEED={SEED}")
    # The operator's claim watch lags the scheduler by a second, as a loaded cluster's can:
    # the handover must hold by its own fresh read of the claims, not by a prompt watch.
    for process in [p for p in tessera.processes if p.name == "operator"]:
        process.stop()
        tessera.processes.remove(process)
    tessera.operator("operator", env={"TESSERA_CLAIM_EVENT_LAG": "1.0", "PYTHONPATH": str(ROOT)},
                     module="tests.integration.lagging_operator")
    node = "race-a"
    gpu_node(cluster, tessera, node, "race", "1xH100-80GB")
    await wait_devices(cluster, node, lambda d: "gpu-0" in d, "the unmanaged whole GPU to be published")
    apply(cluster, claim_template("any", namespace, "gpu.tessera.dev"))
    outcomes: Counter[str] = Counter()
    layouts = [("MIG all-1g", MIG_ALL_1G), ("whole", WHOLE)]
    for round_ in range(ROUNDS):
        name, spec = layouts[round_ % 2]
        pod = f"race-{round_}"
        await apply_together(
            cluster, rng, policy("race", "race", spec), pod_with_claim(pod, namespace, "any", on_node(node))
        )

        def settled(pod: str = pod) -> str | None:
            """The claim's device once the operator has either applied the new layout under it
            or is draining the GPU for it; every look also checks the device still exists."""
            device = claim_device(cluster, namespace, pod, node)
            if device is None:
                return None
            body = get_or_none(cluster, "sharingpolicy", "race")
            if body is None or body.get("status", {}).get("observedGeneration") != body["metadata"]["generation"]:
                return None  # what the status says is about the layout before this round
            ready, progressing = condition(body, "Ready"), condition(body, "Progressing")
            if ready is not None and ready["status"] == "True":
                return device
            if progressing is not None and progressing["reason"] == "Draining":
                return device
            return None

        device = await wait_for(settled, timeout=90, message=f"round {round_}: the claim to settle ({name})")
        draining = condition(get(cluster, "sharingpolicy", "race"), "Progressing")
        drained = draining is not None and draining["reason"] == "Draining"
        outcomes["drained: the claim won" if drained else "applied: the policy won"] += 1
        assert device in node_devices(cluster, node), "the claim's device is still published"
        delete_pod_now(cluster, namespace, pod)
        await wait_for(
            lambda pod=pod: get_or_none(cluster, "pod", pod, "-n", namespace) is None, timeout=60, message="Pod gone"
        )
        try:
            await wait_policy(cluster, "race", "Ready", "True", timeout=90)
        except TimeoutError:
            print(json.dumps(get(cluster, "sharingpolicy", "race").get("status"), indent=1))
            print(json.dumps(get(cluster, "resourceclaims", "-n", namespace)["items"], indent=1)[:6000])
            print(json.dumps(get(cluster, "nodelayout", node), indent=1)[:6000])
            raise
    print(f"{ROUNDS} rounds, seed {SEED}: {dict(outcomes)}")
    assert sum(outcomes.values()) == ROUNDS, "every round's claim ended on a device that exists"
    # The agent checked claims by asking the operator (its spec says claimCheck: Operator), and
    # the operator answered its last ask: the agent watches no claim but its fence claim.
    assert get(cluster, "nodelayout", node)["spec"]["claimCheck"] == "Operator"
    notes = get(cluster, "resourceclaim", fence_claim_name(node), "-n", INSTALL_NAMESPACE)["metadata"]["annotations"]
    answer = ClaimCheckAnswer.decode(notes[ANSWER_ANNOTATION])
    assert answer.token == notes[ASK_ANNOTATION], "the operator answered the agent's last ask"
    assert answer.node == node


async def test_a_gpu_partitioned_before_tessera_is_published_as_it_is_and_never_changed(
    cluster: LocalCluster, tessera: TesseraProcesses
) -> None:
    node = "preexisting-a"
    hardware = SimulatedHardware(
        node, parse_simulate_spec("2xH100-80GB"), tessera.node_folder(node) / "simulated-gpus.json"
    )
    three_g = hardware.snapshot().gpus[0].catalog.profile("3g.40gb")
    hardware.set_mig_mode(0, True)
    instance = hardware.create_gpu_instance(0, three_g.shape.profile_id, 4)
    hardware.create_compute_instance(0, instance)
    gpu_node(cluster, tessera, node, "preexisting", "2xH100-80GB")

    devices = await wait_devices(
        cluster, node, lambda d: d if {"gpu-0-mig-3g-40gb-4", "gpu-1"} <= set(d) else None, "the GPUs as they are"
    )
    assert {n: d["attributes"]["managed"]["bool"] for n, d in devices.items()} == {
        "gpu-0-mig-3g-40gb-4": False,
        "gpu-1": False,
    }
    assert get(cluster, "nodelayout", node)["spec"].get("gpus", []) == [], "nothing asked of the agent"

    # A policy for GPU 1 only takes it over; GPU 0 keeps its hand-made instance.
    only_gpu_1 = {**MIG_ALL_1G, "gpuSelector": {"cel": f'device.attributes["{DRIVER}"].index == 1'}}
    apply(cluster, policy("preexisting", "preexisting", only_gpu_1))
    await wait_devices(
        cluster, node, lambda d: [n for n in d if n.startswith("gpu-1-mig-1g")], "GPU 1 cut into 1g partitions"
    )
    await wait_policy(cluster, "preexisting", "Ready", "True", gpus=1)
    devices = node_devices(cluster, node)
    assert devices["gpu-0-mig-3g-40gb-4"]["attributes"]["managed"]["bool"] is False
    assert all(d["attributes"]["managed"]["bool"] for n, d in devices.items() if n.startswith("gpu-1-"))

    # Deleting the policy leaves GPU 1's layout in place, unmanaged.
    cluster.kubectl("delete", "sharingpolicy", "preexisting")

    def unmanaged_again(d: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
        gpu_1 = [x for n, x in d.items() if n.startswith("gpu-1-")]
        return d if gpu_1 and not any(x["attributes"]["managed"]["bool"] for x in gpu_1) else None

    devices = await wait_devices(cluster, node, unmanaged_again, "GPU 1 to be published as unmanaged")
    assert mig_profiles({n: d for n, d in devices.items() if n.startswith("gpu-1-")}) == ["1g.10gb"] * 7
    state = hardware.snapshot()
    assert [(i.start, i.profile_id) for i in state.gpus[0].instances] == [(4, three_g.shape.profile_id)]
    assert len(state.gpus[1].instances) == 7, "the deleted policy's layout stays on the GPU"
