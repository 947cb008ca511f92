"""The node agent's reads of ResourceClaims (``resource.k8s.io/v1``), fresh from the API as raw
JSON (no model round trip, so allocation fields newer than any client library come through).

``list_resource_claims`` lists every claim in every namespace, page by page. It asks for no
``resourceVersion``, so the apiserver answers from etcd with a quorum read: an allocation the
scheduler wrote before the call started is in the answer. The agent calls it right before it
destroys a device, to refuse destroying one a claim is allocated. ``read_resource_claim``
reads the one claim the kubelet asks the plugin to prepare.
Not for: watching claims, or deciding anything about them (``tessera.agent.claimguard``,
``tessera.agent.plugin.claims``).
"""

from __future__ import annotations

from typing import Any

from tessera import RESOURCE_GROUP, RESOURCE_VERSION
from tessera.kube.http import ApiError, KubeClient, resource_path


class ClaimListError(Exception):
    """The API answered the list with an error (e.g. 403: the agent's RBAC lacks ``list``)."""


async def list_resource_claims(api: KubeClient, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every ResourceClaim of the cluster as the API sent it (consistent read, 500 per page).
    Raises ``ClaimListError`` when the API refuses, and the transport's error (aiohttp,
    ``TimeoutError``) when it cannot be reached; callers treat both as "cannot tell" and
    change nothing."""
    try:
        return await api.list(resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims"),
                                  page_size=500, timeout_s=timeout_s)
    except ApiError as error:
        raise ClaimListError(f"listing ResourceClaims failed: {error}") from None


async def read_resource_claim(api: KubeClient, namespace: str, name: str,
                              timeout_s: float = 20.0) -> dict[str, Any] | None:
    """The claim as the API sent it, or None when it does not exist. Other API errors raise
    ``ApiError``."""
    try:
        return await api.get(resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", name,
                                           namespace=namespace), timeout_s=timeout_s)
    except ApiError as error:
        if error.status == 404:
            return None
        raise
