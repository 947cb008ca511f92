"""The NVML backend on a real NVIDIA GPU, read-only: what it reads agrees with the catalog.

These tests need a GPU and its driver, so they skip on machines without one (CI has none);
they were run on an H200 (see the closing note). They read only: no MIG mode change, no
instance made, no reset. Each GPU the driver lists must be a model the catalog knows, with
the memory, compute capability and MIG profiles (sizes, SMs, counts, placements) the
catalog gives it, because the planner and the simulated backend plan from the catalog.
Not for: anything that writes to a GPU.
"""

from __future__ import annotations

import pytest

from tessera.agent.backends.base import GpuInfo, Inventory
from tessera.agent.backends.nvml import NvmlBackend
from tessera.agent.status import build_status
from tessera.models.catalog import model_for_product
from tessera.models.layout import Health, NodeLayoutSpec
from tessera.models.policy import SharingPolicySpec
from tessera.planner import plan_gpu_layout

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        pytest.skip(f"no NVIDIA driver or GPU on this machine: {e}")
    pynvml.nvmlShutdown()
    backend = NvmlBackend()
    try:
        return backend.inventory()
    finally:
        backend.close()


def _mig_gpus(inventory: Inventory) -> list[GpuInfo]:
    return [g for g in inventory.gpus if g.mig_capable]


def test_every_gpu_is_read_whole_and_healthy(inventory: Inventory) -> None:
    assert inventory.problem == ""
    assert inventory.gpus, "NVML answered but listed no GPU"
    assert inventory.driver_version
    assert inventory.cuda_version
    for g in inventory.gpus:
        assert g.uuid.startswith("GPU-"), g.uuid
        assert g.health is Health.HEALTHY
        assert g.memory_mib > 0
        assert g.cuda_compute_capability


def test_every_gpu_matches_its_catalog_model(inventory: Inventory) -> None:
    for g in inventory.gpus:
        model = model_for_product(g.product_name)
        assert model is not None, f"{g.product_name!r} is not in tessera.models.catalog: add it"
        assert (g.memory_mib, g.cuda_compute_capability) == (model.memory_mib, model.compute_capability)
        assert g.architecture == model.architecture
        assert g.mig_capable == model.mig_capable


def test_mig_profiles_read_from_the_driver_match_the_catalog(inventory: Inventory) -> None:
    gpus = _mig_gpus(inventory)
    if not gpus:
        pytest.skip("no MIG-capable GPU on this machine")
    for g in gpus:
        model = model_for_product(g.product_name)
        assert model is not None
        read = {p.name: p for p in g.profiles}
        assert sorted(read) == sorted(p.name for p in model.profiles)
        for expected in model.profiles:
            got = read[expected.name]
            assert (got.profile_id, got.memory_mib, got.multiprocessors) == (
                expected.shape.profile_id,
                expected.memory_mib,
                expected.multiprocessors,
            ), expected.name
            assert (got.compute_slices, got.memory_slices, got.max_count, got.starts) == (
                expected.compute_slices,
                expected.memory_slices,
                expected.max_count,
                expected.starts,
            ), expected.name


def test_the_planner_plans_every_preset_on_what_the_driver_reports(inventory: Inventory) -> None:
    gpus = _mig_gpus(inventory)
    if not gpus:
        pytest.skip("no MIG-capable GPU on this machine")
    status = build_status(
        inventory, NodeLayoutSpec(gpus=[]), [], backend="nvml", agent_version="t", observed_generation=None
    )
    for gpu in status.gpus:
        for preset, kinds in (("all-1g", ["1g"] * 7), ("all-balanced", ["1g", "1g", "2g", "3g"]), ("whole", ["7g"])):
            spec = SharingPolicySpec.model_validate({"strategy": "MIG", "mig": {"preset": preset}})
            layout = plan_gpu_layout(spec, gpu)
            assert sorted(i.profile.split(".")[0] for i in layout.mig_instances) == kinds, preset


def test_a_healthy_gpu_raises_no_health_event(inventory: Inventory) -> None:
    backend = NvmlBackend()
    try:
        assert backend.wait_health_events(0.5) == []
    finally:
        backend.close()
