"""A reboot of a simulated node's GPUs: what the hardware and driver keep and what they lose.

Lost: every MIG GPU and compute instance (NVIDIA does not persist them), every process on a
GPU (so every hold), MPS daemons, the time-slice and compute-mode settings, health events and
a GPU's fault state (the reset clears an XID's Unhealthy and a lost GPU answers again), and
injected faults. Kept: the GPUs themselves (same UUIDs) and MIG mode, which the GPU stores; a
MIG mode change waiting for a reset takes effect.

Kept apart from ``tessera.agent.backends.simulated`` so that module only offers the state the
reboot rewrites (``SimulatedHardware.transaction``). The node around the GPUs (kubelet,
containerd, /run) is rebooted by ``tessera.localcluster.nodes.RealNode.reboot``.
Not for: real GPUs (a real reboot does this), nor the agent (it notices by itself).
"""

from __future__ import annotations

from tessera.agent.backends.simulated import SimulatedHardware
from tessera.models.layout import Health
from tessera.models.policy import TimeSliceInterval


def power_cycle(hardware: SimulatedHardware) -> None:
    """Reset ``hardware`` as a reboot does, in one step."""
    with hardware.transaction() as state:
        for gpu in state.gpus:
            gpu.instances = []
            gpu.mig_current = gpu.mig_pending
            gpu.time_slice = TimeSliceInterval.DEFAULT.value
            gpu.compute_mode = 0
            gpu.lost = False
            gpu.health = Health.HEALTHY.value
            gpu.health_message = ""
        state.holds.clear()
        state.mps.clear()
        state.mps_defaults.clear()
        state.events.clear()
        state.faults.clear()
