"""The node agent's reads of ResourceClaims (``resource.k8s.io/v1``), fresh from the API as raw
JSON (no model round trip, so allocation fields newer than any client library come through).

``list_resource_claims`` lists every claim in every namespace, page by page. It asks for no
``resourceVersion``, so the apiserver answers from etcd with a quorum read: an allocation the
scheduler wrote before the call started is in the answer. The agent calls it right before it
destroys a device, to refuse destroying one a claim is allocated. ``read_resource_claim``
reads the one claim the kubelet asks the plugin to prepare. ``write_claim_fence`` marks the
agent's fence claim (``tessera.agent.claimview``): a write into the stream of ResourceClaim
events whose echo proves that a watch has passed on every claim change made before it; or,
with ``ASK_ANNOTATION``, the agent's question to the operator, which writes its answer on the
same claim (``write_claim_check_answer``; ``tessera.controller.claimchecks``).
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


FENCE_ANNOTATION = "tessera.dev/fence"  # a token the agent waits to see on its own claim watch
ASK_ANNOTATION = "tessera.dev/claim-check"  # a token the operator answers (the agent watches no claims)
ANSWER_ANNOTATION = "tessera.dev/claim-check-answer"  # the operator's answer (tessera.models.claimcheck)
NODE_ANNOTATION = "tessera.dev/node"  # the node whose agent owns the fence claim
# On every fence claim: the operator's fresh reads of claims leave them out by it (one a node,
# they hold nothing; manifests/admission.yaml keeps it off any claim that requests a device).
FENCE_LABEL = "tessera.dev/fence-claim"
NOT_FENCE_CLAIMS = f"!{FENCE_LABEL}"  # the label selector of every claim but the fence claims
FENCE_PREFIX = "tessera-fence-"  # every fence claim's name begins so (tessera.agent.claimview.fence_claim_name)


async def write_claim_fence(api: KubeClient, namespace: str, name: str, token: str, *, node: str,
                            key: str = FENCE_ANNOTATION, timeout_s: float = 10.0) -> None:
    """Set ``token`` under ``key`` on ``node``'s fence claim ``namespace/name``, creating it on
    first use (a claim that requests no device: nothing ever allocates it). ``ApiError`` on any
    other failure (e.g. 404 when the namespace does not exist)."""
    annotations = {key: token, NODE_ANNOTATION: node}
    labels = {"app.kubernetes.io/managed-by": "tessera", FENCE_LABEL: "true"}
    path = resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", name, namespace=namespace)
    try:
        # The labels too: a claim made by an older agent gets them with its next write.
        await api.patch(path, {"metadata": {"annotations": annotations, "labels": labels}}, timeout_s=timeout_s)
        return
    except ApiError as error:
        if error.status != 404:
            raise
    body = {"apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations, "labels": labels},
            "spec": {"devices": {}}}
    await api.create(resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", namespace=namespace),
                     body, timeout_s=timeout_s)


async def write_claim_check_answer(api: KubeClient, namespace: str, name: str, answer: str,
                                   timeout_s: float = 10.0) -> None:
    """Set the operator's ``answer`` (``ANSWER_ANNOTATION``) on the fence claim ``namespace/name``."""
    path = resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", name, namespace=namespace)
    await api.patch(path, {"metadata": {"annotations": {ANSWER_ANNOTATION: answer}}}, timeout_s=timeout_s)
