"""The few API calls for NodeLayout objects (``tessera.dev/v1alpha1``, cluster-scoped).

Get, create (owned by its Node, so it goes with the Node), write status through the status
subresource with optimistic concurrency and conflict retry (``CONFLICT_BACKOFF``). Watching
one by name is ``tessera.kube.watch.ListWatch`` with a field selector.
Used by the node agent; the operator may reuse them. Not for: deciding what a layout or a
status says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tessera.kube.http import CONFLICT_BACKOFF, ApiError, KubeClient, resource_path, retry_delay

GROUP = "tessera.dev"
VERSION = "v1alpha1"
PLURAL = "nodelayouts"
KIND = "NodeLayout"


class StatusConflictError(Exception):
    """The status could not be written: the object kept changing under us."""


async def get_node_layout(api: KubeClient, name: str) -> dict[str, Any] | None:
    """The NodeLayout called ``name`` as the API returns it, or None when there is none."""
    try:
        return await api.get(resource_path(GROUP, VERSION, PLURAL, name))
    except ApiError as e:
        if e.status == 404:
            return None
        raise


async def get_node(api: KubeClient, name: str) -> dict[str, Any] | None:
    """The Node as the API returns it, or None."""
    try:
        return await api.get(resource_path("", "v1", "nodes", name))
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def node_layout_manifest(node_name: str, node_uid: str) -> dict[str, Any]:
    """An empty NodeLayout for a node, owned by that Node."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": node_name,
            "labels": {"app.kubernetes.io/managed-by": "tessera"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "blockOwnerDeletion": False}
            ],
        },
        "spec": {"gpus": []},
    }


async def ensure_node_layout(api: KubeClient, node_name: str) -> dict[str, Any]:
    """The node's NodeLayout; created (owned by the Node) when missing. Raises LookupError when
    the Node itself does not exist, since an object without its owner would be collected."""
    existing = await get_node_layout(api, node_name)
    if existing is not None:
        return existing
    node = await get_node(api, node_name)
    if node is None:
        raise LookupError(f"Node {node_name!r} does not exist; start the agent with the node's own name")
    try:
        return await api.create(
            resource_path(GROUP, VERSION, PLURAL), node_layout_manifest(node_name, node["metadata"]["uid"])
        )
    except ApiError as e:
        if e.status != 409:
            raise
        again = await get_node_layout(api, node_name)  # somebody else created it meanwhile
        if again is None:
            raise
        return again


async def write_node_layout_status(
    api: KubeClient, name: str, status: dict[str, Any], attempts: int = 5, read: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Replace ``status`` through the status subresource, over the resourceVersion of ``read``
    (the NodeLayout as the caller last read it; read here when not given), and on a conflict
    (409: it changed since) reads again and retries, up to ``attempts`` times."""
    for attempt in range(attempts):
        current = read if attempt == 0 and read is not None else await get_node_layout(api, name)
        if current is None:
            raise LookupError(f"NodeLayout {name!r} is gone")
        body = {
            "apiVersion": current["apiVersion"],
            "kind": current["kind"],
            "metadata": {"name": name, "resourceVersion": current["metadata"]["resourceVersion"]},
            "status": status,
        }
        try:
            return await api.replace(resource_path(GROUP, VERSION, PLURAL, name, subresource="status"), body)
        except ApiError as e:
            if e.status != 409:
                raise
            if attempt or read is None:  # the caller's read may just be old: read again at once
                await asyncio.sleep(retry_delay(attempt, CONFLICT_BACKOFF))
    raise StatusConflictError(f"NodeLayout {name!r}: status kept conflicting after {attempts} attempts")

