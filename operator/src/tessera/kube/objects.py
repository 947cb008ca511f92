"""Typed, small wrappers over the API calls the operator makes: NodeLayouts, SharingPolicy
status, ResourceSlices, Pod evictions. Each returns plain dicts (what the API sent) and
counts its writes, so benchmarks and tests can prove "nothing new, nothing written".
Not for: deciding what to write.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tessera import API_GROUP, API_VERSION

MERGE_PATCH = "application/merge-patch+json"
_AS_MERGE_PATCH: dict[str, Any] = {"_content_type": MERGE_PATCH}  # the client would pick a JSON patch
RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"
POLICIES = (API_GROUP, API_VERSION, "sharingpolicies")
LAYOUTS = (API_GROUP, API_VERSION, "nodelayouts")
CLAIMS = (RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims")
SLICES = (RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")


class Api:
    """The operator's view of the API server, with a tally of every write it made."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.writes: Counter[str] = Counter()

    def _count(self, what: str) -> None:
        self.writes[what] += 1

    # -- NodeLayouts and SharingPolicies ---------------------------------------------------

    async def patch_node_layout_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        self._count("nodelayout/spec")
        body: dict[str, Any] = await self.custom.patch_cluster_custom_object(
            API_GROUP, API_VERSION, "nodelayouts", name, {"spec": spec}, **_AS_MERGE_PATCH
        )
        return body

    async def patch_policy_status(self, name: str, status: dict[str, Any]) -> None:
        self._count("sharingpolicy/status")
        await self.custom.patch_cluster_custom_object_status(
            API_GROUP, API_VERSION, "sharingpolicies", name, {"status": status}, **_AS_MERGE_PATCH
        )

    # -- ResourceSlices --------------------------------------------------------------------

    async def list_slices(self, label_selector: str) -> list[dict[str, Any]]:
        return await self.list_all(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", label_selector)

    async def list_all(self, group: str, version: str, plural: str, label_selector: str = "") -> list[dict[str, Any]]:
        """Every object of a (cluster-wide) resource, page by page, as plain dicts."""
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500}
            if label_selector:
                kwargs["label_selector"] = label_selector
            if token:
                kwargs["_continue"] = token
            page = await self.custom.list_cluster_custom_object(group, version, plural, **kwargs)
            kind = page.get("kind", "").removesuffix("List")
            for item in page.get("items", []):
                item.setdefault("apiVersion", page.get("apiVersion", f"{group}/{version}"))
                item.setdefault("kind", kind)
                out.append(item)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return out

    async def list_nodes(self) -> list[dict[str, Any]]:
        response: Any = await self.core.list_node(_preload_content=False)  # raw: skip model conversion
        items: list[dict[str, Any]] = json.loads(await response.read()).get("items", [])
        return items

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self._count("resourceslice/create")
        created: dict[str, Any] = await self.custom.create_cluster_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", body
        )
        return created

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self._count("resourceslice/update")
        replaced: dict[str, Any] = await self.custom.replace_cluster_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", body["metadata"]["name"], body
        )
        return replaced

    async def delete_slice(self, name: str, uid: str | None = None) -> None:
        self._count("resourceslice/delete")
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid) if uid else None)
        try:
            await self.custom.delete_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", name, body=options
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # -- Events ----------------------------------------------------------------------------

    async def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about ``body`` (cluster-scoped objects' events live in ``default``)."""
        self._count("event")
        meta = body.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name', 'tessera')}.", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version=body.get("apiVersion"), kind=body.get("kind"), name=meta.get("name"),
                uid=meta.get("uid"), namespace=meta.get("namespace"),
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            source=client.V1EventSource(component="tessera-operator"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component="tessera.dev/operator",
            reporting_instance="tessera-operator",
        )
        await self.core.create_namespaced_event(namespace, event)

    # -- Pods ------------------------------------------------------------------------------

    async def evict_pod(self, namespace: str, name: str) -> bool:
        """Ask for an eviction (PodDisruptionBudgets apply); False when a budget refused it."""
        self._count("pod/eviction")
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            await self.core.create_namespaced_pod_eviction(name, namespace, body)
        except ApiException as exc:
            if exc.status == 404:
                return True
            if exc.status == 429:
                return False
            raise
        return True

    async def list_node_names(self) -> set[str]:
        nodes = await self.core.list_node()
        return {n.metadata.name for n in nodes.items}
