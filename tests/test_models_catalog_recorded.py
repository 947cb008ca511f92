"""The catalog against what NVML said on real GPUs (``tests/fixtures/nvml/*.json``).

Each recording was made with ``scripts/nvml-record`` on a machine with the GPU (read-only
calls). The planner, the publisher and the simulated backend size MIG devices from the
catalog, so a catalog entry that disagrees with the driver publishes wrong capacities. The
first H200 recording found exactly that: 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb and 7g.141gb were
each 256 MiB smaller in the catalog than on the GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.models.catalog import SHAPES, model_for_product

RECORDINGS = sorted((Path(__file__).parent / "fixtures" / "nvml").glob("*.json"))
ARCHITECTURES = {"Ampere": 7, "Ada": 8, "Hopper": 9, "Blackwell": 10}


def _gpus() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.stem}/{gpu['index']}", gpu) for path in RECORDINGS for gpu in json.loads(path.read_text())["gpus"]]


def test_there_is_at_least_one_recording() -> None:
    assert RECORDINGS, "tests/fixtures/nvml/ holds no recording"


@pytest.mark.parametrize(("where", "gpu"), _gpus())
def test_the_model_matches_the_recorded_gpu(where: str, gpu: dict[str, Any]) -> None:
    model = model_for_product(gpu["name"])
    assert model is not None, f"{where}: {gpu['name']!r} is not in the catalog"
    assert model.memory_mib == gpu["memoryTotalMiB"]
    assert model.compute_capability == ".".join(map(str, gpu["cudaComputeCapability"]))
    assert ARCHITECTURES[model.architecture] == gpu["architecture"]
    assert model.pci_device_id == gpu["pciDeviceId"]


@pytest.mark.parametrize(("where", "gpu"), _gpus())
def test_every_recorded_profile_is_in_the_catalog_as_read(where: str, gpu: dict[str, Any]) -> None:
    model = model_for_product(gpu["name"])
    assert model is not None
    by_constant = {s.nvml_constant: s for s in SHAPES.values()}
    read = [p for p in gpu["profiles"] if "error" not in p]
    assert sorted(p["name"].removeprefix("MIG ") for p in read) == sorted(p.name for p in model.profiles), where
    for p in read:
        ours = model.profile(p["name"].removeprefix("MIG "))
        assert ours.shape is by_constant[p["constant"]], p["name"]
        assert (ours.shape.profile_id, ours.compute_slices, ours.max_count) == (
            p["id"],
            p["sliceCount"],
            p["instanceCount"],
        ), p["name"]
        assert (ours.memory_mib, ours.multiprocessors) == (p["memorySizeMB"], p["multiprocessorCount"]), p["name"]
        assert ours.starts == tuple(sorted(x["start"] for x in p["placements"])), p["name"]
        assert {x["size"] for x in p["placements"]} == {ours.memory_slices}, p["name"]
