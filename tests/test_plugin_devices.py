"""Published device names read back: every name the publisher builds parses to the GPU,
profile and placement it was built from, and nothing else parses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.agent.backends.base import GpuInfo
from tessera.agent.plugin.hardware import device_nodes
from tessera.dra.devices import build_gpu_devices
from tessera.models.catalog import KNOWN_PROFILE_NAMES, MEMORY_SLICES, MODELS
from tessera.models.devices import (
    MAX_DEVICE_NAME_LENGTH,
    DeviceKind,
    DeviceRef,
    dynamic_mig_device_name,
    gpu_device_name,
    mig_device_name,
    parse_device_name,
)
from tests.dra_gpus import dynamic_gpu, every_strategy

DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def test_names_of_each_kind() -> None:
    assert gpu_device_name(0) == "gpu-0"
    assert mig_device_name(1, "3g.40gb", 4) == "gpu-1-mig-3g-40gb-4"
    assert dynamic_mig_device_name(7, "1g.10gb+me", 6) == "gpu-7-dyn-1g-10gb-me-6"
    assert parse_device_name("gpu-7-dyn-1g-10gb-me-6") == DeviceRef(DeviceKind.DYNAMIC_MIG, 7, "1g.10gb+me", 6)
    assert parse_device_name("gpu-12") == DeviceRef(DeviceKind.GPU, 12)


@given(
    index=st.integers(min_value=0, max_value=63),
    profile=st.sampled_from(KNOWN_PROFILE_NAMES),
    start=st.integers(min_value=0, max_value=MEMORY_SLICES - 1),
    kind=st.sampled_from([DeviceKind.MIG, DeviceKind.DYNAMIC_MIG]),
)
def test_every_mig_name_round_trips_and_is_a_dns_label(index: int, profile: str, start: int, kind: DeviceKind) -> None:
    ref = DeviceRef(kind, index, profile, start)
    assert parse_device_name(ref.name) == ref
    assert len(ref.name) <= MAX_DEVICE_NAME_LENGTH
    assert re.fullmatch(DNS_LABEL, ref.name)


def test_every_device_the_publisher_builds_parses_back_to_what_it_was_built_from() -> None:
    gpus = every_strategy() + [dynamic_gpu(8 + n, m.key) for n, m in enumerate(MODELS)]
    checked = 0
    for status in gpus:
        for device in build_gpu_devices(status).devices:
            ref = parse_device_name(device["name"])
            assert ref.gpu_index == status.index
            attributes = device["attributes"]
            if ref.is_mig:
                assert attributes["migProfile"]["string"] == ref.profile
            checked += 1
    assert checked > 100


@pytest.mark.parametrize(
    "name",
    ["gpu", "gpu-", "gpu-01", "GPU-0", "gpu-0-mig", "gpu-0-mig-3g-40gb", "gpu-0-mig-3g.40gb-0", "gpu-0-mig-3g-40gb-8",
     "gpu-0-xyz-3g-40gb-0", "gpu-0-mig-3g-40gb-04", "gpu-0-dyn-0g-40gb-0", "nic-0", "gpu-0 "],
)
def test_names_that_are_not_ours_are_refused_with_the_expected_form(name: str) -> None:
    with pytest.raises(ValueError, match=r"gpu-<index>|canonical|placement start"):
        parse_device_name(name)


def test_refs_that_cannot_exist_are_refused() -> None:
    with pytest.raises(ValueError, match="no MIG profile or placement"):
        DeviceRef(DeviceKind.GPU, 0, "3g.40gb", 0)
    with pytest.raises(ValueError, match="not a MIG profile name"):
        DeviceRef(DeviceKind.MIG, 0, "big", 0)
    with pytest.raises(ValueError, match="must not be negative"):
        gpu_device_name(-1)
    with pytest.raises(ValueError, match="has no MIG placement"):
        _ = DeviceRef(DeviceKind.GPU, 0).placement


def test_a_gpus_device_node_follows_the_driver_minor_number_where_known(tmp_path: Path) -> None:
    known = GpuInfo(uuid="GPU-a", index=0, product_name="NVIDIA H100 80GB HBM3", memory_mib=81559, minor=3)
    unknown = GpuInfo(uuid="GPU-b", index=1, product_name="NVIDIA H100 80GB HBM3", memory_mib=81559)
    assert device_nodes(tmp_path, known, None)[-1] == "/dev/nvidia3"
    assert device_nodes(tmp_path, unknown, None)[-1] == "/dev/nvidia1"
