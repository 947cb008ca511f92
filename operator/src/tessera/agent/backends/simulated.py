"""Simulated GPUs: the hardware model behind ``SimulatedBackend`` and the tests' NVML stand-in.

``SimulatedHardware`` applies the driver's rules to the state (``simstate``) at NVML's
granularity: valid starts, no overlapping placements (INSUFFICIENT_RESOURCES), destroy refused
while in use (IN_USE), MIG mode toggled at once on Hopper and later but left *pending* on
Ampere until ``reset_gpu``. Each operation first lets an injected fault fire (``simfaults``).

With a ``state_file`` every operation locks the file, reads it, changes it and writes it back,
so the simulated hardware outlives an agent process (crash-in-the-middle tests restart the
agent) and a test process can act on it from outside ("start a process on this instance",
"fail the next create", "raise XID 79"). Without one, the state lives in memory.

Health is what the driver would say: ``inject_xid`` / ``inject_ecc_error`` / ``lose_gpu`` deliver
events (a lost GPU also stops answering), ``reset_gpu`` reports a reset; deciding that a GPU is
unhealthy, and when it is healthy again, is the agent's (``tessera.agent.health``).

``SimulatedBackend`` implements ``DeviceBackend`` on top of it; its MPS daemons are real
stand-in processes (``tessera.agent.backends.mpsstandin``, driven by
``tessera.agent.backends.mps``) or, for unit tests, an in-memory model; with a device folder
it makes /dev/nvidia* stand-ins (``simdevices``). The names of those three rooms are also
importable from here, as before. Not for: real GPUs (``tessera.agent.backends.nvml``), or
deciding layouts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tessera.agent.backends.base import (
    BackendError,
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
    NotFoundError,
    NotSupportedError,
    ProfileInfo,
)
from tessera.agent.backends.mps import DaemonState, MpsDaemons
from tessera.agent.backends.simdevices import NVIDIA_MAJOR, UVM_MAJOR, make_device_nodes, simulated_device_nodes
from tessera.agent.backends.simfaults import (
    FAULT_KINDS,
    FAULT_OPERATIONS,
    SimulatedCrash,
    ecc_event,
    fire_fault,
    lose,
    new_fault,
    xid_event,
)
from tessera.agent.backends.simstate import (
    GPUS_PER_PCIE_ROOT,
    NUMA_NODES,
    SIM_CUDA_VERSION,
    SIM_DRIVER_VERSION,
    BoardSlot,
    SimEvent,
    SimFault,
    SimGpu,
    SimInstance,
    SimState,
    board_slot,
    parse_simulate_spec,
    simulated_gpu_uuid,
    simulated_mig_uuid,
)
from tessera.models.catalog import COMPUTE_SLICES, MEMORY_SLICES, GpuModel, MigProfile
from tessera.models.layout import Health
from tessera.models.policy import TimeSliceInterval

# Architectures whose MIG mode change waits for a GPU reset.
_RESET_ARCHITECTURES = frozenset({"Ampere"})
MAX_GPU_INSTANCE_ID = 14


# --- the hardware ------------------------------------------------------------------------------


class SimulatedHardware:
    """Simulated GPUs with the driver's rules, at NVML's granularity (GI and CI separately).

    Indexes are NVML device indexes. Every method is atomic: under a thread lock and, with a
    state file, an exclusive file lock around read-modify-write.
    """

    def __init__(
        self,
        node_name: str,
        models: list[GpuModel] | None = None,
        state_file: Path | None = None,
        mps_root: str = "/run/tessera/mps",
    ) -> None:
        self.node_name = node_name
        self.state_file = state_file
        self.mps_root = mps_root
        self._lock = threading.RLock()
        self._state: SimState | None = None
        self._current: SimState | None = None  # the state of the open transaction
        initial = SimState(
            node_name=node_name,
            gpus=[
                SimGpu(index=i, uuid=simulated_gpu_uuid(node_name, i), model=m.key)
                for i, m in enumerate(models or [])
            ],
        )
        if state_file is None:
            self._state = initial
            return
        state_file.parent.mkdir(parents=True, exist_ok=True)
        with self._file_lock():
            if state_file.exists():
                existing = self._read()
                if existing.node_name != node_name:
                    raise ValueError(
                        f"state file {state_file} belongs to node {existing.node_name!r}, "
                        f"not {node_name!r}; use another file or delete it"
                    )
                wanted = [g.model for g in initial.gpus]
                if models is not None and [g.model for g in existing.gpus] != wanted:
                    raise ValueError(
                        f"state file {state_file} describes GPUs {[g.model for g in existing.gpus]}, "
                        f"the spec asks for {wanted}; delete the file to start over"
                    )
            elif models is None:
                raise ValueError(f"state file {state_file} does not exist and no GPU spec was given")
            else:
                self._write(initial)

    @classmethod
    def open(cls, state_file: Path) -> SimulatedHardware:
        """Attach to existing simulated hardware (e.g. from a test, beside a running agent)."""
        node = json.loads(state_file.read_text())["node_name"]
        return cls(node, None, state_file)

    # -- persistence --

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        assert self.state_file is not None
        lock_path = self.state_file.with_name(self.state_file.name + ".lock")
        with open(lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read(self) -> SimState:
        assert self.state_file is not None
        return SimState.from_json(json.loads(self.state_file.read_text()))

    def _write(self, state: SimState) -> None:
        assert self.state_file is not None
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=1, sort_keys=True))
        os.replace(tmp, self.state_file)

    @contextlib.contextmanager
    def transaction(self, write: bool = True) -> Iterator[SimState]:
        """The state, locked. Re-entrant: a nested call shares the outer one's state. Changes
        are saved when the outermost block ends, also when it raises: like hardware, what was
        done before an error (or an injected crash) stays done."""
        with self._lock:
            if self.state_file is None:
                assert self._state is not None
                yield self._state
                return
            if self._current is not None:
                yield self._current
                return
            with self._file_lock():
                state = self._current = self._read()
                try:
                    yield state
                finally:
                    self._current = None
                    if write:
                        self._write(state)

    def snapshot(self) -> SimState:
        """A deep copy of the state, for reading."""
        with self.transaction(write=False) as s:
            return s.copy()

    # -- helpers (call inside a transaction) --

    @staticmethod
    def _gpu(state: SimState, index: int, *, allow_lost: bool = False) -> SimGpu:
        if not state.driver_available:
            raise DriverUnavailableError("the simulated NVIDIA driver is not loaded")
        if not 0 <= index < len(state.gpus):
            raise NotFoundError(f"no GPU with index {index} (the node has {len(state.gpus)})")
        gpu = state.gpus[index]
        if gpu.lost and not allow_lost:
            raise GpuLostError(f"GPU {index} ({gpu.uuid}) has fallen off the bus; reset or reboot the node")
        return gpu

    @staticmethod
    def _device_in_use(state: SimState, device_uuid: str | None) -> bool:
        return device_uuid is not None and bool(state.holds.get(device_uuid))

    def _gpu_in_use(self, state: SimState, gpu: SimGpu) -> bool:
        return self._device_in_use(state, gpu.uuid) or any(
            self._device_in_use(state, i.uuid) for i in gpu.instances
        )

    # -- reading --

    def gpu_index(self, gpu_uuid: str) -> int:
        with self.transaction(write=False) as s:
            for g in s.gpus:
                if g.uuid == gpu_uuid:
                    return g.index
        raise NotFoundError(f"no GPU {gpu_uuid} on node {self.node_name}")

    def holders(self, device_uuid: str) -> list[str]:
        with self.transaction(write=False) as s:
            return list(s.holds.get(device_uuid, []))

    # -- MIG mode --

    def set_mig_mode(self, index: int, enabled: bool) -> tuple[bool, bool]:
        """Returns (current, pending) after the call."""
        with self.transaction() as s:
            gpu = self._gpu(s, index)
            if not gpu.catalog.mig_capable:
                raise NotSupportedError(f"GPU {index} ({gpu.model}) does not support MIG")
            fire_fault(s, "set_mig_mode", index)
            if enabled == gpu.mig_current:
                gpu.mig_pending = enabled
                return gpu.mig_current, gpu.mig_pending
            if self._gpu_in_use(s, gpu):
                raise InUseError(f"GPU {index} ({gpu.uuid}) has processes; MIG mode needs an idle GPU")
            if not enabled and gpu.instances:
                raise InUseError(
                    f"GPU {index} ({gpu.uuid}) still has {len(gpu.instances)} MIG instances; destroy them first"
                )
            gpu.mig_pending = enabled
            if gpu.catalog.architecture not in _RESET_ARCHITECTURES:
                gpu.mig_current = enabled
            return gpu.mig_current, gpu.mig_pending

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: pending MIG mode takes effect, instances and daemons go, a lost GPU
        answers again, and the driver reports the reset (an event), so health can return."""
        with self.transaction() as s:
            gpu = self._gpu(s, index, allow_lost=True)
            if self._gpu_in_use(s, gpu):
                raise InUseError(f"GPU {index} ({gpu.uuid}) has processes; a reset needs an idle GPU")
            for i in gpu.instances:
                if i.uuid is not None:
                    s.mps.pop(i.uuid, None)
            s.mps.pop(gpu.uuid, None)
            gpu.instances.clear()
            gpu.mig_current = gpu.mig_pending
            gpu.compute_mode = 0
            gpu.lost = False
            gpu.health = Health.HEALTHY.value
            gpu.health_message = ""
            s.events.append(SimEvent(index, HealthEventKind.GPU_RESET.value, message=f"GPU {index} was reset"))

    # -- instances --

    def create_gpu_instance(self, index: int, profile_id: int, start: int) -> int:
        with self.transaction() as s:
            gpu = self._gpu(s, index)
            if not gpu.mig_current:
                raise NotSupportedError(f"GPU {index} ({gpu.uuid}) is not in MIG mode")
            profile = gpu.profile_by_id(profile_id)
            fire_fault(s, "create_gpu_instance", index)
            if start not in profile.starts:
                raise InsufficientResourcesError(
                    f"GPU {index}: {profile.name} cannot start at slice {start} "
                    f"(valid starts: {', '.join(map(str, profile.starts))})"
                )
            size = profile.memory_slices
            for other in gpu.instances:
                if other.start < start + size and start < other.start + other.size:
                    raise InsufficientResourcesError(
                        f"GPU {index}: {profile.name} at slice {start} overlaps GPU instance "
                        f"{other.gpu_instance_id} at slices {other.start}-{other.start + other.size - 1}"
                    )
            same = sum(1 for o in gpu.instances if o.profile_id == profile_id)
            if same >= profile.max_count:
                raise InsufficientResourcesError(
                    f"GPU {index}: at most {profile.max_count} instances of {profile.name}"
                )
            compute = sum(gpu.profile_by_id(o.profile_id).compute_slices for o in gpu.instances)
            if compute + profile.compute_slices > COMPUTE_SLICES or start + size > MEMORY_SLICES:
                raise InsufficientResourcesError(f"GPU {index}: not enough compute slices left for {profile.name}")
            used = {o.gpu_instance_id for o in gpu.instances}
            gi_id = next(n for n in range(1, MAX_GPU_INSTANCE_ID + 1) if n not in used)
            gpu.instances.append(SimInstance(gi_id, profile_id, start, size))
            gpu.instances.sort(key=lambda i: (i.start, i.gpu_instance_id))
            return gi_id

    def create_compute_instance(self, index: int, gpu_instance_id: int) -> tuple[int, str]:
        """The default (full-size) compute instance of a GI; returns (CI id, MIG UUID)."""
        with self.transaction() as s:
            gpu = self._gpu(s, index)
            gi = gpu.instance(gpu_instance_id)
            fire_fault(s, "create_compute_instance", index)
            if gi.compute_instance_id is not None:
                raise InsufficientResourcesError(
                    f"GPU {index}: GPU instance {gpu_instance_id} already has its compute instance"
                )
            gi.compute_instance_id = 0
            gi.uuid = simulated_mig_uuid(gpu.uuid, gi.gpu_instance_id, gi.profile_id, gi.start)
            return 0, gi.uuid

    def destroy_compute_instance(self, index: int, gpu_instance_id: int) -> None:
        with self.transaction() as s:
            gpu = self._gpu(s, index)
            gi = gpu.instance(gpu_instance_id)
            if gi.compute_instance_id is None:
                raise NotFoundError(f"GPU {index}: GPU instance {gpu_instance_id} has no compute instance")
            if self._device_in_use(s, gi.uuid):
                raise InUseError(f"GPU {index}: MIG device {gi.uuid} has processes")
            fire_fault(s, "destroy_compute_instance", index)
            if gi.uuid is not None:
                s.mps.pop(gi.uuid, None)
            gi.compute_instance_id = None
            gi.uuid = None

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        with self.transaction() as s:
            gpu = self._gpu(s, index)
            gi = gpu.instance(gpu_instance_id)
            if gi.compute_instance_id is not None:
                raise InUseError(
                    f"GPU {index}: GPU instance {gpu_instance_id} still has a compute instance; destroy it first"
                )
            fire_fault(s, "destroy_gpu_instance", index)
            gpu.instances.remove(gi)

    # -- in use --

    def hold(self, device_uuid: str, holder: str) -> None:
        """A process (or a claim) starts using a GPU or MIG device."""
        with self.transaction() as s:
            if not any(
                g.uuid == device_uuid or any(i.uuid == device_uuid for i in g.instances) for g in s.gpus
            ):
                raise NotFoundError(f"no GPU or MIG device {device_uuid} on node {s.node_name}")
            holders = s.holds.setdefault(device_uuid, [])
            if holder not in holders:
                holders.append(holder)
                holders.sort()

    def release(self, device_uuid: str, holder: str) -> None:
        with self.transaction() as s:
            holders = s.holds.get(device_uuid, [])
            if holder in holders:
                holders.remove(holder)
            if not holders:
                s.holds.pop(device_uuid, None)

    # -- sharing --

    def set_time_slice(self, index: int, interval: TimeSliceInterval) -> None:
        with self.transaction() as s:
            gpu = self._gpu(s, index)
            fire_fault(s, "set_time_slice", index)
            gpu.time_slice = interval.value

    def set_compute_mode(self, index: int, mode: int) -> None:
        with self.transaction() as s:
            self._gpu(s, index).compute_mode = mode

    def _find_device(self, s: SimState, device_uuid: str) -> tuple[SimGpu, SimInstance | None]:
        for g in s.gpus:
            if g.uuid == device_uuid:
                return g, None
            for i in g.instances:
                if i.uuid == device_uuid:
                    return g, i
        raise NotFoundError(f"no GPU or MIG device {device_uuid} on node {s.node_name}")

    def check_mps(self, device_uuid: str, operation: str) -> None:
        """What the driver checks before an MPS daemon starts or stops on a device (it exists,
        its GPU answers), and the faults a test injected for ``operation``."""
        with self.transaction() as s:
            gpu, _ = self._find_device(s, device_uuid)
            self._gpu(s, gpu.index)
            fire_fault(s, operation, gpu.index)

    def start_mps(self, device_uuid: str, defaults: MpsDefaults | None = None) -> str:
        """The in-memory model of a daemon (no process): a pipe folder name and its defaults."""
        with self.transaction() as s:
            self.check_mps(device_uuid, "start_mps")
            pipe = s.mps.get(device_uuid) or f"{self.mps_root}/{device_uuid}"
            s.mps[device_uuid] = pipe
            if defaults is not None or device_uuid not in s.mps_defaults:
                s.mps_defaults[device_uuid] = asdict(defaults or MpsDefaults())
            return pipe

    def stop_mps(self, device_uuid: str) -> None:
        with self.transaction() as s:
            if device_uuid not in s.mps:
                return
            gpu, _ = self._find_device(s, device_uuid)
            fire_fault(s, "stop_mps", gpu.index)
            del s.mps[device_uuid]
            s.mps_defaults.pop(device_uuid, None)

    # -- faults and health --

    def fail_next(
        self, operation: str, error: str, gpu_index: int | None = None, count: int = 1, after: int = 0
    ) -> None:
        """After ``after`` good calls, the next ``count`` calls of ``operation`` (on ``gpu_index``,
        or any GPU) fail with ``error`` (a BackendError kind, or ``Crash``)."""
        fault = new_fault(operation, error, gpu_index, count, after)
        with self.transaction() as s:
            s.faults.append(fault)

    def clear_faults(self) -> None:
        with self.transaction() as s:
            s.faults.clear()

    def inject_xid(self, index: int, xid: int, gpu_instance_id: int | None = None) -> None:
        """The driver reports XID ``xid`` on GPU ``index`` (an event, as NVML delivers it; the
        GPU still answers probes). The agent marks the GPU unhealthy for a fatal one."""
        with self.transaction() as s:
            self._gpu(s, index, allow_lost=True)
            s.events.append(xid_event(index, xid, gpu_instance_id))

    def inject_ecc_error(self, index: int) -> None:
        """The driver reports a double-bit ECC error on GPU ``index`` (fatal)."""
        with self.transaction() as s:
            self._gpu(s, index, allow_lost=True)
            s.events.append(ecc_event(index))

    def lose_gpu(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every call on it fails with GPU_IS_LOST until a reset."""
        with self.transaction() as s:
            s.events.append(lose(self._gpu(s, index, allow_lost=True)))

    def set_driver_available(self, available: bool) -> None:
        with self.transaction() as s:
            s.driver_available = available

    def pop_events(self) -> list[SimEvent]:
        with self.transaction() as s:
            out = list(s.events)
            s.events.clear()
            return out


# --- the backend -------------------------------------------------------------------------------


def _profile_info(p: MigProfile) -> ProfileInfo:
    return ProfileInfo(
        name=p.name,
        profile_id=p.shape.profile_id,
        memory_slices=p.memory_slices,
        compute_slices=p.compute_slices,
        memory_mib=p.memory_mib,
        multiprocessors=p.multiprocessors,
        max_count=p.max_count,
        starts=p.starts,
    )


# The MPS control program of the simulated backend: a stand-in process with the real one's surface.
STANDIN_MPS_CONTROL = (sys.executable, "-m", "tessera.agent.backends.mpsstandin")


class SimulatedBackend:
    """``DeviceBackend`` over ``SimulatedHardware``: deterministic, fault-injectable GPUs.

    MPS daemons are real stand-in processes (``daemons``, as the agent runs it: they have pids
    and pipe folders, outlive the agent, can be killed) or, without ``daemons``, an in-memory
    model in the hardware state (unit tests).

    With a ``device_dir`` the simulated GPUs are runnable: that folder holds character devices
    for /dev/nvidiactl, /dev/nvidia-uvm(-tools) and /dev/nvidia<minor> (the kubelet plugin
    maps the container paths to them in its CDI specs), and the MPS pipe folder the specs
    mount exists, as a real MPS daemon's would."""

    def __init__(
        self, hardware: SimulatedHardware, daemons: MpsDaemons | None = None, device_dir: Path | None = None
    ) -> None:
        self.hardware = hardware
        self.daemons = daemons
        self.device_dir = device_dir
        if device_dir is not None:
            make_device_nodes(device_dir, [g.minor if g.minor is not None else g.index
                                           for g in self.inventory().gpus])

    @classmethod
    def from_spec(
        cls,
        node_name: str,
        spec: str,
        state_file: Path | None = None,
        mps_root: str = "/run/tessera/mps",
        mps_processes: bool = False,
        device_dir: Path | None = None,
        mps_host: bool = False,  # the node's MPS host starts the stand-ins (tessera.agent.backends.mpshost)
    ) -> SimulatedBackend:
        host_program = "standin" if mps_host else None
        daemons = MpsDaemons(Path(mps_root), STANDIN_MPS_CONTROL, host_program=host_program) if mps_processes else None
        return cls(SimulatedHardware(node_name, parse_simulate_spec(spec), state_file, mps_root), daemons, device_dir)

    @property
    def name(self) -> str:
        return "simulated"

    def inventory(self) -> Inventory:
        s = self.hardware.snapshot()
        if not s.driver_available:
            return Inventory(gpus=(), problem="the simulated NVIDIA driver is not loaded")
        return Inventory(
            gpus=tuple(self._gpu_info(s, g) for g in s.gpus),
            driver_version=SIM_DRIVER_VERSION,
            cuda_version=SIM_CUDA_VERSION,
        )

    def _mps_fields(self, s: SimState, device_uuid: str) -> dict[str, Any]:
        if self.daemons is None:
            defaults = s.mps_defaults.get(device_uuid)
            return {
                "mps_running": device_uuid in s.mps,
                "mps_pipe_directory": s.mps.get(device_uuid),
                "mps_defaults": MpsDefaults(**defaults) if defaults is not None and device_uuid in s.mps else None,
            }
        state = self.daemons.state(device_uuid)
        record = self.daemons.record(device_uuid)
        return {
            "mps_running": state is DaemonState.RUNNING,
            "mps_crashed": state is DaemonState.CRASHED,
            "mps_pipe_directory": str(self.daemons.pipe(device_uuid)) if state is not DaemonState.ABSENT else None,
            "mps_defaults": record.defaults if record is not None and state is DaemonState.RUNNING else None,
        }

    def _gpu_info(self, s: SimState, g: SimGpu) -> GpuInfo:
        model = g.catalog
        slot = board_slot(g.index, len(s.gpus))

        def busy(device: str | None) -> bool:
            return device is not None and bool(s.holds.get(device))

        instances = []
        for i in g.instances:
            p = g.profile_by_id(i.profile_id)
            instances.append(
                MigInstanceInfo(
                    gpu_instance_id=i.gpu_instance_id,
                    profile=p.name,
                    profile_id=i.profile_id,
                    start=i.start,
                    size=i.size,
                    memory_mib=p.memory_mib,
                    multiprocessors=p.multiprocessors,
                    compute_instance_id=i.compute_instance_id,
                    uuid=i.uuid,
                    in_use=busy(i.uuid),
                    **(self._mps_fields(s, i.uuid) if i.uuid else {}),
                )
            )
        return GpuInfo(
            uuid=g.uuid,
            index=g.index,
            product_name=model.product_name,
            memory_mib=model.memory_mib,
            multiprocessors=model.multiprocessors,
            cuda_compute_capability=model.compute_capability,
            architecture=model.architecture,
            pci_bus_id=slot.pci_bus_id,
            pcie_root=slot.pcie_root,
            numa_node=slot.numa_node,
            mig_capable=model.mig_capable,
            mig_mode_current=g.mig_current,
            mig_mode_pending=g.mig_pending,
            profiles=tuple(_profile_info(p) for p in model.profiles),
            instances=() if g.lost else tuple(instances),
            in_use=busy(g.uuid) or any(i.in_use for i in instances),
            time_slice=TimeSliceInterval(g.time_slice),
            **self._mps_fields(s, g.uuid),
            health=Health(g.health),
            health_message=g.health_message,
        )

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> MigModeResult:
        current, pending = self.hardware.set_mig_mode(self.hardware.gpu_index(gpu_uuid), enabled)
        return MigModeResult(current, pending)

    def create_instance(self, gpu_uuid: str, profile: str, start: int, hold: str | None = None) -> CreatedInstance:
        hw = self.hardware
        with hw.transaction() as state:  # one step: nobody sees the instance before it is held
            index = hw.gpu_index(gpu_uuid)
            try:
                p = state.gpus[index].catalog.profile(profile)  # the model only: read, not copied
            except ValueError as e:
                raise NotSupportedError(f"GPU {index}: {e}") from None
            gi = hw.create_gpu_instance(index, p.shape.profile_id, start)
            try:
                ci, mig_uuid = hw.create_compute_instance(index, gi)
                if hold is not None:
                    hw.hold(mig_uuid, hold)
            except BackendError:
                with contextlib.suppress(BackendError):
                    hw.destroy_gpu_instance(index, gi)  # do not leave a GI without its CI behind
                raise
        return CreatedInstance(gpu_uuid, gi, ci, mig_uuid, profile, start, p.memory_slices, p.memory_mib)

    def destroy_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        hw = self.hardware
        index = hw.gpu_index(gpu_uuid)
        with hw.transaction() as s:  # one step: the nested calls share this transaction
            gi = hw._gpu(s, index).instance(gpu_instance_id)
            mig_uuid = gi.uuid
            if gi.compute_instance_id is not None:
                hw.destroy_compute_instance(index, gpu_instance_id)
            hw.destroy_gpu_instance(index, gpu_instance_id)
        if self.daemons is not None and mig_uuid is not None:
            self.daemons.stop(mig_uuid)  # a daemon of a device that is gone serves nobody

    def hold(self, device_uuid: str, holder: str) -> None:
        self.hardware.hold(device_uuid, holder)

    def release(self, device_uuid: str, holder: str) -> None:
        self.hardware.release(device_uuid, holder)

    def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        self.hardware.set_time_slice(self.hardware.gpu_index(gpu_uuid), interval)

    def start_mps(self, device_uuid: str, defaults: MpsDefaults | None = None) -> str:
        if self.daemons is None:
            pipe = self.hardware.start_mps(device_uuid, defaults)
        else:
            self.hardware.check_mps(device_uuid, "start_mps")
            pipe, _ = self.daemons.start(device_uuid, defaults)
        if self.device_dir is not None:
            Path(pipe).mkdir(parents=True, exist_ok=True)
        return pipe

    def stop_mps(self, device_uuid: str) -> None:
        if self.daemons is None:
            self.hardware.stop_mps(device_uuid)
            return
        if self.daemons.state(device_uuid) is DaemonState.ABSENT:
            return
        self.hardware.check_mps(device_uuid, "stop_mps")
        self.daemons.stop(device_uuid)

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        deadline = time.monotonic() + timeout_s
        while True:
            events = self.hardware.pop_events()
            if events:
                uuids = {g.index: g.uuid for g in self.hardware.snapshot().gpus}
                return [
                    HealthEvent(uuids[e.gpu_index], HealthEventKind(e.kind), e.xid, e.gpu_instance_id, e.message)
                    for e in events
                ]
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(0.05, left))

    def close(self) -> None:
        """Nothing to release: the state file is closed after every operation."""


__all__ = [  # the rooms' names, importable from here as before the split
    "FAULT_KINDS",
    "FAULT_OPERATIONS",
    "GPUS_PER_PCIE_ROOT",
    "NUMA_NODES",
    "NVIDIA_MAJOR",
    "SIM_CUDA_VERSION",
    "SIM_DRIVER_VERSION",
    "STANDIN_MPS_CONTROL",
    "UVM_MAJOR",
    "BoardSlot",
    "SimEvent",
    "SimFault",
    "SimGpu",
    "SimInstance",
    "SimState",
    "SimulatedBackend",
    "SimulatedCrash",
    "SimulatedHardware",
    "board_slot",
    "make_device_nodes",
    "parse_simulate_spec",
    "simulated_device_nodes",
    "simulated_gpu_uuid",
    "simulated_mig_uuid",
]
