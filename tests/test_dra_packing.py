"""Publication order makes first fit pack (tessera.dra.packing through tessera.dra.devices).

The scheduler's allocator takes the first listed device whose counters still fit; these tests
walk the published list the same way and show where small instances land and that large
ones still fit afterwards — and that the order never depends on what is allocated."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from tessera.dra.devices import build_gpu_devices
from tessera.dra.packing import placement_cost
from tessera.models.catalog import MODELS, ProfileKind
from tests.dra_gpus import dynamic_gpu, gpu, instance, mig_gpu

Device = dict[str, Any]


def _attr(device: Device, name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def _first_fit(devices: list[Device], counters: dict[str, int], profiles: list[str]) -> list[str | None]:
    """The allocator's walk: for each request in turn, the first listed placement of that
    profile whose counters are all still available (None: it stays pending)."""
    left = dict(counters)
    placed: list[str | None] = []
    for wanted in profiles:
        chosen = None
        for device in devices:
            if _attr(device, "migProfile") != wanted:
                continue
            (consumes,) = device["consumesCounters"]
            need = {k: int(v["value"]) for k, v in consumes["counters"].items()}
            if all(left[k] >= v for k, v in need.items()):
                for k, v in need.items():
                    left[k] -= v
                chosen = device["name"]
                break
        placed.append(chosen)
    return placed


def _counters(model: str = "H100-80GB") -> tuple[list[Device], dict[str, int]]:
    published = build_gpu_devices(dynamic_gpu(0, model))
    counters = {k: int(v["value"]) for k, v in published.counter_sets[0]["counters"].items()}
    return list(published.devices), counters


def test_small_instances_fill_from_the_top_so_a_4g_still_fits_beside_them() -> None:
    devices, counters = _counters()
    placed = _first_fit(devices, counters, ["1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb"])
    assert placed == ["gpu-0-dyn-1g-10gb-6", "gpu-0-dyn-1g-10gb-5", "gpu-0-dyn-1g-10gb-4", "gpu-0-dyn-4g-40gb-0"]


def test_name_order_would_have_blocked_the_4g() -> None:
    """The same walk over the devices sorted by name (the order before packing order): the
    1g instances take slices 0-2 and the 4g finds no room, so the packing order is what helps."""
    devices, counters = _counters()
    by_name = sorted(devices, key=lambda d: str(d["name"]))
    placed = _first_fit(by_name, counters, ["1g.10gb", "1g.10gb", "1g.10gb", "4g.40gb"])
    assert placed[-1] is None


def test_a_2g_lands_where_a_4g_and_a_3g_can_still_follow() -> None:
    devices, counters = _counters()
    assert _first_fit(devices, counters, ["2g.20gb", "4g.40gb"]) == ["gpu-0-dyn-2g-20gb-4", "gpu-0-dyn-4g-40gb-0"]
    assert _first_fit(devices, counters, ["2g.20gb", "3g.40gb"]) == ["gpu-0-dyn-2g-20gb-4", "gpu-0-dyn-3g-40gb-0"]


@pytest.mark.parametrize("model", [m.key for m in MODELS if m.mig_capable])
def test_seven_1g_instances_fill_the_gpu_in_every_model(model: str) -> None:
    devices, counters = _counters(model)
    one = next(str(_attr(d, "migProfile")) for d in devices if _attr(d, "migSize") == 1)
    placed = _first_fit(devices, counters, [one] * 8)
    assert all(p is not None for p in placed[:7])
    assert placed[7] is None  # compute slices are spent


def test_smaller_profiles_are_listed_before_larger_ones() -> None:
    devices, _ = _counters()
    sizes = [(_attr(d, "migSize"), "+me" in _attr(d, "migProfile")) for d in devices]
    assert [s for s, _ in sizes] == sorted(s for s, _ in sizes)
    first = devices[0]
    assert _attr(first, "migProfile") == "1g.10gb"
    assert devices[-1]["name"] == "gpu-0-dyn-7g-80gb-0"


def test_placement_cost_counts_the_share_of_every_other_shape_a_placement_blocks() -> None:
    # 1g at 6: one of two 3g, one of four double 1g, the 7g.
    assert placement_cost(ProfileKind.ONE, 6) == Fraction(1, 2) + Fraction(1, 4) + 1 + Fraction(1, 7)
    # 1g at 0 also removes the only 4g and one of three 2g.
    assert placement_cost(ProfileKind.ONE, 0) > placement_cost(ProfileKind.ONE, 4) > placement_cost(ProfileKind.ONE, 6)
    assert placement_cost(ProfileKind.THREE, 4) < placement_cost(ProfileKind.THREE, 0)


def test_static_mig_instances_are_listed_smallest_first() -> None:
    devices = build_gpu_devices(mig_gpu(1)).devices
    assert [_attr(d, "migSize") for d in devices] == [1, 2, 4]


def test_order_never_depends_on_what_is_allocated() -> None:
    """A placement made for a claim (what an allocation leads to) publishes the very same list,
    so an allocation or a release never rewrites a slice."""
    idle = build_gpu_devices(dynamic_gpu(0)).devices
    made = [
        instance("H100-80GB", "1g.10gb", 6, gi=13, dynamic=True, in_use=True),
        instance("H100-80GB", "2g.20gb", 4, gi=5, dynamic=True, in_use=True),
    ]
    busy = build_gpu_devices(dynamic_gpu(0, mig_instances=made)).devices
    assert busy == idle
    assert build_gpu_devices(gpu(0)).devices == build_gpu_devices(gpu(0)).devices
