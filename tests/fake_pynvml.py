"""An NVML stand-in for tests: the pynvml calls ``NvmlBackend`` uses, on top of ``SimulatedHardware``.

So both backends are driven by the same simulated GPUs (NVIDIA's own CI does the same with a
mock NVML). Errors, ctypes structures and constants are pynvml's own: only the functions that
would call into ``libnvidia-ml.so`` are replaced, with the semantics FACTS.md records
(INSUFFICIENT_RESOURCES on overlap, IN_USE on busy destroy, MIG mode pending on Ampere,
GPU_IS_LOST on a lost GPU, caller-allocated arrays for placements and GPU instances).
Not for: production; nothing in ``tessera`` imports it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pynvml

from tessera.agent.backends.base import (
    BackendError,
    BackendTimeoutError,
    DriverUnavailableError,
    GpuLostError,
    InsufficientResourcesError,
    InUseError,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
    ResetRequiredError,
)
from tessera.agent.backends.simulated import (
    SIM_CUDA_VERSION,
    SIM_DRIVER_VERSION,
    SimGpu,
    SimState,
    SimulatedHardware,
    board_slot,
)
from tessera.models.catalog import SHAPES

_CODES: dict[type[BackendError], int] = {
    InUseError: pynvml.NVML_ERROR_IN_USE,
    InsufficientResourcesError: pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES,
    NotSupportedError: pynvml.NVML_ERROR_NOT_SUPPORTED,
    ResetRequiredError: pynvml.NVML_ERROR_RESET_REQUIRED,
    NotFoundError: pynvml.NVML_ERROR_NOT_FOUND,
    GpuLostError: pynvml.NVML_ERROR_GPU_IS_LOST,
    NoPermissionError: pynvml.NVML_ERROR_NO_PERMISSION,
    BackendTimeoutError: pynvml.NVML_ERROR_TIMEOUT,
    DriverUnavailableError: pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
}
_ARCH = {"Ampere": pynvml.NVML_DEVICE_ARCH_AMPERE, "Hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
         "Blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL}


@dataclass(frozen=True)
class Dev:
    index: int


@dataclass(frozen=True)
class MigDev:
    index: int
    gpu_instance_id: int


@dataclass(frozen=True)
class Ci:
    index: int
    gpu_instance_id: int
    id: int


class _Obj:
    """A pynvml-friendly result object with attributes."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class FakeNvml:
    """Looks like the ``pynvml`` module to ``NvmlBackend``; backed by ``SimulatedHardware``."""

    def __init__(self, hardware: SimulatedHardware, *, library_missing: bool = False) -> None:
        self.hw = hardware
        self.library_missing = library_missing
        self.calls: list[str] = []
        self._gi_structs: dict[tuple[int, int], Any] = {}
        self._gi_by_address: dict[int, tuple[int, int]] = {}

    def __getattr__(self, name: str) -> Any:
        # Constants, ctypes structures and error classes come from the real module.
        if name.startswith("nvml") and callable(getattr(pynvml, name, None)) and not name.startswith("nvmlEventType"):
            raise AttributeError(f"FakeNvml does not implement {name}; NvmlBackend must not call it")
        return getattr(pynvml, name)

    # -- plumbing --

    @contextmanager
    def _nvml(self, call: str) -> Iterator[None]:
        self.calls.append(call)
        try:
            yield
        except BackendError as e:
            raise pynvml.NVMLError(_CODES.get(type(e), pynvml.NVML_ERROR_UNKNOWN)) from e

    def _state(self) -> SimState:
        return self.hw.snapshot()

    def _gpu(self, index: int) -> SimGpu:
        s = self._state()
        if not s.driver_available:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if not 0 <= index < len(s.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = s.gpus[index]
        if g.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    def _gi_handle(self, index: int, gi_id: int) -> Any:
        key = (index, gi_id)
        if key not in self._gi_structs:
            struct = pynvml.struct_c_nvmlGpuInstance_t()
            self._gi_structs[key] = struct
            self._gi_by_address[ctypes.addressof(struct)] = key
        return ctypes.pointer(self._gi_structs[key])

    def _gi_key(self, handle: Any) -> tuple[int, int]:
        return self._gi_by_address[ctypes.addressof(handle.contents)]

    # -- init and system --

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.library_missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if not self._state().driver_available:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return SIM_DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        major, minor = SIM_CUDA_VERSION.split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self._state().gpus)

    # -- devices --

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Dev:  # noqa: N802
        self._gpu(index)
        return Dev(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Dev:  # noqa: N802
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self._state().gpus:
            if g.uuid == text:
                self._gpu(g.index)
                return Dev(g.index)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, h: Dev | MigDev) -> str:  # noqa: N802
        g = self._gpu(h.index)
        if isinstance(h, MigDev):
            gi = next(i for i in g.instances if i.gpu_instance_id == h.gpu_instance_id)
            assert gi.uuid is not None
            return gi.uuid
        return g.uuid

    def nvmlDeviceGetName(self, h: Dev) -> str:  # noqa: N802
        return self._gpu(h.index).catalog.product_name

    def nvmlDeviceGetMemoryInfo(self, h: Dev) -> _Obj:  # noqa: N802
        total = self._gpu(h.index).catalog.memory_mib * 1024 * 1024
        return _Obj(total=total, free=total, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, h: Dev) -> tuple[int, int]:  # noqa: N802
        major, minor = self._gpu(h.index).catalog.compute_capability.split(".")
        return int(major), int(minor)

    def nvmlDeviceGetArchitecture(self, h: Dev) -> int:  # noqa: N802
        return int(_ARCH[self._gpu(h.index).catalog.architecture])

    def nvmlDeviceGetPciInfo(self, h: Dev) -> _Obj:  # noqa: N802
        return _Obj(busId=board_slot(h.index, len(self._state().gpus)).pci_bus_id.encode())

    def nvmlDeviceGetMinorNumber(self, h: Dev) -> int:  # noqa: N802
        # Not the index, so a test can tell the two apart (real drivers may differ too).
        return 64 + h.index

    def nvmlDeviceGetNumaNodeId(self, h: Dev) -> int:  # noqa: N802
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as on many single-socket hosts

    def nvmlDeviceGetComputeRunningProcesses(self, h: Dev) -> list[_Obj]:  # noqa: N802
        s = self._state()
        g = self._gpu(h.index)
        procs = []
        for device, holders in sorted(s.holds.items()):
            gi = next((i for i in g.instances if i.uuid == device), None)
            if device != g.uuid and gi is None:
                continue
            for n, _holder in enumerate(holders):
                procs.append(_Obj(
                    pid=4000 + n, usedGpuMemory=1 << 30,
                    gpuInstanceId=gi.gpu_instance_id if gi else 0xFFFFFFFF,
                    computeInstanceId=gi.compute_instance_id if gi else 0xFFFFFFFF,
                ))
        return procs

    def nvmlDeviceSetComputeMode(self, h: Dev, mode: int) -> None:  # noqa: N802
        with self._nvml("nvmlDeviceSetComputeMode"):
            self.hw.set_compute_mode(h.index, mode)

    # -- MIG mode --

    def nvmlDeviceGetMigMode(self, h: Dev) -> list[int]:  # noqa: N802
        g = self._gpu(h.index)
        if not g.catalog.mig_capable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [int(g.mig_current), int(g.mig_pending)]

    def nvmlDeviceSetMigMode(self, h: Dev, mode: int) -> int:  # noqa: N802
        with self._nvml("nvmlDeviceSetMigMode"):
            current, pending = self.hw.set_mig_mode(h.index, mode == pynvml.NVML_DEVICE_MIG_ENABLE)
        return int(pynvml.NVML_SUCCESS if current == pending else pynvml.NVML_ERROR_RESET_REQUIRED)

    # -- profiles and placements --

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Dev, constant: int, version: int = 2) -> _Obj:  # noqa: N802
        g = self._gpu(h.index)
        for p in g.catalog.profiles:
            if p.shape.nvml_constant == constant:
                return _Obj(
                    id=p.shape.profile_id, sliceCount=p.compute_slices, instanceCount=p.max_count,
                    multiprocessorCount=p.multiprocessors, memorySizeMB=p.memory_mib,
                    name=f"MIG {p.name}".encode(),
                )
        if constant not in {s.nvml_constant for s in SHAPES.values()}:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(  # noqa: N802
        self, h: Dev, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        g = self._gpu(h.index)
        with self._nvml("nvmlDeviceGetGpuInstancePossiblePlacements"):
            p = g.profile_by_id(profile_id)
        count = count_ref._obj
        if len(p.starts) > count.value:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, start in enumerate(p.starts):
            placements[k].start = start
            placements[k].size = p.memory_slices
        count.value = len(p.starts)
        return int(pynvml.NVML_SUCCESS)

    # -- GPU instances --

    def nvmlDeviceGetGpuInstances(self, h: Dev, profile_id: int, handles: Any, count_ref: Any) -> int:  # noqa: N802
        g = self._gpu(h.index)
        mine = [i for i in g.instances if i.profile_id == profile_id]
        count = count_ref._obj
        if len(mine) > count.value:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for k, i in enumerate(mine):
            handles[k] = self._gi_handle(h.index, i.gpu_instance_id)
        count.value = len(mine)
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> _Obj:  # noqa: N802
        index, gi_id = self._gi_key(gi)
        with self._nvml("nvmlGpuInstanceGetInfo"):
            i = self._gpu(index).instance(gi_id)
        return _Obj(device=Dev(index), id=i.gpu_instance_id, profileId=i.profile_id,
                    placement=_Obj(start=i.start, size=i.size))

    def nvmlDeviceGetGpuInstanceById(self, h: Dev, gi_id: int) -> Any:  # noqa: N802
        with self._nvml("nvmlDeviceGetGpuInstanceById"):
            self._gpu(h.index).instance(gi_id)
        return self._gi_handle(h.index, gi_id)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: Dev, profile_id: int, placement: Any) -> Any:  # noqa: N802
        start = placement._obj.start
        with self._nvml("nvmlDeviceCreateGpuInstanceWithPlacement"):
            gi_id = self.hw.create_gpu_instance(h.index, profile_id, start)
        return self._gi_handle(h.index, gi_id)

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:  # noqa: N802
        index, gi_id = self._gi_key(gi)
        with self._nvml("nvmlGpuInstanceDestroy"):
            self.hw.destroy_gpu_instance(index, gi_id)
        return int(pynvml.NVML_SUCCESS)

    # -- compute instances and MIG devices --

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(  # noqa: N802
        self, gi: Any, profile: int, eng_profile: int, version: int = 2
    ) -> _Obj:
        return _Obj(id=profile, sliceCount=profile + 1, instanceCount=1)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, ci_profile_id: int) -> Ci:  # noqa: N802
        index, gi_id = self._gi_key(gi)
        with self._nvml("nvmlGpuInstanceCreateComputeInstance"):
            ci_id, _ = self.hw.create_compute_instance(index, gi_id)
        return Ci(index, gi_id, ci_id)

    def nvmlComputeInstanceGetInfo(self, ci: Ci) -> _Obj:  # noqa: N802
        return _Obj(id=ci.id, gpuInstance=self._gi_handle(ci.index, ci.gpu_instance_id))

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, ci_id: int) -> Ci:  # noqa: N802
        index, gi_id = self._gi_key(gi)
        with self._nvml("nvmlGpuInstanceGetComputeInstanceById"):
            i = self._gpu(index).instance(gi_id)
        if i.compute_instance_id != ci_id:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return Ci(index, gi_id, ci_id)

    def nvmlComputeInstanceDestroy(self, ci: Ci) -> int:  # noqa: N802
        with self._nvml("nvmlComputeInstanceDestroy"):
            self.hw.destroy_compute_instance(ci.index, ci.gpu_instance_id)
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Dev) -> int:  # noqa: N802
        self._gpu(h.index)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Dev, k: int) -> MigDev:  # noqa: N802
        devices = [i for i in self._gpu(h.index).instances if i.uuid is not None]
        if k >= len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return MigDev(h.index, devices[k].gpu_instance_id)

    def nvmlDeviceGetGpuInstanceId(self, m: MigDev) -> int:  # noqa: N802
        return m.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, m: MigDev) -> int:  # noqa: N802
        ci = self._gpu(m.index).instance(m.gpu_instance_id).compute_instance_id
        assert ci is not None
        return ci

    # -- events --

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        return object()

    def nvmlDeviceRegisterEvents(self, h: Dev, kinds: int, es: object) -> None:  # noqa: N802
        self._gpu(h.index)

    def nvmlEventSetWait_v2(self, es: object, timeout_ms: int) -> _Obj:  # noqa: N802
        events = [e for e in self.hw.pop_events() if e.kind != "GpuReset"]  # NVML reports no resets
        if not events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        e = events[0]
        if e.kind == "GpuLost":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        ecc = e.kind == "DoubleBitEcc"
        kind = pynvml.nvmlEventTypeDoubleBitEccError if ecc else pynvml.nvmlEventTypeXidCriticalError
        return _Obj(device=Dev(e.gpu_index), eventType=kind,
                    eventData=e.xid or 0,
                    gpuInstanceId=e.gpu_instance_id if e.gpu_instance_id is not None else 0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF)

    def nvmlEventSetFree(self, es: object) -> None:  # noqa: N802
        pass


