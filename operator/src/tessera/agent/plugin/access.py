"""What a prepared claim gives its containers, and what is recorded of it: pure builders.

Values in, values out: the claim's devices resolved against the GPUs (``find_gpu``,
``find_instance``), the CDI devices and edits (``build_cdi_devices``), the claim's
``status.devices`` entries (``device_status_entries``), the MPS limits an allocation asks for
(``mps_limits``), and the checkpoint records of a claim planned, prepared or rebuilt from its
CDI spec. The steps that act — holds, instances, files, API writes — are in ``prepare``.

What a container gets per device:

- ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES``: the ``GPU-…``/``MIG-…`` UUIDs of
  every device of the same request, so a container that gets them all sees them all;
- device nodes: ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` once per
  claim, ``/dev/nvidia<minor>`` and MIG capability nodes per device;
- for an admin-access device (``adminAccess: true``, a monitoring claim): the same UUIDs and
  device nodes, but no MPS pipe or limits, and no hold: the reconciler may change the device
  under it, and the operator never waits for it;
- for an MPS share: the host's pipe folder of that device's MPS server mounted at
  ``/tmp/nvidia-mps`` with ``CUDA_MPS_PIPE_DIRECTORY`` pointing there, and its log folder at
  ``/var/log/nvidia-mps`` (``CUDA_MPS_LOG_DIRECTORY``),
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the allocation's consumed ``compute`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<uuid>=<MiB>M`` from its consumed ``memory``.
Not for: I/O of any kind (``prepare``, ``cdi``, ``checkpoint``), or reading claims (``claims``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.agent.backends.base import GpuInfo, Inventory, MigInstanceInfo
from tessera.agent.backends.mps import mps_log_directory
from tessera.agent.plugin.cdi import CdiDevice, ContainerEdits, Mount, cdi_device_name, qualified_device_id
from tessera.agent.plugin.checkpoint import ClaimState, DynamicInstance, PreparedClaim, PreparedDevice
from tessera.agent.plugin.claims import AllocatedDevice, ClaimError, ClaimRef
from tessera.agent.plugin.hardware import CONTROL_DEVICE_NODES
from tessera.models.attributes import COMPUTE_CAPACITY, MEMORY_CAPACITY
from tessera.models.devices import DeviceKind, DeviceRef
from tessera.models.quantity import MIB, parse_quantity

MPS_CONTAINER_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # inside the container, where NVIDIA's driver mounts it
MPS_CONTAINER_LOG_DIRECTORY = "/var/log/nvidia-mps"  # the daemon's log folder, the MPS default path


@dataclass(frozen=True, slots=True)
class MpsLimits:
    """The per-client MPS limits an allocation's ``consumedCapacity`` asks for."""

    active_thread_percentage: int | None = None
    pinned_memory_mib: int | None = None


def mps_limits(consumed: Mapping[str, str]) -> MpsLimits:
    """Read ``compute`` (percent of SMs) and ``memory`` (bytes) from ``consumedCapacity``.

    Memory is rounded down to whole MiB so the limit never exceeds what was allocated."""
    percent = memory = None
    try:
        if COMPUTE_CAPACITY in consumed:
            percent = parse_quantity(consumed[COMPUTE_CAPACITY])
            if not 1 <= percent <= 100:
                raise ValueError(f"compute must be 1..100 percent, got {consumed[COMPUTE_CAPACITY]}")
        if MEMORY_CAPACITY in consumed:
            memory = parse_quantity(consumed[MEMORY_CAPACITY]) // MIB
            if memory < 1:
                raise ValueError(f"memory must be at least 1Mi, got {consumed[MEMORY_CAPACITY]}")
    except ValueError as error:
        raise ClaimError(f"the allocation's consumedCapacity cannot be applied: {error}") from None
    return MpsLimits(percent, memory)


def is_mps_share(device: AllocatedDevice, pipe_directory: str | None) -> bool:
    """An MPS share: the device runs an MPS server, or the allocation consumed ``compute``
    (only MPS devices publish that capacity). An admin-access device is never one: a
    monitoring container sees the device without joining its MPS server or its limits."""
    if device.admin_access:
        return False
    return pipe_directory is not None or COMPUTE_CAPACITY in device.consumed_capacity


def find_gpu(inventory: Inventory, ref: DeviceRef, device: str) -> GpuInfo:
    gpu = next((g for g in inventory.gpus if g.index == ref.gpu_index), None)
    if gpu is None:
        problem = f" ({inventory.problem})" if inventory.problem else ""
        raise ClaimError(f"device {device}: this node has no GPU with index {ref.gpu_index}{problem}")
    return gpu


