"""The one write the kubelet plugin makes to a ResourceClaim: its own entries of
``status.devices`` (DRAResourceClaimDeviceStatus), by server-side apply.

``status.devices`` is a map list keyed by driver, pool, device and shareID whose entries are
owned by the driver that wrote them. Applying with a field manager of our own replaces
exactly the entries that manager applied before and leaves other drivers' entries alone;
applying an empty list takes ours away. The claim's UID rides along as a precondition, so
a claim deleted and made again under the same name is never written to.

A refused grant comes back as 422 Invalid (the check runs with validation), the message
naming ``resourceclaims/driver``. RBAC (1.36, DRAResourceClaimGranularStatusAuthorization): ``patch`` on
``resourceclaims/status``, and ``associated-node:patch`` on the synthetic
``resourceclaims/driver`` with resourceName ``gpu.tessera.dev`` — granted to a service account
whose token is bound to a Pod on the claim's node (the agent's own DaemonSet Pod).
Not for: deciding what the entries say (``tessera.agent.plugin.prepare``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera import RESOURCE_API_VERSION, RESOURCE_GROUP, RESOURCE_VERSION
from tessera.kube.http import ApiError, KubeClient, resource_path


class ClaimGoneError(Exception):
    """The claim was deleted, or replaced by another with the same name."""


async def apply_claim_device_status(
    api: KubeClient,
    namespace: str,
    name: str,
    uid: str,
    field_manager: str,
    devices: Sequence[dict[str, Any]],
    timeout_s: float = 20.0,
) -> None:
    """Make ``field_manager``'s entries of the claim's ``status.devices`` exactly ``devices``
    (an empty sequence removes them). Raises ClaimGoneError when the claim is gone or has
    another UID; other API errors propagate."""
    body = {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": list(devices)},
    }
    path = resource_path(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", name, namespace=namespace,
                         subresource="status")
    try:
        await api.patch(path, body, "apply", field_manager=field_manager, force=True, timeout_s=timeout_s)
    except ApiError as error:
        if error.status == 404 or _uid_refused(error):
            raise ClaimGoneError(f"ResourceClaim {namespace}/{name} (uid {uid}) is gone") from None
        raise


def _uid_refused(error: ApiError) -> bool:
    """Another claim holds the name: its UID cannot change to ours (422 on ``metadata.uid``;
    409 where a precondition catches it first). Other 422s (a refused grant is one) are not."""
    if error.status == 422:
        return any(c.get("field") == "metadata.uid" for c in error.details.get("causes") or [])
    return error.status == 409 and "uid" in error.message.lower()
