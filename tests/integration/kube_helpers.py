"""Small helpers the integration tests share: JSON from kubectl, apply lists, claims, Pods."""

from __future__ import annotations

import json
from typing import Any

from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for
from tessera.localcluster.processes import TesseraProcess, TesseraProcesses
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim

__all__ = ["claim_template", "on_node", "pod_with_claim"]

DRIVER = "gpu.tessera.dev"


def get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return cluster.get_json(*args)


def get_or_none(cluster: LocalCluster, *args: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "-o", "json", *args, check=False)
    if proc.returncode != 0:
        return None
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    cluster.apply_objects(list(objects))


def claim_of(cluster: LocalCluster, namespace: str, pod_name: str) -> dict[str, Any] | None:
    status = get(cluster, "pod", pod_name, "-n", namespace).get("status", {})
    names = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses", [])]
    if not names or not names[0]:
        return None
    return get_or_none(cluster, "resourceclaim", names[0], "-n", namespace)


def allocation(cluster: LocalCluster, namespace: str, pod_name: str) -> dict[str, Any] | None:
    claim = claim_of(cluster, namespace, pod_name)
    if claim is None:
        return None
    result: dict[str, Any] | None = claim.get("status", {}).get("allocation")
    return result


def allocated_devices(cluster: LocalCluster, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    alloc = allocation(cluster, namespace, pod_name)
    return list(alloc["devices"]["results"]) if alloc else []


def unschedulable(cluster: LocalCluster, namespace: str, pod_name: str) -> bool:
    conditions = get(cluster, "pod", pod_name, "-n", namespace).get("status", {}).get("conditions", [])
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def decided(cluster: LocalCluster, namespace: str, *pod_names: str) -> bool:
    """Every Pod's claim is allocated, or the scheduler has said it cannot be."""
    return all(allocation(cluster, namespace, p) is not None or unschedulable(cluster, namespace, p) for p in pod_names)


def node_slices(cluster: LocalCluster, node: str) -> list[dict[str, Any]]:
    items = get(cluster, "resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    return sorted((s for s in items if s["spec"]["driver"] == DRIVER), key=lambda s: str(s["metadata"]["name"]))


def node_devices(cluster: LocalCluster, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in node_slices(cluster, node) for d in s["spec"].get("devices") or []}


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    if obj is None:
        return None
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), None)


def delete_pod_now(cluster: LocalCluster, namespace: str, pod_name: str) -> None:
    """There is no kubelet to finish a graceful delete: remove the Pod at once."""
    cluster.kubectl("delete", "pod", pod_name, "-n", namespace, "--grace-period=0", "--force", "--wait=false")


def policy(name: str, label: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A SharingPolicy selecting the nodes labelled ``tessera.dev/test=<label>``."""
    return {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "SharingPolicy",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"tessera.dev/test": label}}, **spec},
    }


def gpu_node(cluster: LocalCluster, tessera: TesseraProcesses, name: str, label: str, simulate: str) -> TesseraProcess:
    """A kubelet-less Node labelled for ``policy(..., label, ...)`` with a simulated agent."""
    cluster.add_node(name, labels={"tessera.dev/test": label})
    return tessera.agent(name, simulate)


async def wait_devices(cluster: LocalCluster, node: str, predicate: Any, what: str, timeout: float = 60) -> Any:
    return await wait_for(lambda: predicate(node_devices(cluster, node)), timeout=timeout, message=what)


async def wait_policy(
    cluster: LocalCluster, name: str, type_: str, status: str, timeout: float = 60, **counts: int
) -> dict[str, Any]:
    """Wait until the policy's condition ``type_`` has ``status`` and its status counts match."""

    def ready() -> dict[str, Any] | None:
        body = get_or_none(cluster, "sharingpolicy", name)
        c = condition(body, type_)
        if body is None or c is None or c["status"] != status:
            return None
        return body if all(body["status"].get(k) == v for k, v in counts.items()) else None

    result: dict[str, Any] = await wait_for(ready, timeout=timeout, message=f"{name} {type_}={status} {counts}")
    return result


def mig_profiles(devices: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(
        d["attributes"]["migProfile"]["string"] for d in devices.values() if "migProfile" in d.get("attributes", {})
    )
