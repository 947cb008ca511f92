"""Fault injection for the simulated GPUs: which operations can be made to fail, with which
driver error (or a simulated crash of the agent), and the health events a test can raise.

A fault is recorded in the simulated state (``SimFault``) so it reaches an agent in another
process through the state file; ``fire_fault`` is called by each simulated driver operation
and raises when a fault is due (after ``skip`` good calls, ``remaining`` times). Health
events (XID, double-bit ECC, a GPU fallen off the bus) are what NVML would deliver.
Not for: the driver's own rules (``simulated``) or deciding health (``tessera.agent.health``).
"""

from __future__ import annotations

from tessera.agent.backends.base import (
    BackendTimeoutError,
    GpuLostError,
    HealthEventKind,
    InsufficientResourcesError,
    InUseError,
    NoPermissionError,
    NotFoundError,
    NotSupportedError,
    ResetRequiredError,
)
from tessera.agent.backends.simstate import SimEvent, SimFault, SimGpu, SimState
from tessera.models.layout import Health


class SimulatedCrash(Exception):  # noqa: N818 - it is not an error of the code, it is the fault
    """Injected fault: the agent process 'dies' at this point (tests catch it, then restart)."""


FAULT_ERRORS: dict[str, type[Exception]] = {
    "InUse": InUseError,
    "InsufficientResources": InsufficientResourcesError,
    "NotSupported": NotSupportedError,
    "ResetRequired": ResetRequiredError,
    "NotFound": NotFoundError,
    "GpuLost": GpuLostError,
    "NoPermission": NoPermissionError,
    "Timeout": BackendTimeoutError,
    "Crash": SimulatedCrash,
}
FAULT_KINDS = tuple(FAULT_ERRORS)
FAULT_OPERATIONS = (
    "set_mig_mode",
    "create_gpu_instance",
    "create_compute_instance",
    "destroy_gpu_instance",
    "destroy_compute_instance",
    "set_time_slice",
    "start_mps",
    "stop_mps",
)


def new_fault(operation: str, error: str, gpu_index: int | None = None, count: int = 1, after: int = 0) -> SimFault:
    """A fault for ``operation`` failing with ``error``; the names are checked, with the choices
    given."""
    if operation not in FAULT_OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; one of {', '.join(FAULT_OPERATIONS)}")
    if error not in FAULT_ERRORS:
        raise ValueError(f"unknown fault {error!r}; one of {', '.join(FAULT_KINDS)}")
    return SimFault(operation, error, gpu_index, count, after)


def fire_fault(state: SimState, operation: str, index: int | None) -> None:
    """Raise the fault injected for ``operation`` on GPU ``index`` if one is due (call inside a
    transaction: the fault's count goes down in the state)."""
    for f in state.faults:
        if f.operation == operation and (f.gpu_index is None or f.gpu_index == index):
            if f.skip > 0:
                f.skip -= 1
                return
            f.remaining -= 1
            if f.remaining <= 0:
                state.faults.remove(f)
            raise FAULT_ERRORS[f.error](f"injected fault: {operation} on GPU {index} fails with {f.error}")


def xid_event(index: int, xid: int, gpu_instance_id: int | None = None) -> SimEvent:
    message = f"XID {xid}" + (f" on GPU instance {gpu_instance_id}" if gpu_instance_id else "")
    return SimEvent(index, HealthEventKind.XID.value, xid, gpu_instance_id, message)


def ecc_event(index: int) -> SimEvent:
    return SimEvent(index, HealthEventKind.DOUBLE_BIT_ECC.value, message="double-bit ECC error")


def lose(gpu: SimGpu) -> SimEvent:
    """Mark ``gpu`` fallen off the bus; the event the driver reports for it."""
    gpu.lost = True
    gpu.health = Health.LOST.value
    gpu.health_message = "GPU has fallen off the bus (GPU_IS_LOST); reset the GPU or reboot the node"
    return SimEvent(gpu.index, HealthEventKind.GPU_LOST.value, message=gpu.health_message)
