"""GPUs as agents report them, for the DRA publisher tests: one builder per strategy."""

from __future__ import annotations

from typing import Any

from tessera.models.catalog import model_by_key
from tessera.models.layout import GpuStatus, Health, MigInstanceStatus
from tessera.models.policy import MpsCompute, MpsMemory, MpsSpec, ShareStrategy, Strategy, TimeSlicingSpec

NODE_UID = "6b1c2f0e-0000-4000-8000-000000000001"


def gpu(index: int = 0, strategy: Strategy = Strategy.EXCLUSIVE, model: str = "H100-80GB", **extra: Any) -> GpuStatus:
    """A healthy GPU of a catalog model with a stable UUID."""
    m = model_by_key(model)
    fields: dict[str, Any] = {
        "uuid": f"GPU-{index:08d}-1111-2222-3333-{model.lower().replace('-', '')[:12]:0>12}",
        "index": index,
        "product_name": m.product_name,
        "model": m.key,
        "memory_mib": m.memory_mib,
        "multiprocessors": m.multiprocessors,
        "cuda_compute_capability": m.compute_capability,
        "architecture": m.architecture,
        "driver_version": "580.65.06",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "pcie_root": f"pci0000:{0x10 + (index // 2) * 0x20:02x}",
        "numa_node": 0,
        "mig_capable": m.mig_capable,
        "strategy": strategy,
    }
    fields.update(extra)
    return GpuStatus(**fields)


def instance(model: str, profile: str, start: int, gi: int = 1, **extra: Any) -> MigInstanceStatus:
    p = model_by_key(model).profile(profile)
    return MigInstanceStatus(
        profile=profile,
        start=start,
        size=p.memory_slices,
        uuid=f"MIG-{gi:08d}-aaaa-bbbb-cccc-{start:012d}",
        gpu_instance_id=gi,
        memory_mib=p.memory_mib,
        multiprocessors=p.multiprocessors,
        **extra,
    )


def mig_gpu(index: int = 0, model: str = "H100-80GB", sharing: ShareStrategy | None = None, **extra: Any) -> GpuStatus:
    """3g at 0, 2g at 4, 1g at 6: a valid static layout."""
    names = {p.kind.value: p.name for p in model_by_key(model).profiles}
    instances = [
        instance(model, names["3g"], 0, gi=1),
        instance(model, names["2g"], 4, gi=2),
        instance(model, names["1g"], 6, gi=3),
    ]
    return gpu(index, Strategy.MIG, model, mig_mode_current=True, mig_instances=instances, mig_sharing=sharing, **extra)


def time_sliced_gpu(index: int = 0, replicas: int = 4, **extra: Any) -> GpuStatus:
    return gpu(index, Strategy.TIME_SLICING, time_slicing=TimeSlicingSpec(replicas=replicas), **extra)


def mps_gpu(index: int = 0, values: list[int] | None = None, **extra: Any) -> GpuStatus:
    spec = MpsSpec(
        memory=MpsMemory(default="10Gi", min="1Gi", step="1Gi"), compute=MpsCompute(default=25, values=values)
    )
    return gpu(index, Strategy.MPS, mps=spec, **extra)


def dynamic_gpu(index: int = 0, model: str = "H100-80GB", **extra: Any) -> GpuStatus:
    return gpu(index, Strategy.DYNAMIC_MIG, model, mig_mode_current=True, **extra)


def every_strategy(model: str = "H100-80GB") -> list[GpuStatus]:
    """Eight GPUs: one of every strategy and sharing, one unhealthy, one MIG GPU without instances."""
    return [
        gpu(0, model=model),
        mig_gpu(1, model),
        mig_gpu(2, model, sharing=ShareStrategy.MPS),
        mig_gpu(3, model, sharing=ShareStrategy.TIME_SLICING, time_slicing=TimeSlicingSpec(replicas=3)),
        time_sliced_gpu(4, model=model),
        mps_gpu(5, model=model),
        dynamic_gpu(6, model),
        gpu(7, model=model, health=Health.LOST),
    ]
