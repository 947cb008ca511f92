"""Typed, small wrappers over the API calls the operator makes: NodeLayouts, SharingPolicy
status, ResourceSlices, Pod evictions, Events, and the lists it primes from. Each takes and
returns plain dicts (what the API sent), through ``tessera.kube.http.KubeClient``.
Not for: deciding what to write, or counting writes (the controller's
``tessera_operator_api_writes_total`` does, where it makes them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tessera import API_GROUP, API_VERSION, RESOURCE_GROUP, RESOURCE_VERSION
from tessera.kube.http import ApiError, KubeClient, resource_path

POLICIES = (API_GROUP, API_VERSION, "sharingpolicies")
LAYOUTS = (API_GROUP, API_VERSION, "nodelayouts")
CLAIMS = (RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims")
SLICES = (RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")
DEVICE_CLASSES = (RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses")
NODES = ("", "v1", "nodes")


class Api:
    """The operator's view of the API server."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    # -- NodeLayouts and SharingPolicies ---------------------------------------------------

    async def patch_node_layout_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return await self.client.patch(resource_path(*LAYOUTS, name), {"spec": spec})

    async def remove_policy_finalizer(self, body: dict[str, Any], finalizer: str) -> None:
        """Take ``finalizer`` off a SharingPolicy, only from the version ``body`` is (409 otherwise)."""
        meta = body["metadata"]
        kept = [f for f in meta.get("finalizers") or [] if f != finalizer]
        patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
        await self.client.patch(resource_path(*POLICIES, meta["name"]), patch)

    async def patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        await self.client.patch(resource_path(*POLICIES, name, subresource="status"), {"status": status})

    # -- lists -----------------------------------------------------------------------------

    async def list_all(self, group: str, version: str, plural: str, label_selector: str = "",
                       field_selector: str = "") -> list[dict[str, Any]]:
        """Every object of a (cluster-wide) resource, page by page, as plain dicts that name
        their ``apiVersion`` and ``kind``."""
        return await self.client.list(resource_path(group, version, plural), label_selector=label_selector or None,
                                      field_selector=field_selector or None)

    async def list_slices(self, label_selector: str, node: str | None = None) -> list[dict[str, Any]]:
        """ResourceSlices by label; with ``node``, only that node's (``spec.nodeName``)."""
        return await self.list_all(*SLICES, label_selector, f"spec.nodeName={node}" if node else "")

    async def list_nodes(self) -> list[dict[str, Any]]:
        return await self.list_all(*NODES)

    # -- ResourceSlices --------------------------------------------------------------------

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.client.create(resource_path(*SLICES), body)

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.client.replace(resource_path(*SLICES, body["metadata"]["name"]), body)

    async def delete_slice(self, name: str, uid: str | None = None) -> None:
        """Delete a slice (only that incarnation of it when ``uid`` is given); gone already is fine."""
        options = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self.client.delete(resource_path(*SLICES, name), options)
        except ApiError as exc:
            if exc.status != 404:
                raise

    # -- Events ----------------------------------------------------------------------------

    async def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about ``body`` (cluster-scoped objects' events live in ``default``)."""
        meta = body.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "name": meta.get("name"),
                    "uid": meta.get("uid"), "namespace": meta.get("namespace")}
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'tessera')}.", "namespace": namespace},
            "involvedObject": {k: v for k, v in involved.items() if v is not None},
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "tessera-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "tessera.dev/operator",
            "reportingInstance": "tessera-operator",
        }
        await self.client.create(resource_path("", "v1", "events", namespace=namespace), event)

    # -- Pods ------------------------------------------------------------------------------

    async def evict_pod(self, namespace: str, name: str) -> bool:
        """Ask for an eviction (PodDisruptionBudgets apply); False when a budget refused it."""
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": name, "namespace": namespace}}
        try:
            await self.client.create(
                resource_path("", "v1", "pods", name, namespace=namespace, subresource="eviction"), eviction
            )
        except ApiError as exc:
            if exc.status == 404:
                return True
            if exc.status == 429:
                return False
            raise
        return True
