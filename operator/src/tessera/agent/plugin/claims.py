"""ResourceClaims as the kubelet plugin sees them: read one through the API, and take from its
allocation the devices this node's driver must prepare.

The kubelet's request names a claim only (namespace, name, UID); the allocation lives in the
claim's status. ``allocated_devices`` is the pure part: it checks that the claim is the one
the kubelet meant (same UID), is allocated, and has devices of our driver in this node's pool
(pool name = node name), and says what is wrong otherwise. ``KubeClaimReader`` and
``KubeClaimStatusWriter`` are the only code of the plugin that talks to the Kubernetes API
(through ``tessera.kube.claims`` and ``tessera.kube.claimstatus``).
Not for: preparing anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tessera.kube.claims import read_resource_claim
from tessera.kube.claimstatus import ClaimGoneError, apply_claim_device_status
from tessera.kube.http import ApiError, KubeClient
from tessera.models.allocation import allocation_results
from tessera.models.devices import DeviceRef, parse_device_name

Claim = Mapping[str, Any]


class ClaimError(Exception):
    """This claim cannot be prepared; the message goes back to the kubelet (and the Pod's events)."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends: which claim, by name and UID."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of our driver on this node."""

    request: str  # the request name; "<request>/<subrequest>" for a prioritized-list choice
    pool: str
    device: str
    ref: DeviceRef
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool = False  # a monitoring claim: the device is made visible, never held or limited

    @property
    def request_name(self) -> str:
        """The name the Pod refers to: the kubelet wants subrequest names stripped."""
        return self.request.split("/", 1)[0]


def allocated_devices(claim: Claim, ref: ClaimRef, driver: str, node: str) -> list[AllocatedDevice]:
    """The devices of ``claim`` that ``driver`` prepares on ``node``, in allocation order.

    Raises ClaimError when the claim was replaced (another UID), is not allocated, has no
    device of ``driver``, is allocated to another node's pool, or names a device that is not
    a Tessera device name."""
    uid = claim.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref} has UID {uid}, the kubelet asked for {ref.uid}: "
            "the claim was deleted and created again; the Pod must be recreated"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated yet; the scheduler allocates it first")
    results = allocation_results(claim, driver, include_admin_access=True)
    if not results:
        raise ClaimError(f"ResourceClaim {ref} has no device of driver {driver}; it is not Tessera's to prepare")
    elsewhere = sorted({r.pool for r in results if r.pool != node})
    if elsewhere:
        raise ClaimError(
            f"ResourceClaim {ref} is allocated devices of node {', '.join(elsewhere)}, "
            f"but this is node {node}"
        )
    devices = []
    for result in results:
        try:
            device_ref = parse_device_name(result.device)
        except ValueError as error:
            raise ClaimError(f"ResourceClaim {ref}: {error}") from None
        devices.append(
            AllocatedDevice(
                request=result.request,
                pool=node,
                device=result.device,
                ref=device_ref,
                share_id=result.share_id,
                consumed_capacity=result.consumed_capacity,
                admin_access=result.admin_access,
            )
        )
    return devices


class ClaimReader(Protocol):
    """Reads a ResourceClaim as JSON; None when it does not exist."""

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class ClaimStatusWriter(Protocol):
    """Writes this driver's entries of a claim's ``status.devices``; an empty list clears them."""

    async def write_device_status(self, ref: ClaimRef, devices: Sequence[dict[str, Any]]) -> None: ...


class KubeClaimStatusWriter:
    """Writes claim device status through the API as ``field_manager`` (one per node, so a
    node's plugin replaces only what it wrote). A claim that is gone needs no status."""

    def __init__(self, api: KubeClient, field_manager: str) -> None:
        self._api = api
        self.field_manager = field_manager

    async def write_device_status(self, ref: ClaimRef, devices: Sequence[dict[str, Any]]) -> None:
        try:
            await apply_claim_device_status(
                self._api, ref.namespace, ref.name, ref.uid, self.field_manager, devices
            )
        except ClaimGoneError:
            return


class KubeClaimReader:
    """Reads ResourceClaims from ``resource.k8s.io/v1`` as raw JSON (``tessera.kube.claims``),
    so fields newer than any client library, such as ``consumedCapacity``, always come through."""

    def __init__(self, api: KubeClient, timeout_s: float = 20.0) -> None:
        self._api = api
        self.timeout_s = timeout_s  # well inside the kubelet's own deadline for a prepare call

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await read_resource_claim(self._api, namespace, name, self.timeout_s)
        except ApiError as error:
            raise ClaimError(f"reading ResourceClaim {namespace}/{name} failed: {error}") from None
