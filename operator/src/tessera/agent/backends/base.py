"""The ``DeviceBackend`` protocol: the one interface through which Tessera touches GPUs.

Two implementations share it: ``NvmlBackend`` (``tessera.agent.backends.nvml``, real hardware through
pynvml) and ``SimulatedBackend`` (``tessera.agent.backends.simulated``, GPUs from the catalog). The
node agent's reconciler and the DRA kubelet plugin both drive GPUs only through this protocol,
so the same tests prove both.

Contract, for every implementation:

- Calls are **blocking and thread-safe** (an implementation serialises them with a lock).
  Async callers run them with ``asyncio.to_thread``.
- GPUs are named by their UUID (``GPU-…``); MIG instances by their GPU's UUID and their
  GPU-instance id (the MIG device UUID ``MIG-…`` exists only once its compute instance does).
- Failures raise a ``BackendError`` subclass whose message says what failed, on which GPU,
  and what to do. Nothing else escapes (a bug aside).
- ``inventory()`` never raises for a missing driver or a lost GPU: it reports them
  (``Inventory.problem``, ``GpuInfo.health``).
- "In use" is the union of what the hardware says (processes on the device) and what a caller
  declared with ``hold``/``release`` (a prepared ResourceClaim before any process starts).
  A device in use is never destroyed and its GPU's MIG mode never changes: ``destroy_instance``
  and ``set_mig_mode`` raise ``InUseError``, atomically with respect to ``hold``. Holds live
  in the backend process; the kubelet plugin re-declares them from its checkpoint after a
  restart.

Not for: deciding what a GPU should look like (``tessera.agent.reconciler``), or anything
that talks to Kubernetes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from tessera.models.layout import Health
from tessera.models.policy import TimeSliceInterval

# --- errors -----------------------------------------------------------------------------------


class BackendError(Exception):
    """A GPU operation failed. ``reason`` is a CamelCase word for conditions and metrics."""

    reason = "BackendError"


class InUseError(BackendError):
    """The instance or GPU has processes or holds on it (NVML: IN_USE)."""

    reason = "InUse"


class InsufficientResourcesError(BackendError):
    """The placement is taken or overlaps an instance (NVML: INSUFFICIENT_RESOURCES)."""

    reason = "InsufficientResources"


class NotSupportedError(BackendError):
    """The GPU lacks the feature or profile, or MIG mode is off (NVML: NOT_SUPPORTED)."""

    reason = "NotSupported"


class ResetRequiredError(BackendError):
    """The change waits for a GPU reset (Ampere MIG mode; NVML: RESET_REQUIRED)."""

    reason = "ResetRequired"


class NotFoundError(BackendError):
    """No GPU, instance or daemon by that name (NVML: NOT_FOUND)."""

    reason = "NotFound"


class GpuLostError(BackendError):
    """The GPU fell off the bus (NVML: GPU_IS_LOST); only a reset or reboot brings it back."""

    reason = "GpuLost"


class NoPermissionError(BackendError):
    """The agent lacks the privilege (NVML: NO_PERMISSION): run it privileged / as root."""

    reason = "NoPermission"


class BackendTimeoutError(BackendError):
    """The driver did not answer in time (NVML: TIMEOUT)."""

    reason = "Timeout"


class DriverUnavailableError(BackendError):
    """No NVIDIA driver or NVML library on this node."""

    reason = "DriverUnavailable"


# --- inventory values --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """One GPU-instance profile a GPU supports, as the driver (or the catalog) describes it."""

    name: str  # "3g.40gb"
    profile_id: int  # nvmlGpuInstanceProfileInfo.id
    memory_slices: int
    compute_slices: int
    memory_mib: int
    multiprocessors: int
    max_count: int
    starts: tuple[int, ...]  # valid placement starts, in memory slices


@dataclass(frozen=True, slots=True)
class MpsDefaults:
    """What an MPS client that sets nothing gets: the daemon's default active-thread percentage
    (of the device's SMs) and default pinned device memory (MiB). None: the daemon's own
    default (100 %, unlimited)."""

    active_thread_percentage: int | None = None
    pinned_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class MigInstanceInfo:
    """A MIG GPU instance that exists, with its compute instance when it has one."""

    gpu_instance_id: int
    profile: str  # profile name, e.g. "1g.10gb"; "" when the driver reports an unknown id
    profile_id: int
    start: int
    size: int  # memory slices
    memory_mib: int
    multiprocessors: int
    compute_instance_id: int | None  # None: a GI without CI (e.g. after a crash mid-create)
    uuid: str | None  # "MIG-…"; None while there is no compute instance
    in_use: bool
    mps_running: bool = False
    mps_pipe_directory: str | None = None
    mps_crashed: bool = False  # the agent started a daemon that died: it is restarted
    mps_defaults: MpsDefaults | None = None  # what the running daemon's clients get by default

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, start: int, size: int) -> bool:
        return self.start < start + size and start < self.end


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU: identity, capabilities, MIG state, what exists on it, health."""

    uuid: str
    index: int
    product_name: str
    memory_mib: int
    multiprocessors: int = 0
    minor: int | None = None  # the driver's minor number: /dev/nvidia<minor>; None when unknown
    cuda_compute_capability: str = ""
    architecture: str = ""
    pci_bus_id: str | None = None  # as NVML writes it: "00000000:3B:00.0"
    pcie_root: str | None = None  # the PCIe root complex, "pci0000:3a"; None when unknown
    numa_node: int | None = None
    mig_capable: bool = False
    mig_mode_current: bool = False
    mig_mode_pending: bool = False
    profiles: tuple[ProfileInfo, ...] = ()
    instances: tuple[MigInstanceInfo, ...] = ()
    in_use: bool = False  # processes or holds on the whole GPU or any of its instances
    time_slice: TimeSliceInterval | None = None  # None: unknown (NVML cannot read it back)
    mps_running: bool = False  # an MPS daemon on the whole GPU (not on MIG instances)
    mps_pipe_directory: str | None = None
    mps_crashed: bool = False
    mps_defaults: MpsDefaults | None = None
    health: Health = Health.HEALTHY
    health_message: str = ""

    def profile(self, name: str) -> ProfileInfo | None:
        return next((p for p in self.profiles if p.name == name), None)


@dataclass(frozen=True, slots=True)
class Inventory:
    """Every GPU of the node, plus what the whole node shares. ``problem`` explains an empty list."""

    gpus: tuple[GpuInfo, ...]
    driver_version: str = ""
    cuda_version: str = ""
    problem: str = ""  # e.g. "no NVIDIA driver: …"; empty when the backend works

    def gpu(self, uuid: str) -> GpuInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class HealthEventKind(StrEnum):
    XID = "Xid"
    DOUBLE_BIT_ECC = "DoubleBitEcc"
    GPU_LOST = "GpuLost"
    GPU_RESET = "GpuReset"  # the GPU was reset: what it did before no longer holds


# NVIDIA's drivers treat these XIDs as application errors; every other XID is fatal.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something the driver reported about a GPU's health."""

    gpu_uuid: str
    kind: HealthEventKind
    xid: int | None = None
    gpu_instance_id: int | None = None
    message: str = ""

    @property
    def fatal(self) -> bool:
        """Whether the GPU should be taken out of service (application XIDs and resets are not)."""
        if self.kind is HealthEventKind.GPU_RESET:
            return False
        return not (self.kind is HealthEventKind.XID and self.xid in APPLICATION_XIDS)


@dataclass(frozen=True, slots=True)
class MigModeResult:
    """MIG mode after ``set_mig_mode``: ``pending`` differs from ``current`` until a reset."""

    current: bool
    pending: bool

    @property
    def reset_required(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True, slots=True)
class CreatedInstance:
    """What ``create_instance`` made."""

    gpu_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-…"
    profile: str
    start: int
    size: int
    memory_mib: int


# --- the protocol ------------------------------------------------------------------------------


@runtime_checkable
class DeviceBackend(Protocol):
    """What the agent and the kubelet plugin need from GPUs. See the module docstring."""

    @property
    def name(self) -> str:
        """``"nvml"`` or ``"simulated"``: written to NodeLayout.status.backend."""
        ...

    def inventory(self) -> Inventory:
        """Every GPU and what exists on it, read fresh from the hardware. Never raises for a
        missing driver or a lost GPU; reports them instead."""
        ...

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> MigModeResult:
        """Turn MIG mode on or off. Hopper and later apply at once; Ampere leaves it pending
        until a GPU reset (the result says so). Raises InUseError if the GPU is in use,
        NotSupportedError if it has no MIG."""
        ...

    def create_instance(
        self, gpu_uuid: str, profile: str, start: int, hold: str | None = None
    ) -> CreatedInstance:
        """Create a GPU instance of ``profile`` at memory slice ``start`` and its default
        (full-size) compute instance. With ``hold``, the instance is held by that holder
        (e.g. a claim UID) from the moment it exists. Raises InsufficientResourcesError on an
        overlapping or taken placement, NotSupportedError for an unknown profile / MIG off."""
        ...

    def destroy_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroy a GPU instance and its compute instances. Raises InUseError (and changes
        nothing) while it has processes or holds; NotFoundError when it does not exist."""
        ...

    def hold(self, device_uuid: str, holder: str) -> None:
        """Declare ``device_uuid`` (``GPU-…`` or ``MIG-…``) in use by ``holder``. Idempotent."""
        ...

    def release(self, device_uuid: str, holder: str) -> None:
        """Drop ``holder``'s hold on ``device_uuid``. Idempotent; unknown holders are ignored."""
        ...

    def set_time_slice(self, gpu_uuid: str, interval: TimeSliceInterval) -> None:
        """Set the GPU's time-slice interval (not possible on MIG devices)."""
        ...

    def start_mps(self, device_uuid: str, defaults: MpsDefaults | None = None) -> str:
        """Make sure an MPS control daemon serves a GPU or a MIG device, with ``defaults`` set
        through its control commands (None: keep what it had); returns its pipe directory.
        Idempotent: a running daemon is kept (adopted after an agent restart); one that died
        is started again."""
        ...

    def stop_mps(self, device_uuid: str) -> None:
        """Stop the MPS control daemon of a GPU or MIG device. Idempotent."""
        ...

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Block up to ``timeout_s`` for health events (XIDs, ECC, GPU lost, GPU reset); [] on
        timeout. Health that follows from events is the agent's to keep
        (``tessera.agent.health``); ``inventory()`` reports only what a probe sees now."""
        ...

    def close(self) -> None:
        """Release the driver (nvmlShutdown) or the state file. Idempotent."""
        ...
