"""The node agent's one read of ResourceClaims: every claim in the cluster, fresh from the API.

``list_resource_claims`` is the only call; it lists ``resource.k8s.io/v1`` ResourceClaims in
every namespace, page by page, as raw JSON (no model round trip, so allocation fields newer
than the client library come through). It asks for no ``resourceVersion``, so the apiserver
answers from etcd with a quorum read: an allocation the scheduler wrote before the call
started is in the answer. The agent calls it right before it destroys a device, to refuse
destroying one a claim is allocated.
Not for: watching claims, or deciding anything about them (``tessera.agent.claimguard``).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client


class ClaimListError(Exception):
    """The API answered the list with an error (e.g. 403: the agent's RBAC lacks ``list``)."""


async def list_resource_claims(api_client: client.ApiClient, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every ResourceClaim of the cluster as the API sent it (consistent read, 500 per page).
    Raises ``ClaimListError`` when the API refuses, and the transport's error (aiohttp,
    ``TimeoutError``) when it cannot be reached; callers treat both as "cannot tell" and
    change nothing."""
    api = client.ResourceV1Api(api_client)
    out: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": 500, "_preload_content": False, "_request_timeout": timeout_s}
        if token:
            kwargs["_continue"] = token
        response: Any = await api.list_resource_claim_for_all_namespaces(**kwargs)
        try:
            body = await response.read()
            if not 200 <= response.status <= 299:
                raise ClaimListError(
                    f"listing ResourceClaims failed: HTTP {response.status} {body[:300].decode(errors='replace')}"
                )
        finally:
            response.release()
        page: dict[str, Any] = json.loads(body)
        out.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return out
