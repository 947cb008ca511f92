"""Packing where the scheduler chooses, on the real kube-scheduler: the order Tessera publishes
DynamicMIG placements in makes the allocator's first fit put small instances where they
fragment least, on the GPU already in use, so a 4g still fits beside three 1g instances and a
whole-GPU 7g still finds the second GPU whole. In name order the 1g instances would take
memory slices 0-2, the 4g would move to the second GPU and the 7g would find no room."""

from __future__ import annotations

import pytest

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcesses
from tests.integration.kube_helpers import (
    DRIVER,
    allocated_devices,
    apply,
    claim_template,
    gpu_node,
    on_node,
    pod_with_claim,
    policy,
    wait_devices,
)

pytestmark = pytest.mark.integration


def _profile(name: str) -> str:
    return f'device.attributes["{DRIVER}"].migProfile == "{name}"'


async def test_small_instances_pack_onto_one_gpu_and_large_requests_still_fit(
    cluster: LocalCluster, tessera: TesseraProcesses, namespace: str
) -> None:
    node = "pack-a"
    gpu_node(cluster, tessera, node, "pack", "2xH100-80GB")
    apply(cluster, policy("pack", "pack", {"strategy": "DynamicMIG"}))
    await wait_devices(cluster, node, lambda d: {"gpu-0-dyn-7g-80gb-0", "gpu-1-dyn-7g-80gb-0"} <= set(d),
                       "DynamicMIG placements on both GPUs")
    for profile in ("1g.10gb", "4g.40gb", "7g.80gb"):
        slug = profile.split(".")[0]
        apply(cluster, claim_template(f"dyn-{slug}", namespace, "mig.tessera.dev", cel=_profile(profile)))

    # One Pod at a time, so each allocation sees the ones before it (as a stream of arrivals does).
    placed: dict[str, str] = {}
    for pod, template in (("small-0", "dyn-1g"), ("small-1", "dyn-1g"), ("small-2", "dyn-1g"),
                          ("medium", "dyn-4g"), ("whole", "dyn-7g")):
        apply(cluster, pod_with_claim(pod, namespace, template, on_node(node)))
        results = await wait_for(lambda pod=pod: allocated_devices(cluster, namespace, pod), timeout=60,
                                 message=f"{pod}'s claim allocated")
        placed[pod] = str(results[0]["device"])

    assert [placed[f"small-{i}"] for i in range(3)] == [
        "gpu-0-dyn-1g-10gb-6", "gpu-0-dyn-1g-10gb-5", "gpu-0-dyn-1g-10gb-4"
    ], "the 1g instances share the first GPU, from its top slice down"
    assert placed["medium"] == "gpu-0-dyn-4g-40gb-0", "the 4g fits beside them on the same GPU"
    assert placed["whole"] == "gpu-1-dyn-7g-80gb-0", "the second GPU stayed whole for the 7g"
