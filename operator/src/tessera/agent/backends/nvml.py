"""``NvmlBackend``: real GPUs through pynvml, the only Tessera module that imports it.

It reads everything from the driver (names, memory, MIG profiles and placements, instances,
processes), never from the catalog, except the full GPU's SM count (NVML has no call for it).
NVML errors become ``BackendError`` subclasses whose messages say what failed on which GPU and
what to do. No driver, no GPU, or a lost GPU is reported by ``inventory()``, never raised.

Where a GPU sits (its PCIe root complex, its NUMA node) comes from sysfs by the PCI bus id
NVML reports (``tessera.agent.backends.pci``; ``sysfs`` moves the root for tests).

Things NVML cannot do are done the way NVIDIA's tools do them, through commands run by an
injectable runner: time-slice intervals (``nvidia-smi compute-policy --set-timeslice``) and
MPS control daemons (``nvidia-cuda-mps-control -d`` / ``quit``, one per GPU or MIG device,
each with its own pipe directory under ``mps_root``). NVML cannot read the time-slice back, so
the backend reports the interval it last set (``None`` after a restart: the reconciler sets it
again, which is harmless).

The ``nvml`` argument exists for tests, which pass an NVML stand-in that implements these
same calls on top of ``SimulatedHardware`` (``tests/fake_pynvml.py``).
Not for: deciding layouts, or the simulated backend.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from ctypes import byref, c_uint
from pathlib import Path
from typing import Any

from tessera.agent.backends.base import (
    BackendError,
    BackendTimeoutError,
    CreatedInstance,
    DriverUnavailableError,
    GpuInfo,
    GpuLostError,
    HealthEvent,
    HealthEventKind,
    InsufficientResourcesError,
    InUseError,
    Inventory,
    MigInstanceInfo,
    MigModeResult,
    MpsDefaults,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
    ProfileInfo,
    ResetRequiredError,
)
from tessera.agent.backends.mps import (
    CommandRunner,
    DaemonState,
    MpsDaemons,
    run_checked,
    run_command,
)
from tessera.agent.backends.pci import read_topology
from tessera.models.catalog import SHAPES, model_for_product
from tessera.models.layout import Health
from tessera.models.policy import TimeSliceInterval

MIB = 1024 * 1024
_ARCHITECTURES = {7: "Ampere", 8: "Ada", 9: "Hopper", 10: "Blackwell"}
# compute slices of a GI -> NVML_COMPUTE_INSTANCE_PROFILE_*: its default, full-size CI
_CI_PROFILE_FOR_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_TIME_SLICE_VALUES = {
    TimeSliceInterval.DEFAULT: 0,
    TimeSliceInterval.SHORT: 1,
    TimeSliceInterval.MEDIUM: 2,
    TimeSliceInterval.LONG: 3,
}
_NO_INSTANCE = 0xFFFFFFFF


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """``DeviceBackend`` over NVML. One per process; thread-safe."""

    def __init__(
        self,
        nvml: Any = None,  # the pynvml module, or a stand-in with the same calls (tests)
        *,
        runner: CommandRunner = run_command,
        mps_root: str = "/run/tessera/mps",
        nvidia_smi: str = "nvidia-smi",
        mps_control: str | Sequence[str] = "nvidia-cuda-mps-control",
        sysfs: str = "/sys",
        mps_host: bool = False,  # the node's MPS host starts the daemons (tessera.agent.backends.mpshost)
    ) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._runner = runner
        self._nvidia_smi = nvidia_smi
        control = [mps_control] if isinstance(mps_control, str) else list(mps_control)
        self._daemons = MpsDaemons(Path(mps_root), control, runner, host_program="nvidia" if mps_host else None)
        self._sysfs = Path(sysfs)
        self._lock = threading.RLock()
        self._initialised = False
        self._holds: dict[str, set[str]] = {}
        self._time_slices: dict[str, TimeSliceInterval] = {}
        self._seen: dict[int, tuple[str, str]] = {}  # index -> (uuid, product name), for lost GPUs
        self._event_set: Any = None

    @property
    def name(self) -> str:
        return "nvml"

    # -- errors --

    def _domain_error(self, e: Exception, what: str) -> BackendError:
        """An NVML error as a domain error whose message says what failed and what to do."""
        n = self._nvml
        code = getattr(e, "value", None)
        text = f"{what}: {_nvml_error_text(n, code, e)}"
        table: dict[int, tuple[type[BackendError], str]] = {
            n.NVML_ERROR_IN_USE: (InUseError, "processes use it; wait until they finish"),
            n.NVML_ERROR_INSUFFICIENT_RESOURCES: (
                InsufficientResourcesError,
                "the placement is taken or overlaps another instance",
            ),
            n.NVML_ERROR_NOT_SUPPORTED: (NotSupportedError, "the GPU or driver does not support this"),
            n.NVML_ERROR_RESET_REQUIRED: (ResetRequiredError, "reset the GPU (nvidia-smi -r) or reboot the node"),
            n.NVML_ERROR_NOT_FOUND: (NotFoundError, "it does not exist (any more)"),
            n.NVML_ERROR_GPU_IS_LOST: (GpuLostError, "the GPU fell off the bus; reset it or reboot the node"),
            n.NVML_ERROR_NO_PERMISSION: (NoPermissionError, "run the agent privileged (root, CAP_SYS_ADMIN)"),
            n.NVML_ERROR_TIMEOUT: (BackendTimeoutError, "the driver did not answer in time"),
            n.NVML_ERROR_DRIVER_NOT_LOADED: (DriverUnavailableError, "load the NVIDIA kernel driver"),
            n.NVML_ERROR_LIBRARY_NOT_FOUND: (
                DriverUnavailableError,
                "libnvidia-ml.so.1 is missing: install the NVIDIA driver, or run with --backend simulated",
            ),
        }
        cls, hint = table.get(code, (BackendError, "see the driver's logs (dmesg)")) if code is not None else (
            BackendError,
            "see the driver's logs (dmesg)",
        )
        return cls(f"{text}; {hint}")

    @contextlib.contextmanager
    def _nvml_call(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._nvml.NVMLError as e:
            raise self._domain_error(e, what) from e

    def _ensure_init(self) -> str:
        """"" when NVML is up, else why not."""
        if self._initialised:
            return ""
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as e:
            return str(self._domain_error(e, "NVML could not start"))
        except OSError as e:  # pynvml raises OSError-like errors on some platforms
            return f"NVML could not start: {e}; install the NVIDIA driver, or run with --backend simulated"
        self._initialised = True
        return ""

    def _handle(self, gpu_uuid: str) -> tuple[Any, int]:
        problem = self._ensure_init()
        if problem:
            raise DriverUnavailableError(problem)
        n = self._nvml
        with self._nvml_call(f"GPU {gpu_uuid}"):
            h = n.nvmlDeviceGetHandleByUUID(gpu_uuid)
            index = next((i for i, (u, _) in self._seen.items() if u == gpu_uuid), None)
            if index is None:  # not listed by inventory() yet: find its index for messages
                for i in range(int(n.nvmlDeviceGetCount())):
                    uuid = _s(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)))
                    self._seen.setdefault(i, (uuid, _s(n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(i)))))
                    if uuid == gpu_uuid:
                        index = i
            return h, -1 if index is None else index

    # -- inventory --

    def inventory(self) -> Inventory:
        n = self._nvml
        with self._lock:
            problem = self._ensure_init()
            if problem:
                return Inventory(gpus=(), problem=problem)
            try:
                driver = _s(n.nvmlSystemGetDriverVersion())
                cuda_raw = int(n.nvmlSystemGetCudaDriverVersion())
                count = int(n.nvmlDeviceGetCount())
            except n.NVMLError as e:
                return Inventory(gpus=(), problem=str(self._domain_error(e, "NVML could not list GPUs")))
            cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}"
            gpus: list[GpuInfo] = []
            problems: list[str] = []
            for index in range(count):
                try:
                    gpus.append(self._gpu_info(index))
                except n.NVMLError as e:
                    err = self._domain_error(e, f"GPU {index}")
                    seen = self._seen.get(index)
                    if isinstance(err, GpuLostError) and seen is not None:
                        gpus.append(GpuInfo(seen[0], index, seen[1], 0, health=Health.LOST, health_message=str(err)))
                    else:
                        problems.append(str(err))
            if count == 0:
                problems.append("NVML found no GPU on this node")
            return Inventory(tuple(gpus), driver, cuda, "; ".join(problems))

    def _gpu_info(self, index: int) -> GpuInfo:
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        uuid = _s(n.nvmlDeviceGetUUID(h))
        name = _s(n.nvmlDeviceGetName(h))
        self._seen[index] = (uuid, name)
        memory = int(n.nvmlDeviceGetMemoryInfo(h).total) // MIB
        major, minor = n.nvmlDeviceGetCudaComputeCapability(h)
        arch = self._optional(lambda: _ARCHITECTURES.get(int(n.nvmlDeviceGetArchitecture(h)), ""), "")
        pci = self._optional(lambda: _s(n.nvmlDeviceGetPciInfo(h).busId), None)
        topology = read_topology(self._sysfs, pci)
        numa = topology.numa_node
        if numa is None:  # no sysfs entry (a VM may hide it): the driver's answer, where it has one
            numa = self._optional(lambda: int(n.nvmlDeviceGetNumaNodeId(h)), None)
        device_minor = self._optional(lambda: int(n.nvmlDeviceGetMinorNumber(h)), None)
        try:
            current, pending = n.nvmlDeviceGetMigMode(h)
            capable = True
        except n.NVMLError_NotSupported:
            current = pending = 0
            capable = False
        model = model_for_product(name)
        profiles = self._profiles(h, name) if capable else ()
        processes = list(self._optional(lambda: n.nvmlDeviceGetComputeRunningProcesses(h), []))
        gis = (int(getattr(p, "gpuInstanceId", _NO_INSTANCE)) for p in processes)
        busy_gis = {gi for gi in gis if gi != _NO_INSTANCE}
        instances = self._instances(h, profiles, busy_gis) if capable and current else ()
        in_use = bool(processes) or bool(self._holds.get(uuid)) or any(i.in_use for i in instances)
        return GpuInfo(
            uuid=uuid,
            index=index,
            product_name=name,
            memory_mib=memory,
            multiprocessors=model.multiprocessors if model is not None else 0,
            minor=device_minor,
            cuda_compute_capability=f"{major}.{minor}",
            architecture=arch,
            pci_bus_id=pci,
            pcie_root=topology.pcie_root,
            numa_node=numa if numa is None or numa >= 0 else None,
            mig_capable=capable,
            mig_mode_current=bool(current),
            mig_mode_pending=bool(pending),
            profiles=profiles,
            instances=instances,
            in_use=in_use,
            time_slice=self._time_slices.get(uuid),
            **self._mps_fields(uuid),
            health=Health.HEALTHY,  # it answered; what events say is the agent's to keep
        )

    def _optional(self, read: Callable[[], Any], default: Any) -> Any:
        try:
            return read()
        except self._nvml.NVMLError:
            return default

    def _profiles(self, h: Any, product_name: str) -> tuple[ProfileInfo, ...]:
        n = self._nvml
        model = model_for_product(product_name)
        out: list[ProfileInfo] = []
        for shape in SHAPES.values():
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, shape.nvml_constant)
            except (n.NVMLError_NotSupported, n.NVMLError_InvalidArgument):
                continue
            name = _s(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            if not name and model is not None:
                with contextlib.suppress(ValueError):
                    name = model.profile_of_kind(shape.kind).name
            placements = (n.c_nvmlGpuInstancePlacement_t * 8)()
            count = c_uint(8)
            try:
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, byref(count))
                starts = tuple(sorted(int(placements[k].start) for k in range(count.value)))
                size = int(placements[0].size) if count.value else shape.memory_slices
            except n.NVMLError:
                starts, size = shape.starts, shape.memory_slices
            out.append(
                ProfileInfo(
                    name=name or f"{shape.kind.value}",
                    profile_id=int(info.id),
                    memory_slices=size,  # placements are in memory slices
                    compute_slices=int(info.sliceCount),  # a GI profile's sliceCount counts compute slices
                    memory_mib=int(info.memorySizeMB),
                    multiprocessors=int(info.multiprocessorCount),
                    max_count=int(info.instanceCount),
                    starts=starts,
                )
            )
        return tuple(out)

    def _mig_devices(self, h: Any) -> dict[int, tuple[int, str]]:
        """gpu-instance id -> (compute-instance id, MIG UUID) of every MIG device."""
        n = self._nvml
        out: dict[int, tuple[int, str]] = {}
        for k in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except n.NVMLError_NotFound:
                continue
            gi = int(n.nvmlDeviceGetGpuInstanceId(m))
            out[gi] = (int(n.nvmlDeviceGetComputeInstanceId(m)), _s(n.nvmlDeviceGetUUID(m)))
        return out

    def _instances(self, h: Any, profiles: tuple[ProfileInfo, ...], busy_gis: set[int]) -> tuple[MigInstanceInfo, ...]:
        n = self._nvml
        devices = self._mig_devices(h)
        out: list[MigInstanceInfo] = []
        for p in profiles:
            handles = (n.c_nvmlGpuInstance_t * max(p.max_count, 7))()
            count = c_uint(len(handles))
            n.nvmlDeviceGetGpuInstances(h, p.profile_id, handles, byref(count))
            for k in range(count.value):
                info = n.nvmlGpuInstanceGetInfo(handles[k])
                gi = int(info.id)
                ci, mig_uuid = devices.get(gi, (None, None))
                in_use = gi in busy_gis or (mig_uuid is not None and bool(self._holds.get(mig_uuid)))
                out.append(
                    MigInstanceInfo(
                        gpu_instance_id=gi,
                        profile=p.name,
                        profile_id=p.profile_id,
                        start=int(info.placement.start),
                        size=int(info.placement.size),
                        memory_mib=p.memory_mib,
                        multiprocessors=p.multiprocessors,
                        compute_instance_id=ci,
                        uuid=mig_uuid,
                        in_use=in_use,
                        **(self._mps_fields(mig_uuid) if mig_uuid else {}),
                    )
                )
        return tuple(sorted(out, key=lambda i: (i.start, i.gpu_instance_id)))

    # -- MIG --

    def _busy(self, h: Any, gpu_uuid: str, gpu_instance_id: int | None = None) -> bool:
        n = self._nvml
        processes = self._optional(lambda: n.nvmlDeviceGetComputeRunningProcesses(h), [])
        if gpu_instance_id is None:
            held = bool(self._holds.get(gpu_uuid))
            if self._is_mig_on(h):
                held = held or any(self._holds.get(u) for _, u in self._mig_devices(h).values())
            return bool(processes) or held
        mig = self._mig_devices(h).get(gpu_instance_id)
        return any(int(getattr(p, "gpuInstanceId", _NO_INSTANCE)) == gpu_instance_id for p in processes) or (
            mig is not None and bool(self._holds.get(mig[1]))
        )

    def _is_mig_on(self, h: Any) -> bool:
        try:
            return bool(self._nvml.nvmlDeviceGetMigMode(h)[0])
        except self._nvml.NVMLError:
            return False

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> MigModeResult:
        n = self._nvml
        with self._lock:
            h, index = self._handle(gpu_uuid)
            what = f"GPU {index} ({gpu_uuid}): turn MIG mode {'on' if enabled else 'off'}"
            with self._nvml_call(what):
                current, _ = n.nvmlDeviceGetMigMode(h)
                if bool(current) != enabled and self._busy(h, gpu_uuid):
                    raise InUseError(f"{what}: the GPU is in use; MIG mode changes need an idle GPU")
                with contextlib.suppress(n.NVMLError_ResetRequired):  # Ampere: pending until a reset
                    n.nvmlDeviceSetMigMode(h, n.NVML_DEVICE_MIG_ENABLE if enabled else n.NVML_DEVICE_MIG_DISABLE)
                current, pending = n.nvmlDeviceGetMigMode(h)
            return MigModeResult(bool(current), bool(pending))

    def _profile(self, h: Any, gpu_uuid: str, index: int, name: str) -> ProfileInfo:
        """The profile called ``name``, as the driver describes it."""
        for p in self._profiles(h, _s(self._nvml.nvmlDeviceGetName(h))):
            if p.name == name:
                return p
        raise NotSupportedError(f"GPU {index} ({gpu_uuid}) has no MIG profile {name!r}")

    def create_instance(self, gpu_uuid: str, profile: str, start: int, hold: str | None = None) -> CreatedInstance:
        n = self._nvml
        with self._lock:
            h, index = self._handle(gpu_uuid)
            what = f"GPU {index} ({gpu_uuid}): create {profile} at slice {start}"
            with self._nvml_call(what):
                p = self._profile(h, gpu_uuid, index, profile)
                placement = n.c_nvmlGpuInstancePlacement_t()
                placement.start = start
                placement.size = p.memory_slices
                gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, p.profile_id, byref(placement))
                try:
                    ci_profile = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, _CI_PROFILE_FOR_SLICES[p.compute_slices], n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                    ci = n.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
                    ci_id = int(n.nvmlComputeInstanceGetInfo(ci).id)
                except n.NVMLError:
                    with contextlib.suppress(n.NVMLError):  # leave no GI without its CI behind
                        n.nvmlGpuInstanceDestroy(gi)
                    raise
                gi_id = int(n.nvmlGpuInstanceGetInfo(gi).id)
                _, mig_uuid = self._mig_devices(h)[gi_id]
            if hold is not None:
                self._holds.setdefault(mig_uuid, set()).add(hold)
            return CreatedInstance(gpu_uuid, gi_id, ci_id, mig_uuid, profile, start, p.memory_slices, p.memory_mib)

    def destroy_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        n = self._nvml
        with self._lock:
            h, index = self._handle(gpu_uuid)
            what = f"GPU {index} ({gpu_uuid}): destroy GPU instance {gpu_instance_id}"
            with self._nvml_call(what):
                if self._busy(h, gpu_uuid, gpu_instance_id):
                    raise InUseError(f"{what}: it is in use; it can go when its processes and claims are gone")
                mig = self._mig_devices(h).get(gpu_instance_id)
                gi = n.nvmlDeviceGetGpuInstanceById(h, gpu_instance_id)
                if mig is not None:
                    n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, mig[0]))
                    self._daemons.stop(mig[1])  # a daemon of a device that is gone serves nobody
                n.nvmlGpuInstanceDestroy(gi)

    def hold(self, device_uuid: str, holder: str) -> None:
        with self._lock:
            self._holds.setdefault(device_uuid, set()).add(holder)

    def release(self, device_uuid: str, holder: str) -> None:
        with self._lock:
            holders = self._holds.get(device_uuid, set())
            holders.discard(holder)
            if not holders:
                self._holds.pop(device_uuid, None)

    # -- sharing --

    def _run(self, what: str, argv: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> None:
        run_checked(self._runner, what, argv, env or {}, stdin)

    def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        with self._lock:
            _, index = self._handle(gpu_uuid)
            value = str(_TIME_SLICE_VALUES[interval])
            self._run(
                f"GPU {index} ({gpu_uuid}): set the time slice to {interval}",
                [self._nvidia_smi, "compute-policy", "-i", gpu_uuid, "--set-timeslice", value],
            )
            self._time_slices[gpu_uuid] = interval

    def _mps_fields(self, device_uuid: str) -> dict[str, Any]:
        """What the inventory says about a device's MPS daemon: alive (its pid file names a live
        process that serves the folder), or crashed (started by the agent, now gone)."""
        state = self._daemons.state(device_uuid)
        record = self._daemons.record(device_uuid)
        known = state is not DaemonState.ABSENT
        return {
            "mps_running": state is DaemonState.RUNNING,
            "mps_crashed": state is DaemonState.CRASHED,
            "mps_pipe_directory": str(self._daemons.pipe(device_uuid)) if known else None,
            "mps_defaults": record.defaults if record is not None and state is DaemonState.RUNNING else None,
        }

    def start_mps(self, device_uuid: str, defaults: MpsDefaults | None = None) -> str:
        n = self._nvml
        with self._lock:
            what = f"start an MPS daemon for {device_uuid}"
            if device_uuid.startswith("GPU-") and self._daemons.state(device_uuid) is not DaemonState.RUNNING:
                h, _ = self._handle(device_uuid)
                with self._nvml_call(what):
                    n.nvmlDeviceSetComputeMode(h, n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
            pipe, _ = self._daemons.start(device_uuid, defaults)
            return pipe

    def stop_mps(self, device_uuid: str) -> None:
        n = self._nvml
        with self._lock:
            if self._daemons.state(device_uuid) is DaemonState.ABSENT:
                return
            self._daemons.stop(device_uuid)
            if device_uuid.startswith("GPU-"):
                h, _ = self._handle(device_uuid)
                with self._nvml_call(f"stop the MPS daemon of {device_uuid}"):
                    n.nvmlDeviceSetComputeMode(h, n.NVML_COMPUTEMODE_DEFAULT)

    # -- health --

    def _events(self) -> Any:
        n = self._nvml
        if self._event_set is None:
            es = n.nvmlEventSetCreate()
            for index in range(int(n.nvmlDeviceGetCount())):
                h = n.nvmlDeviceGetHandleByIndex(index)
                with contextlib.suppress(n.NVMLError_NotSupported):
                    kinds = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
                    n.nvmlDeviceRegisterEvents(h, kinds, es)
            self._event_set = es
        return self._event_set

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        n = self._nvml
        with self._lock:
            if self._ensure_init():
                return []
            try:
                es = self._events()
            except n.NVMLError as e:
                raise self._domain_error(e, "register for GPU health events") from e
        try:
            data = n.nvmlEventSetWait_v2(es, max(1, int(timeout_s * 1000)))
        except n.NVMLError_Timeout:
            return []
        except n.NVMLError_GpuIsLost:
            return self._lost_events()
        except n.NVMLError as e:
            raise self._domain_error(e, "wait for GPU health events") from e
        with self._lock:
            uuid = _s(n.nvmlDeviceGetUUID(data.device))
            gi = int(data.gpuInstanceId)
            if int(data.eventType) & n.nvmlEventTypeDoubleBitEccError:
                event = HealthEvent(uuid, HealthEventKind.DOUBLE_BIT_ECC, None, None, "double-bit ECC error")
            else:
                xid = int(data.eventData)
                event = HealthEvent(uuid, HealthEventKind.XID, xid, None if gi == _NO_INSTANCE else gi, f"XID {xid}")
            return [event]

    def _lost_events(self) -> list[HealthEvent]:
        out = []
        for index, (uuid, _) in sorted(self._seen.items()):
            try:
                self._nvml.nvmlDeviceGetHandleByIndex(index)
            except self._nvml.NVMLError_GpuIsLost:
                message = f"GPU {index} has fallen off the bus (GPU_IS_LOST); reset the GPU or reboot the node"
                out.append(HealthEvent(uuid, HealthEventKind.GPU_LOST, message=message))
        return out

    def close(self) -> None:
        with self._lock:
            if not self._initialised:
                return
            if self._event_set is not None:
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._initialised = False


_ERROR_NAMES = (
    "UNINITIALIZED", "INVALID_ARGUMENT", "NOT_SUPPORTED", "NO_PERMISSION", "NOT_FOUND", "INSUFFICIENT_SIZE",
    "DRIVER_NOT_LOADED", "TIMEOUT", "LIBRARY_NOT_FOUND", "FUNCTION_NOT_FOUND", "GPU_IS_LOST", "RESET_REQUIRED",
    "LIB_RM_VERSION_MISMATCH", "IN_USE", "MEMORY", "INSUFFICIENT_RESOURCES", "INVALID_STATE", "UNKNOWN",
)


def _nvml_error_text(n: Any, code: int | None, e: Exception) -> str:
    """``NVML error IN_USE``: the constant's name, which people can search for."""
    for name in _ERROR_NAMES:
        if code is not None and getattr(n, f"NVML_ERROR_{name}", None) == code:
            return f"NVML error {name}"
    return f"NVML error: {e}"
