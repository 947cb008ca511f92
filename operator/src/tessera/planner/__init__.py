"""Plans a layout per GPU from SharingPolicies: matching, conflicts, MIG placement.

Pure code: values in, values out. The operator calls :func:`plan_fleet` (every GPU of every
node) or :func:`plan_gpu_layout` (one policy on one GPU). Not for: I/O of any kind.
"""

from tessera.planner.fleet import Conflict, FleetPlan, GpuPlan, NodeInventory, plan_fleet
from tessera.planner.gpu import PlanError, PlanErrorReason, plan_gpu_layout
from tessera.planner.selector import GpuSelectorError, compile_gpu_selector

__all__ = [
    "Conflict",
    "FleetPlan",
    "GpuPlan",
    "GpuSelectorError",
    "NodeInventory",
    "PlanError",
    "PlanErrorReason",
    "compile_gpu_selector",
    "plan_fleet",
    "plan_gpu_layout",
]
