"""The DeviceClasses Tessera installs (tessera.dra.deviceclasses) and their manifest."""

from __future__ import annotations

from pathlib import Path

import yaml

from tessera.dra.deviceclasses import device_classes, render_yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "deviceclasses.yaml"


def _expressions() -> dict[str, str]:
    return {c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"] for c in device_classes()}


def test_the_install_ships_the_five_gpu_classes_of_the_design_and_one_for_shared_nics() -> None:
    assert sorted(_expressions()) == [
        "gpu.tessera.dev",
        "high-memory-gpu",
        "mig.tessera.dev",
        "shared-gpu.tessera.dev",
        "shared-nic.tessera.dev",
        "whole-gpu.tessera.dev",
    ]


def test_every_selector_checks_the_driver_before_reading_attributes() -> None:
    for name, cel in _expressions().items():
        driver = "nic.tessera.dev" if name == "shared-nic.tessera.dev" else "gpu.tessera.dev"
        assert cel.startswith(f'device.driver == "{driver}"'), name


def test_type_classes_select_on_the_published_type_attribute() -> None:
    cel = _expressions()
    assert cel["whole-gpu.tessera.dev"].endswith('device.attributes["gpu.tessera.dev"].type == "gpu"')
    assert cel["mig.tessera.dev"].endswith('device.attributes["gpu.tessera.dev"].type == "mig"')
    assert cel["shared-gpu.tessera.dev"].endswith('device.attributes["gpu.tessera.dev"].type == "share"')


def test_high_memory_gpu_compares_the_real_memory_capacity_with_40gi() -> None:
    cel = _expressions()["high-memory-gpu"]
    assert 'device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) > 0' in cel
    assert 'type in ["gpu", "mig"]' in cel


def test_manifest_matches_the_code() -> None:
    assert MANIFEST.read_text() == render_yaml(), (
        "manifests/deviceclasses.yaml drifted; regenerate it with "
        "`.venv/bin/python -m tessera.dra.deviceclasses > manifests/deviceclasses.yaml`"
    )
    assert list(yaml.safe_load_all(MANIFEST.read_text())) == device_classes()


def test_whole_gpu_class_alone_serves_the_nvidia_gpu_extended_resource() -> None:
    serving = {c["metadata"]["name"]: c["spec"].get("extendedResourceName") for c in device_classes()}
    assert serving == {
        "gpu.tessera.dev": None,
        "high-memory-gpu": None,
        "mig.tessera.dev": None,
        "shared-gpu.tessera.dev": None,
        "shared-nic.tessera.dev": None,
        "whole-gpu.tessera.dev": "nvidia.com/gpu",
    }


def test_the_extended_resource_can_be_left_out() -> None:
    classes = device_classes(extended_resource=None)
    assert all("extendedResourceName" not in c["spec"] for c in classes)
    assert [c["metadata"]["name"] for c in classes] == [c["metadata"]["name"] for c in device_classes()]