def find_instance(gpu: GpuInfo, profile: str, start: int) -> MigInstanceInfo | None:
    """The usable MIG instance of ``profile`` at ``start`` on ``gpu`` (one with a MIG UUID)."""
    return next(
        (i for i in gpu.instances if i.profile == profile and i.start == start and i.uuid is not None), None
    )


@dataclass(frozen=True, slots=True)
class DeviceAccess:
    """What one prepared device gives a container."""

    allocated: AllocatedDevice
    gpu_uuid: str
    device_uuid: str  # "GPU-…" or "MIG-…"
    device_nodes: tuple[str, ...]
    mps_pipe_directory: str | None = None  # host folder of the device's MPS server, for MPS shares


def unique_cdi_names(claim_uid: str, accesses: Sequence[DeviceAccess]) -> list[str]:
    """``<claimUID>-<device>``; a device allocated twice to one claim (two shares of it for two
    requests) gets ``-2``, ``-3``… on its later entries."""
    seen: dict[str, int] = {}
    names = []
    for access in accesses:
        count = seen[access.allocated.device] = seen.get(access.allocated.device, 0) + 1
        base = cdi_device_name(claim_uid, access.allocated.device)
        names.append(base if count == 1 else f"{base}-{count}")
    return names


def _request_env(group: Sequence[DeviceAccess]) -> tuple[tuple[str, ...], tuple[Mount, ...]]:
    uuids = ",".join(dict.fromkeys(a.device_uuid for a in group))
    env = [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"CUDA_VISIBLE_DEVICES={uuids}"]
    mps = [a for a in group if is_mps_share(a.allocated, a.mps_pipe_directory)]
    if not mps:
        return tuple(env), ()
    pipes = sorted({a.mps_pipe_directory for a in mps if a.mps_pipe_directory})
    request = group[0].allocated.request
    if len(pipes) != 1:
        raise ClaimError(
            f"request {request!r} got MPS shares of {len(mps)} devices served by {len(pipes)} MPS servers; "
            "a process can use one MPS server only: request one MPS share per request"
        )
    env.append(f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_PIPE_DIRECTORY}")
    limits = [(a, mps_limits(a.allocated.consumed_capacity)) for a in mps]
    percents = [lim.active_thread_percentage for _, lim in limits if lim.active_thread_percentage is not None]
    if percents:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={min(percents)}")
    memory = [f"{a.device_uuid}={lim.pinned_memory_mib}M" for a, lim in limits if lim.pinned_memory_mib is not None]
    if memory:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(memory)}")
    mounts = [Mount(pipes[0], MPS_CONTAINER_PIPE_DIRECTORY)]
    log_directory = mps_log_directory(pipes[0])
    if log_directory is not None:
        env.append(f"CUDA_MPS_LOG_DIRECTORY={MPS_CONTAINER_LOG_DIRECTORY}")
        mounts.append(Mount(log_directory, MPS_CONTAINER_LOG_DIRECTORY))
    return tuple(env), tuple(mounts)


def build_cdi_devices(
    claim_uid: str, accesses: Sequence[DeviceAccess], dev_root: str | None = None
) -> tuple[list[CdiDevice], ContainerEdits]:
    """The claim's CDI devices (in ``accesses`` order) and the edits they all share; device
    nodes come from ``dev_root`` on the host when given (simulated GPUs), else from /dev."""
    groups: dict[str, list[DeviceAccess]] = {}
    for access in accesses:
        groups.setdefault(access.allocated.request, []).append(access)
    request_edits = {request: _request_env(group) for request, group in groups.items()}
    devices = []
    for access, name in zip(accesses, unique_cdi_names(claim_uid, accesses), strict=True):
        env, mounts = request_edits[access.allocated.request]
        edits = ContainerEdits(env=env, device_nodes=access.device_nodes, mounts=mounts, dev_root=dev_root)
        devices.append(CdiDevice(name, edits))
    return devices, ContainerEdits(device_nodes=CONTROL_DEVICE_NODES, dev_root=dev_root)


