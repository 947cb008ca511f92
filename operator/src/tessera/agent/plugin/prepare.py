"""Prepare and unprepare ResourceClaims on this node: the work behind the kubelet's DRA calls.

Prepare reads the claim, resolves each allocated device against the GPUs (a whole GPU, a
static MIG instance, or a DynamicMIG placement to create now), holds the devices in the
backend so the reconciler leaves them alone, writes the claim's CDI spec and records the
claim in the checkpoint. The answer is the CDI device IDs. Preparing a claim that is already
prepared returns the recorded answer and does nothing else.

Unprepare removes the CDI spec, drops the holds and destroys the dynamic instances the
claim got; a claim the plugin does not know is already unprepared.

With a ``ClaimStatusWriter``, a fresh prepare also writes the claim's ``status.devices``
(``device_status_entries``: Ready, UUIDs, MIG profile, MPS limits, driver version) and a
finished unprepare clears them.

Concurrency: every claim has its own lock, so one claim is never worked on twice at once,
while different claims proceed together; one hardware lock covers every "look, then change
the GPUs" sequence; the checkpoint is written by one writer at a time.

What a container gets per device (the pure ``build_cdi_devices``):

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
Not for: gRPC (``tessera.agent.plugin.server``) or reading claims (``.claims``).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from tessera.agent.backends.base import BackendError, GpuInfo, Inventory, MigInstanceInfo, NotFoundError
from tessera.agent.backends.mps import mps_log_directory
from tessera.agent.plugin.boot import BOOT_ID_FILE, from_an_earlier_boot, read_boot_id
from tessera.agent.plugin.cdi import (
    CdiDevice,
    ContainerEdits,
    Mount,
    cdi_device_name,
    claim_spec,
    qualified_device_id,
    read_claim_specs,
    remove_claim_spec,
    spec_device_names,
    spec_file_name,
    write_claim_spec,
)
from tessera.agent.plugin.checkpoint import (
    CheckpointCorruptError,
    CheckpointData,
    ClaimState,
    DynamicInstance,
    PreparedClaim,
    PreparedDevice,
    load_checkpoint,
    quarantine,
    save_checkpoint,
)
from tessera.agent.plugin.claims import (
    AllocatedDevice,
    ClaimError,
    ClaimReader,
    ClaimRef,
    ClaimStatusWriter,
    allocated_devices,
)
from tessera.agent.plugin.hardware import CONTROL_DEVICE_NODES, PluginBackend, device_nodes
from tessera.models.attributes import COMPUTE_CAPACITY, MEMORY_CAPACITY
from tessera.models.devices import DeviceKind, DeviceRef, parse_device_name
from tessera.models.quantity import MIB, parse_quantity

log = structlog.get_logger("tessera.agent.plugin")

MPS_CONTAINER_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # inside the container, where NVIDIA's driver mounts it
MPS_CONTAINER_LOG_DIRECTORY = "/var/log/nvidia-mps"  # the daemon's log folder, the MPS default path


# --- pure: limits, resolution, CDI content ------------------------------------------------------


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


# --- the preparer -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparerSettings:
    driver: str
    node: str
    cdi_dir: Path
    checkpoint_path: Path
    proc_root: Path = Path("/proc")
    dev_root: Path | None = None  # host folder standing for /dev (simulated GPUs); None: /dev
    boot_id_file: Path = BOOT_ID_FILE  # tells one boot of the node from the next


class ClaimPreparer:
    """Prepares and unprepares claims; holds the state the checkpoint persists."""

    def __init__(
        self,
        backend: PluginBackend,
        reader: ClaimReader,
        settings: PreparerSettings,
        status_writer: ClaimStatusWriter | None = None,
    ) -> None:
        self._backend = backend
        self._reader = reader
        self._status_writer = status_writer
        self._settings = settings
        self._claims: dict[str, PreparedClaim] = {}
        self._boot_id: str | None = None  # read by restore()
        self._claim_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._hardware_lock = asyncio.Lock()
        self._checkpoint_lock = asyncio.Lock()
        self._changes = 0  # changes made to the claims, counted
        self._saved = 0  # changes the checkpoint on disk holds
        self._log = log.bind(node=settings.node)

    # -- state --

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """Every claim the plugin holds (prepared, or half-done after a failure), by UID."""
        return dict(self._claims)

    def in_use_device_uuids(self) -> frozenset[str]:
        return in_use_device_uuids(self._claims.values())

    def in_use_gpu_uuids(self) -> frozenset[str]:
        return in_use_gpu_uuids(self._claims.values())

    async def restore(self) -> None:
        """Load the checkpoint and hold again what it says is prepared (holds live in the
        backend process and are lost with it). A corrupt checkpoint is moved aside and the
        claims are rebuilt from the CDI specs on disk."""
        try:
            data = await asyncio.to_thread(load_checkpoint, self._settings.checkpoint_path)
        except CheckpointCorruptError as error:
            moved = await asyncio.to_thread(quarantine, self._settings.checkpoint_path)
            self._log.error("checkpoint unusable; rebuilding from CDI specs", error=str(error), moved_to=str(moved))
            data = await self._recover_from_cdi()
            await asyncio.to_thread(save_checkpoint, self._settings.checkpoint_path, data)
        if data is not None and data.node != self._settings.node:
            self._log.warning("checkpoint was written for another node; using it", written_for=data.node)
        self._boot_id = await asyncio.to_thread(read_boot_id, self._settings.boot_id_file)
        if from_an_earlier_boot(data, self._boot_id) and data is not None:
            await self._forget_earlier_boot(data)
            data = None
        self._claims = dict(data.claims) if data else {}
        for claim in self._claims.values():
            for uuid in claim.device_uuids:
                await self._call(self._backend.hold, uuid, claim.uid, quiet=True)
        self._log.info("plugin state restored", claims=len(self._claims), in_use=sorted(self.in_use_device_uuids()))

    async def _forget_earlier_boot(self, data: CheckpointData) -> None:
        """The node rebooted since ``data`` was written: nothing uses its claims now (see
        ``tessera.agent.plugin.boot``). Drop them and any CDI spec of theirs left behind; the
        kubelet prepares again the claims of the Pods that come back."""
        for uid in data.claims:
            await asyncio.to_thread(remove_claim_spec, self._settings.cdi_dir, uid)
        self._log.warning("the node rebooted since the checkpoint was written: its claims are no longer prepared",
                          claims=sorted(data.claims), written_in_boot=data.boot_id, boot=self._boot_id)
        await asyncio.to_thread(save_checkpoint, self._settings.checkpoint_path,
                                CheckpointData(node=self._settings.node, boot_id=self._boot_id))

    async def _recover_from_cdi(self) -> CheckpointData:
        specs = await asyncio.to_thread(read_claim_specs, self._settings.cdi_dir)
        inventory = await asyncio.to_thread(self._backend.inventory)
        claims = {}
        for uid, spec in specs.items():
            devices = []
            for name in spec_device_names(spec, uid):
                try:
                    ref = parse_device_name(name)
                    gpu = find_gpu(inventory, ref, name)
                except (ValueError, ClaimError):
                    continue
                devices.append(_recovered_device(uid, name, ref, gpu, self._settings.node))
            claims[uid] = PreparedClaim(uid=uid, state=ClaimState.PREPARED, devices=tuple(devices), recovered=True)
        return CheckpointData(node=self._settings.node, claims=claims)

    async def _save(self) -> None:
        """Write the checkpoint with every change made so far (group commit: while one write
        runs, later changes queue up, and one write then covers them all)."""
        self._changes += 1
        mine = self._changes
        async with self._checkpoint_lock:
            if self._saved >= mine:
                return  # a write that started after this change already covered it
            covered = self._changes
            data = CheckpointData(node=self._settings.node, claims=dict(self._claims), boot_id=self._boot_id)
            await asyncio.to_thread(save_checkpoint, self._settings.checkpoint_path, data)
            self._saved = covered

    async def _set_claim(self, claim: PreparedClaim | None, uid: str) -> None:
        if claim is None:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = claim
        await self._save()

    def _lock(self, uid: str) -> asyncio.Lock:
        lock = self._claim_locks.get(uid)
        if lock is None:
            lock = self._claim_locks[uid] = asyncio.Lock()
        return lock

    async def _call(self, fn: Any, *args: Any, quiet: bool = False) -> Any:
        """Run a blocking backend call in a worker thread; backend failures become ClaimErrors."""
        try:
            return await asyncio.to_thread(fn, *args)
        except BackendError as error:
            if quiet:
                self._log.warning("backend call failed", call=getattr(fn, "__name__", "?"), error=str(error))
                return None
            raise ClaimError(f"{error.reason}: {error}") from error

    # -- prepare --

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """Prepare one claim; raises ClaimError with a message for the kubelet."""
        async with self._lock(ref.uid):
            known = self._claims.get(ref.uid)
            if known is not None and known.state is ClaimState.PREPARED and await self._spec_exists(ref.uid):
                return known
            claim = await self._reader.read_claim(ref.namespace, ref.name)
            if claim is None:
                raise ClaimError(f"ResourceClaim {ref} does not exist (deleted before it was prepared)")
            devices = allocated_devices(claim, ref, self._settings.driver, self._settings.node)
            prepared = await self._prepare_devices(ref, devices, known)
            self._log.info("claim prepared", claim=str(ref), uid=ref.uid, devices=[d.device for d in prepared.devices])
            return prepared

    async def _spec_exists(self, uid: str) -> bool:
        return await asyncio.to_thread((self._settings.cdi_dir / spec_file_name(uid)).is_file)

    async def _prepare_devices(
        self, ref: ClaimRef, devices: Sequence[AllocatedDevice], known: PreparedClaim | None
    ) -> PreparedClaim:
        dynamic = any(d.ref.kind is DeviceKind.DYNAMIC_MIG for d in devices)
        created: list[DynamicInstance] = []
        held: list[str] = []
        try:
            if dynamic:
                # Record the placements before touching the GPUs: after a crash, the restarted
                # agent knows which instances may be this claim's.
                await self._set_claim(await self._plan(ref, devices), ref.uid)
            # Only "look, then create" needs the GPUs to stand still; holds are atomic in the
            # backend, so claims of existing devices do not wait for each other.
            async with self._hardware_lock if dynamic else contextlib.nullcontext():
                inventory = await self._call(self._backend.inventory)
                accesses = await self._acquire(ref, devices, inventory, held, created)
            cdi_devices, common = build_cdi_devices(
                ref.uid, accesses, str(self._settings.dev_root) if self._settings.dev_root else None
            )
            spec = claim_spec(cdi_devices, common)
            await asyncio.to_thread(write_claim_spec, self._settings.cdi_dir, ref.uid, spec)
        except BaseException:
            await self._roll_back(ref, created, held, keep=known)
            raise
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self._write_status(
            ref, device_status_entries(self._settings.driver, accesses, inventory.driver_version, now)
        )
        prepared = PreparedClaim(
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
        await self._set_claim(prepared, ref.uid)
        return prepared

    async def _plan(self, ref: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedClaim:
        inventory = await self._call(self._backend.inventory)
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

    async def _acquire(
        self,
        ref: ClaimRef,
        devices: Sequence[AllocatedDevice],
        inventory: Inventory,
        held: list[str],
        created: list[DynamicInstance],
    ) -> list[DeviceAccess]:
        """Resolve every device against the GPUs, creating dynamic instances and holding each
        device for the claim. Records every hold and instance in ``held`` and ``created`` as
        it goes, so a failure half-way can be rolled back."""
        accesses: list[DeviceAccess] = []
        for d in devices:
            gpu = find_gpu(inventory, d.ref, d.device)
            instance: MigInstanceInfo | None = None
            if d.ref.kind is DeviceKind.MIG:
                profile, start = d.ref.placement
                instance = find_instance(gpu, profile, start)
                if instance is None:
                    raise ClaimError(
                        f"device {d.device}: GPU {gpu.uuid} has no {profile} instance at slice "
                        f"{start} (its layout changed after the scheduler allocated it)"
                    )
            elif d.ref.kind is DeviceKind.DYNAMIC_MIG:
                if d.admin_access:
                    raise ClaimError(
                        f"device {d.device}: admin access to a DynamicMIG placement has nothing to look at "
                        "(its instance exists only while a claim holds it); ask for the GPU or a MIG instance"
                    )
                instance, made = await self._dynamic_instance(ref, gpu, d)
                if made is not None:
                    created.append(made)
            device_uuid = instance.uuid if instance is not None and instance.uuid else gpu.uuid
            if not d.admin_access:  # an admin claim looks; it never keeps a repartition waiting
                await self._call(self._backend.hold, device_uuid, ref.uid)
                held.append(device_uuid)
            pipe = (instance.mps_pipe_directory if instance is not None else gpu.mps_pipe_directory)
            if is_mps_share(d, pipe) and pipe is None:
                pipe = await self._call(self._backend.start_mps, device_uuid)
            accesses.append(
                DeviceAccess(
                    allocated=d,
                    gpu_uuid=gpu.uuid,
                    device_uuid=device_uuid,
                    device_nodes=device_nodes(self._settings.proc_root, gpu, instance),
                    mps_pipe_directory=pipe if is_mps_share(d, pipe) else None,
                )
            )
        return accesses

    async def _dynamic_instance(
        self, ref: ClaimRef, gpu: GpuInfo, d: AllocatedDevice
    ) -> tuple[MigInstanceInfo, DynamicInstance | None]:
        """The claim's instance at the allocated placement: made now, or found when an earlier
        attempt made it (the placement is this claim's for as long as it is allocated)."""
        profile, start = d.ref.placement
        existing = find_instance(gpu, profile, start)
        if existing is not None:
            others = (c for c in self._claims.values() if c.uid != ref.uid)
            owner = next((c for c in others if existing.uuid in c.device_uuids), None)
            if owner is not None:
                raise ClaimError(
                    f"device {d.device}: the instance at this placement still belongs to claim {owner.uid}, "
                    "which is being unprepared; the kubelet retries"
                )
            return existing, DynamicInstance(
                gpu_uuid=gpu.uuid, profile=existing.profile, start=existing.start,
                gpu_instance_id=existing.gpu_instance_id, uuid=existing.uuid,
            )
        made = await self._call(self._backend.create_instance, gpu.uuid, profile, start, ref.uid)
        self._log.info("dynamic MIG instance created", claim=str(ref), gpu=gpu.uuid, profile=made.profile,
                       start=made.start, uuid=made.uuid)
        instance = MigInstanceInfo(
            gpu_instance_id=made.gpu_instance_id, profile=made.profile, profile_id=0, start=made.start,
            size=made.size, memory_mib=made.memory_mib, multiprocessors=0,
            compute_instance_id=made.compute_instance_id, uuid=made.uuid, in_use=True,
        )
        return instance, DynamicInstance(
            gpu_uuid=gpu.uuid, profile=made.profile, start=made.start,
            gpu_instance_id=made.gpu_instance_id, uuid=made.uuid,
        )

    async def _roll_back(
        self, ref: ClaimRef, created: Sequence[DynamicInstance], held: Sequence[str], keep: PreparedClaim | None
    ) -> None:
        """Undo a failed prepare: drop the holds it took, destroy the instances it made. When
        an instance cannot be destroyed, the claim's ``Preparing`` record stays, so that the
        kubelet's unprepare (or the next prepare) finds it. What an earlier, successful
        prepare of the same claim holds (``keep``) stays held."""
        kept = keep.device_uuids if keep is not None else frozenset()
        for uuid in held:
            if uuid not in kept:
                await self._call(self._backend.release, uuid, ref.uid, quiet=True)
        clean = True
        async with self._hardware_lock:
            for instance in created:
                if instance.gpu_instance_id is not None and instance.uuid not in kept:
                    clean &= await self._call(
                        self._destroy, instance.gpu_uuid, instance.gpu_instance_id, quiet=True
                    ) is not None
        if clean and self._claims.get(ref.uid) is not keep:
            await self._set_claim(keep, ref.uid)

    async def _write_status(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Publish (or, with no entries, clear) the claim's device status. The status tells
        people what was prepared; failing to write it never fails the kubelet's call."""
        if self._status_writer is None:
            return
        try:
            await self._status_writer.write_device_status(ref, entries)
        except Exception as error:  # any API failure: logged, the prepare stands
            self._log.warning("claim device status not written", claim=str(ref), error=str(error)[:300])

    def _destroy(self, gpu_uuid: str, gpu_instance_id: int) -> bool:
        self._backend.destroy_instance(gpu_uuid, gpu_instance_id)
        return True

    # -- unprepare --

    async def unprepare(self, ref: ClaimRef) -> None:
        """Unprepare one claim; a claim not prepared here is already unprepared."""
        async with self._lock(ref.uid):
            await asyncio.to_thread(remove_claim_spec, self._settings.cdi_dir, ref.uid)
            known = self._claims.get(ref.uid)
            if known is None:
                return
            for uuid in known.device_uuids:
                await self._call(self._backend.release, uuid, ref.uid, quiet=True)
            left = await self._destroy_dynamic(ref, known)
            if left:
                await self._set_claim(replace_devices(known, left, ClaimState.UNPREPARING), ref.uid)
                raise ClaimError(
                    f"ResourceClaim {ref}: could not destroy MIG instance(s) "
                    f"{', '.join(d.device for d in left)} yet (processes still run on them); "
                    "the kubelet retries"
                )
            await self._set_claim(None, ref.uid)
            await self._write_status(ref, [])
            self._log.info("claim unprepared", claim=str(ref), uid=ref.uid)

    async def _destroy_dynamic(self, ref: ClaimRef, claim: PreparedClaim) -> tuple[PreparedDevice, ...]:
        """Destroy the claim's dynamic instances; returns the devices whose instance remains."""
        left = []
        async with self._hardware_lock:
            inventory: Inventory | None = None
            for device in claim.devices:
                dynamic = device.dynamic
                if dynamic is None:
                    continue
                gi = dynamic.gpu_instance_id
                if gi is None:  # planned, and maybe made before a crash: look on the GPU
                    inventory = inventory or await self._call(self._backend.inventory)
                    gpu = inventory.gpu(dynamic.gpu_uuid)
                    found = find_instance(gpu, dynamic.profile, dynamic.start) if gpu else None
                    if found is None:
                        continue
                    gi = found.gpu_instance_id
                try:
                    await asyncio.to_thread(self._backend.destroy_instance, dynamic.gpu_uuid, gi)
                except NotFoundError:
                    continue
                except BackendError as error:
                    self._log.warning("dynamic MIG instance not destroyed", claim=str(ref), device=device.device,
                                      error=str(error))
                    left.append(device)
                    continue
                self._log.info("dynamic MIG instance destroyed", claim=str(ref), gpu=dynamic.gpu_uuid,
                               profile=dynamic.profile, start=dynamic.start)
        return tuple(left)


def replace_devices(claim: PreparedClaim, devices: tuple[PreparedDevice, ...], state: ClaimState) -> PreparedClaim:
    return claim.model_copy(update={"devices": devices, "state": state})


def _recovered_device(uid: str, name: str, ref: DeviceRef, gpu: GpuInfo, node: str) -> PreparedDevice:
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


__all__ = [
    "ClaimPreparer",
    "DeviceAccess",
    "MpsLimits",
    "PreparerSettings",
    "build_cdi_devices",
    "device_status_entries",
    "in_use_device_uuids",
    "in_use_gpu_uuids",
    "mps_limits",
]
