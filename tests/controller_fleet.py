"""Builders for the operator's controller tests: the raw objects watch events carry (Nodes,
NodeLayouts, SharingPolicies, ResourceClaims) and a Fleet fed with them, the way the
handlers feed it. Plain values; no API server. Not a test module itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tessera import DRIVER_NAME
from tessera.controller.state import Fleet
from tessera.models.catalog import model_by_key
from tessera.models.layout import GpuLayout, GpuStatus, MigInstanceStatus, PlacedInstance
from tessera.models.policy import Strategy

NODE = "node-1"


def node_body(name: str = NODE, labels: dict[str, str] | None = None, uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": dict(labels or {})}}


def policy_body(name: str, generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "SharingPolicy",
        "metadata": {"name": name, "generation": generation},
        "spec": spec,
    }


def layout_body(
    gpus: Sequence[GpuStatus],
    spec: Iterable[GpuLayout] = (),
    *,
    node: str = NODE,
    generation: int = 1,
    observed_generation: int | None = 1,
) -> dict[str, Any]:
    """A NodeLayout as the API returns it: the operator's spec, the agent's status."""
    status: dict[str, Any] = {"gpus": [g.to_kube() for g in gpus]}
    if observed_generation is not None:
        status["observedGeneration"] = observed_generation
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "NodeLayout",
        "metadata": {"name": node, "generation": generation},
        "spec": {"gpus": [g.to_kube() for g in spec], "claimCheck": "Operator"},
        "status": status,
    }


def claim_body(
    name: str,
    devices: Iterable[str | tuple[str, str]] = (),
    *,
    namespace: str = "default",
    pods: Iterable[str] = (),
    driver: str = DRIVER_NAME,
) -> dict[str, Any]:
    """A ResourceClaim allocated ``devices`` (names on NODE, or (pool, name)) of ``driver``,
    reserved for ``pods``; with no devices, a claim the scheduler has not allocated yet."""
    results = [
        {"request": "gpu", "driver": driver, "pool": d[0], "device": d[1]}
        if isinstance(d, tuple)
        else {"request": "gpu", "driver": driver, "pool": NODE, "device": d}
        for d in devices
    ]
    status: dict[str, Any] = {}
    if results:
        status["allocation"] = {"devices": {"results": results}}
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {}, "status": status}


def layout_of(gpu: GpuStatus, policy: str | None = None) -> GpuLayout:
    """The spec entry that asks for exactly what ``gpu`` has now."""
    return GpuLayout(
        uuid=gpu.uuid,
        policy=policy,
        strategy=gpu.strategy,
        mig_instances=[PlacedInstance(profile=i.profile, start=i.start) for i in gpu.mig_instances if not i.dynamic],
        mig_sharing=gpu.mig_sharing,
        time_slicing=gpu.time_slicing,
        mps=gpu.mps,
    )


def applied(gpu: GpuStatus, layout: GpuLayout) -> GpuStatus:
    """``gpu`` as its agent reports it once ``layout`` is applied (idle MIG instances made anew)."""
    instances: list[MigInstanceStatus] = []
    if layout.strategy is Strategy.MIG:
        model = model_by_key(gpu.model or "")
        for n, placed in enumerate(layout.mig_instances, start=1):
            profile = model.profile(placed.profile)
            instances.append(
                MigInstanceStatus(
                    profile=placed.profile,
                    start=placed.start,
                    size=profile.memory_slices,
                    uuid=f"MIG-{gpu.index:04d}-{n:04d}",
                    gpu_instance_id=n,
                    memory_mib=profile.memory_mib,
                    multiprocessors=profile.multiprocessors,
                )
            )
    return gpu.model_copy(
        update={
            "strategy": layout.strategy,
            "policy": layout.policy,
            "mig_mode_current": layout.strategy in (Strategy.MIG, Strategy.DYNAMIC_MIG),
            "mig_instances": instances,
            "mig_sharing": layout.mig_sharing,
            "time_slicing": layout.time_slicing,
            "mps": layout.mps,
            "applied": True,
        }
    )


def fleet_of(
    gpus: Sequence[GpuStatus],
    spec: Iterable[GpuLayout] = (),
    *,
    policies: Iterable[dict[str, Any]] = (),
    claims: Iterable[dict[str, Any]] = (),
    labels: dict[str, str] | None = None,
    generation: int = 1,
    observed_generation: int | None = 1,
) -> Fleet:
    """A Fleet with one node (NODE) whose agent reports ``gpus`` and whose spec is ``spec``."""
    fleet = Fleet()
    for body in policies:
        fleet.set_policy(body)
    fleet.set_node(node_body(labels=labels))
    fleet.set_layout(layout_body(gpus, spec, generation=generation, observed_generation=observed_generation))
    for body in claims:
        fleet.set_claim(body)
    return fleet
