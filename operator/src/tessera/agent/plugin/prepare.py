"""Prepare and unprepare ResourceClaims on this node: the work behind the kubelet's DRA calls.

Prepare takes the claim (the agent's watch's copy, confirmed by a read that runs alongside the
work, or the read alone: ``watched``), resolves each allocated device against the GPUs (a whole
GPU, a static MIG instance, or a DynamicMIG placement to create now), holds the devices in the
backend so the reconciler leaves them alone, writes the claim's CDI spec and records the
claim in the checkpoint. The answer is the CDI device IDs. Preparing a claim that is already
prepared returns the recorded answer and does nothing else.

Unprepare removes the CDI spec, drops the holds and destroys the dynamic instances the
claim got; a claim the plugin does not know is already unprepared.

With a ``ClaimStatusWriter``, a fresh prepare also has the claim's ``status.devices`` written
(``device_status_entries``: Ready, UUIDs, MIG profile, MPS limits, driver version) and a
finished unprepare has them cleared — after the kubelet's answer, retried until they land
(``statuswrites``): the kubelet never waits on that API round trip. The checkpoint, which is
what keeps a device from being handed to a second claim after a restart, is on disk before
the answer. CDI specs are not synced: a prepare that finds the checkpoint's record but not its
spec writes the spec again (``cdi.write_claim_spec``). Each call's steps are timed (``steps``: a
histogram and a debug line).

Concurrency: every claim has its own lock, so one claim is never worked on twice at once,
while different claims proceed together; one hardware lock covers every "look, then change
the GPUs" sequence; the checkpoint is written by one writer at a time.

What a container gets, and every record kept of a claim, is built by the pure functions in
``access``; this module holds the steps that act on the GPUs, the files and the API.
Not for: gRPC (``tessera.agent.plugin.server``), reading claims (``.claims``), or building what a
container gets (``.access``).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from tessera.agent.backends.base import BackendError, GpuInfo, Inventory, MigInstanceInfo, NotFoundError
from tessera.agent.plugin.access import (
    DeviceAccess,
    build_cdi_devices,
    device_status_entries,
    find_gpu,
    find_instance,
    in_use_device_uuids,
    in_use_gpu_uuids,
    is_mps_share,
    planned_claim,
    prepared_claim,
    recovered_device,
    replace_devices,
)
from tessera.agent.plugin.boot import BOOT_ID_FILE, from_an_earlier_boot, read_boot_id
from tessera.agent.plugin.cdi import (
    claim_spec,
    read_claim_spec,
    read_claim_specs,
    remove_claim_spec,
    spec_device_names,
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
from tessera.agent.plugin.hardware import PluginBackend, device_nodes
from tessera.agent.plugin.statuswrites import ClaimStatusWrites
from tessera.agent.plugin.steps import PluginMetrics, StepTimes
from tessera.agent.plugin.watched import ClaimCopies, ClaimSource, Reading, ViewBehindError
from tessera.models.devices import DeviceKind, parse_device_name

log = structlog.get_logger("tessera.agent.plugin")

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
        metrics: PluginMetrics | None = None,
        view: ClaimCopies | None = None,
    ) -> None:
        self._backend = backend
        self.metrics = metrics or PluginMetrics()
        self._source = ClaimSource(reader, self.metrics, view)
        self._status = ClaimStatusWrites(status_writer, self.metrics) if status_writer is not None else None
        self._settings = settings
        self._claims: dict[str, PreparedClaim] = {}
        self._boot_id: str | None = None  # read by restore()
        self._claim_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._hardware_lock = asyncio.Lock()
        # DynamicMIG instances a prepare in flight has made or taken, by instance UUID -> claim
        # UID: the claim's record names them only once it is prepared, and until then no other
        # claim may take them (read and written under the hardware lock).
        self._taking: dict[str, str] = {}
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
                devices.append(recovered_device(uid, name, ref, gpu, self._settings.node))
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

    async def _set_claim(self, claim: PreparedClaim | None, uid: str, times: StepTimes | None = None) -> None:
        if claim is None:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = claim
        with times.step("checkpoint") if times is not None else contextlib.nullcontext():
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
        """Prepare one claim; raises ClaimError with a message for the kubelet. The checkpoint
        holds the claim before this returns; its device status is written after (``statuswrites``)."""
        times, outcome = StepTimes(), "failed"
        try:
            async with self._locked(ref.uid, times):
                with times.step("checks"):
                    known = self._claims.get(ref.uid)
                    again = known is not None and known.state is ClaimState.PREPARED and await self._spec_intact(
                        known)
                if again:
                    assert known is not None
                    outcome = "again"
                    return known
                reading = await self._source.begin(ref, times)
                try:
                    prepared = await self._prepare_from(ref, reading, known, times)
                except ViewBehindError as stale:  # the watch was behind: what it gave is rolled back
                    self._log.info("claim changed since the watch saw it; preparing from the API's copy",
                                   claim=str(ref), uid=ref.uid)
                    prepared = await self._prepare_from(ref, Reading.read(ref, stale.claim, self.metrics), known,
                                                        times)
                finally:
                    reading.close()
                outcome = "prepared"
                self._log.info("claim prepared", claim=str(ref), uid=ref.uid,
                               devices=[d.device for d in prepared.devices])
                return prepared
        finally:
            self.metrics.record("prepare", times, str(ref), outcome)

    @contextlib.asynccontextmanager
    async def _locked(self, uid: str, times: StepTimes) -> AsyncIterator[None]:
        """The claim's own lock, the wait for it timed as the step ``lock``."""
        lock = self._lock(uid)
        with times.step("lock"):
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()

    async def _spec_intact(self, known: PreparedClaim) -> bool:
        """Whether the claim's CDI spec is on disk and names its devices. Specs are written
        without a sync (``cdi.write_claim_spec``): one lost, or left empty, by a crash of the
        machine is written again from the checkpoint's record by the next prepare."""
        specs = await asyncio.to_thread(read_claim_spec, self._settings.cdi_dir, known.uid)
        return specs is not None and sorted(spec_device_names(specs, known.uid)) == sorted(
            d.device for d in known.devices)

    async def _prepare_from(
        self, ref: ClaimRef, reading: Reading, known: PreparedClaim | None, times: StepTimes
    ) -> PreparedClaim:
        """Prepare from ``reading``'s copy of the claim. When that copy is the watch's, its
        refusal is no answer until the GET agrees (``confirm`` raises ``ViewBehindError`` if not)."""
        try:
            with times.step("checks"):
                devices = allocated_devices(reading.claim, ref, self._settings.driver, self._settings.node)
            return await self._prepare_devices(ref, devices, known, times, reading)
        except ClaimError:
            await reading.confirm()
            raise

    async def _prepare_devices(
        self, ref: ClaimRef, devices: Sequence[AllocatedDevice], known: PreparedClaim | None, times: StepTimes,
        reading: Reading,
    ) -> PreparedClaim:
        dynamic = any(d.ref.kind is DeviceKind.DYNAMIC_MIG for d in devices)
        created: list[DynamicInstance] = []
        held: list[str] = []
        wrote_spec = False
        try:
            if dynamic:
                # A DynamicMIG claim changes the GPUs and records its plan: only from a confirmed copy.
                await reading.confirm()
                # Record the placements before touching the GPUs: after a crash, the restarted
                # agent knows which instances may be this claim's.
                with times.step("hardware"):
                    planned = await self._plan(ref, devices)
                await self._set_claim(planned, ref.uid, times)
            # Only "look, then create" needs the GPUs to stand still; holds are atomic in the
            # backend, so claims of existing devices do not wait for each other.
            with times.step("hardware_lock"):
                if dynamic:
                    await self._hardware_lock.acquire()
            try:
                with times.step("hardware"):
                    inventory = await self._call(self._backend.inventory)
                    accesses = await self._acquire(ref, devices, inventory, held, created)
            finally:
                if dynamic:
                    self._hardware_lock.release()
            with times.step("cdi_write"):
                cdi_devices, common = build_cdi_devices(
                    ref.uid, accesses, str(self._settings.dev_root) if self._settings.dev_root else None
                )
                spec = claim_spec(cdi_devices, common)
                wrote_spec = True
                await asyncio.to_thread(write_claim_spec, self._settings.cdi_dir, ref.uid, spec)
            prepared = prepared_claim(ref, accesses, cdi_devices, created)
            await reading.confirm()  # the copy worked from is the API's (tessera.agent.plugin.watched)
            await self._set_claim(prepared, ref.uid, times)  # on disk before the kubelet hears of it
        except BaseException:
            await self._roll_back(ref, created, held, keep=known)
            if wrote_spec and known is None:  # a spec nobody was answered with: a redo writes its own
                await asyncio.to_thread(remove_claim_spec, self._settings.cdi_dir, ref.uid)
            raise
        finally:
            for instance in created:
                if instance.uuid is not None and self._taking.get(instance.uuid) == ref.uid:
                    del self._taking[instance.uuid]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._submit_status(ref, device_status_entries(self._settings.driver, accesses, inventory.driver_version, now))
        return prepared

    async def _plan(self, ref: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedClaim:
        return planned_claim(ref, devices, await self._call(self._backend.inventory))

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
            assert existing.uuid is not None  # find_instance finds usable instances only
            others = (c for c in self._claims.values() if c.uid != ref.uid)
            owner = next((c for c in others if existing.uuid in c.device_uuids), None)
            if owner is not None:
                raise ClaimError(
                    f"device {d.device}: the instance at this placement still belongs to claim {owner.uid}, "
                    "which is being unprepared; the kubelet retries"
                )
            taker = self._taking.get(existing.uuid)
            if taker is not None and taker != ref.uid:
                raise ClaimError(
                    f"device {d.device}: the instance at this placement is being prepared for claim {taker}; "
                    "the kubelet retries"
                )
            self._taking[existing.uuid] = ref.uid
            return existing, DynamicInstance(
                gpu_uuid=gpu.uuid, profile=existing.profile, start=existing.start,
                gpu_instance_id=existing.gpu_instance_id, uuid=existing.uuid,
            )
        made = await self._call(self._backend.create_instance, gpu.uuid, profile, start, ref.uid)
        self._taking[made.uuid] = ref.uid
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

    def _submit_status(self, ref: ClaimRef, entries: list[dict[str, Any]]) -> None:
        """Publish (or, with no entries, clear) the claim's device status, after the answer:
        the status tells people what was prepared; the kubelet never waits for it."""
        if self._status is not None:
            self._status.submit(ref, entries)

    async def flush_status(self) -> None:
        """Until every device status submitted so far has been written (tests, benchmarks)."""
        if self._status is not None:
            await self._status.flush()

    async def close(self, grace: float) -> None:
        """Stop: device status writes still pending get ``grace`` seconds to land."""
        if self._status is not None:
            await self._status.close(grace)

    def _destroy(self, gpu_uuid: str, gpu_instance_id: int) -> bool:
        self._backend.destroy_instance(gpu_uuid, gpu_instance_id)
        return True

    # -- unprepare --

    async def unprepare(self, ref: ClaimRef) -> None:
        """Unprepare one claim; a claim not prepared here is already unprepared."""
        times, outcome = StepTimes(), "failed"
        try:
            async with self._locked(ref.uid, times):
                with times.step("cdi_remove"):
                    await asyncio.to_thread(remove_claim_spec, self._settings.cdi_dir, ref.uid)
                known = self._claims.get(ref.uid)
                if known is None:
                    outcome = "unknown"
                    return
                with times.step("release"):
                    for uuid in known.device_uuids:
                        await self._call(self._backend.release, uuid, ref.uid, quiet=True)
                with times.step("hardware"):
                    left = await self._destroy_dynamic(ref, known)
                if left:
                    await self._set_claim(replace_devices(known, left, ClaimState.UNPREPARING), ref.uid, times)
                    raise ClaimError(
                        f"ResourceClaim {ref}: could not destroy MIG instance(s) "
                        f"{', '.join(d.device for d in left)} yet (processes still run on them); "
                        "the kubelet retries"
                    )
                await self._set_claim(None, ref.uid, times)
                self._submit_status(ref, [])
                outcome = "unprepared"
                self._log.info("claim unprepared", claim=str(ref), uid=ref.uid)
        finally:
            self.metrics.record("unprepare", times, str(ref), outcome)

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


__all__ = [
    "ClaimPreparer",
    "PreparerSettings",
]