def device_status_entries(
    driver: str, accesses: Sequence[DeviceAccess], driver_version: str, now: str
) -> list[dict[str, Any]]:
    """The claim's ``status.devices`` entries (DRAResourceClaimDeviceStatus), one per prepared
    device: a ``Ready`` condition, and ``data`` saying what the container got — the GPU or
    MIG UUID, the parent GPU, the MIG profile, the MPS limits applied, the node's driver
    version, and whether it is an admin-access (monitoring) device. ``now`` is the condition's
    transition time (RFC 3339)."""
    entries = []
    for access in accesses:
        allocated = access.allocated
        data: dict[str, Any] = {"uuid": access.device_uuid, "gpuUUID": access.gpu_uuid}
        if allocated.ref.profile is not None:
            data["migProfile"] = allocated.ref.profile
        if is_mps_share(allocated, access.mps_pipe_directory):
            limits = mps_limits(allocated.consumed_capacity)
            mps: dict[str, int] = {}
            if limits.active_thread_percentage is not None:
                mps["activeThreadPercentage"] = limits.active_thread_percentage
            if limits.pinned_memory_mib is not None:
                mps["pinnedDeviceMemoryMiB"] = limits.pinned_memory_mib
            data["mps"] = mps
        if driver_version:
            data["driverVersion"] = driver_version
        if allocated.admin_access:
            data["adminAccess"] = True
        entry: dict[str, Any] = {
            "driver": driver,
            "pool": allocated.pool,
            "device": allocated.device,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Prepared", "lastTransitionTime": now,
                "message": f"{access.device_uuid} prepared for the claim's containers",
            }],
            "data": data,
        }
        if allocated.share_id:
            entry["shareID"] = allocated.share_id
        entries.append(entry)
    return entries


def in_use_device_uuids(claims: Iterable[PreparedClaim]) -> frozenset[str]:
    """``GPU-…``/``MIG-…`` UUIDs of every device the claims hold."""
    return frozenset(uuid for claim in claims for uuid in claim.device_uuids)


def in_use_gpu_uuids(claims: Iterable[PreparedClaim]) -> frozenset[str]:
    """UUIDs of every physical GPU that a claim holds, itself or one of its MIG instances."""
    return frozenset(d.gpu_uuid for claim in claims for d in claim.devices)


def prepared_claim(
    ref: ClaimRef, accesses: Sequence[DeviceAccess], cdi_devices: Sequence[CdiDevice],
    created: Sequence[DynamicInstance],
) -> PreparedClaim:
    """The checkpoint's record of a claim once prepared: each device with its CDI ID, UUIDs
    and, for a DynamicMIG placement, the instance made for it."""
    return PreparedClaim(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=ClaimState.PREPARED,
        devices=tuple(
            PreparedDevice(
                request=a.allocated.request,
                pool=a.allocated.pool,
                device=a.allocated.device,
                share_id=a.allocated.share_id,
                cdi_device_id=qualified_device_id(c.name),
                gpu_uuid=a.gpu_uuid,
                device_uuid=a.device_uuid,
                dynamic=next((i for i in created if i.uuid == a.device_uuid), None),
                admin_access=a.allocated.admin_access,
            )
            for a, c in zip(accesses, cdi_devices, strict=True)
        ),
    )


def planned_claim(ref: ClaimRef, devices: Sequence[AllocatedDevice], inventory: Inventory) -> PreparedClaim:
    """The record written before any DynamicMIG instance is made (state ``Preparing``): the
    placements the claim may get, so a restarted agent knows which instances may be its."""
    planned = []
    for d in devices:
        gpu = find_gpu(inventory, d.ref, d.device)
        dynamic = None
        if d.ref.kind is DeviceKind.DYNAMIC_MIG:
            profile, start = d.ref.placement
            dynamic = DynamicInstance(gpu_uuid=gpu.uuid, profile=profile, start=start)
        planned.append(
            PreparedDevice(request=d.request, pool=d.pool, device=d.device, share_id=d.share_id,
                           cdi_device_id="", gpu_uuid=gpu.uuid, dynamic=dynamic)
        )
    return PreparedClaim(uid=ref.uid, namespace=ref.namespace, name=ref.name,
                         state=ClaimState.PREPARING, devices=tuple(planned))


def replace_devices(claim: PreparedClaim, devices: tuple[PreparedDevice, ...], state: ClaimState) -> PreparedClaim:
    return claim.model_copy(update={"devices": devices, "state": state})


def recovered_device(uid: str, name: str, ref: DeviceRef, gpu: GpuInfo, node: str) -> PreparedDevice:
    """A device of a claim rebuilt from its CDI spec: enough to hold and to unprepare it."""
    device_uuid, dynamic = gpu.uuid, None
    if ref.is_mig:
        profile, start = ref.placement
        instance = find_instance(gpu, profile, start)
        device_uuid = instance.uuid if instance and instance.uuid else ""
        if ref.kind is DeviceKind.DYNAMIC_MIG:
            dynamic = DynamicInstance(
                gpu_uuid=gpu.uuid, profile=profile, start=start,
                gpu_instance_id=instance.gpu_instance_id if instance else None,
                uuid=instance.uuid if instance else None,
            )
    return PreparedDevice(
        request="", pool=node, device=name, cdi_device_id=qualified_device_id(cdi_device_name(uid, name)),
        gpu_uuid=gpu.uuid, device_uuid=device_uuid, dynamic=dynamic,
    )