class RecordingRunner:
    """A command runner for NvmlBackend that records every command. ``nvidia-smi`` only pretends;
    the MPS control program (the stand-in, ``STANDIN_MPS_CONTROL``) really runs, so daemons
    are real processes with pids and pipe folders."""

    def __init__(self) -> None:
        self.commands: list[tuple[list[str], dict[str, str], str | None]] = []
        self.fail: Callable[[list[str]], str | None] = lambda argv: None

    def __call__(self, argv: list[str], env: dict[str, str], stdin: str | None) -> Any:
        from tessera.agent.backends.mps import CommandResult, run_command

        self.commands.append((argv, env, stdin))
        error = self.fail(argv)
        if error:
            return CommandResult(1, "", error)
        if argv[0] == "nvidia-smi":
            return CommandResult(0, "", "")
        return run_command(argv, env, stdin)


BACKEND_KINDS = ("simulated", "nvml")


def backend_over(kind: str, hardware: SimulatedHardware, mps_root: str = "/tmp/tessera-test-mps") -> Any:
    """A fresh backend of ``kind`` over ``hardware``: a new one models an agent restart."""
    from tessera.agent.backends.nvml import NvmlBackend
    from tessera.agent.backends.simulated import SimulatedBackend

    if kind == "simulated":
        return SimulatedBackend(hardware)
    from tessera.agent.backends.simulated import STANDIN_MPS_CONTROL

    return NvmlBackend(FakeNvml(hardware), runner=RecordingRunner(), mps_root=mps_root, mps_control=STANDIN_MPS_CONTROL)
