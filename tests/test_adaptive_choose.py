"""The adaptive planning room: claims read as demand, fitted to the devices a menu layout would
publish (the publisher's builder, the planner's CEL path), and the recuts chosen for them."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.adaptive.choose import (
    AdaptiveGpu,
    MenuCache,
    back_to_idle,
    fragmentation,
    plan_ahead,
    plan_recuts,
    plan_reservations,
)
from tessera.adaptive.claims import ClaimDemand, claim_demand, class_selectors, fit, slot_of
from tessera.adaptive.layouts import menu_devices, slots_of
from tessera.dra.deviceclasses import device_classes
from tessera.models.policy import SharingPolicy
from tests.dra_gpus import gpu

CLASSES = class_selectors(device_classes())
OURS = frozenset(CLASSES)


def policy(name: str = "adaptive", idle: str = "whole", max_recuts: int = 2, **extra: Any) -> SharingPolicy:
    return SharingPolicy.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "strategy": "Adaptive",
                "adaptive": {
                    "layouts": [
                        {"name": "whole"},
                        {"name": "slices", "strategy": "MIG", "mig": {"preset": "all-1g"}},
                        {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}},
                        {"name": "mps", "strategy": "MPS", "mps": {"compute": {"default": 25, "values": [25, 50]}}},
                    ],
                    "idle": idle,
                    "maxRecuts": max_recuts,
                    **extra,
                },
            },
        }
    )


def claim_body(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None,
               namespace: str = "team-a") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests, "constraints": constraints or []}},
    }


def exactly(cls: str, name: str = "gpu", count: int = 1, selectors: tuple[str, ...] = (),
            capacity: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if capacity:
        body["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": body}


def demand(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> ClaimDemand:
    found = claim_demand(claim_body(name, list(requests), constraints), OURS)
    assert found is not None
    return found


WHOLE = exactly("whole-gpu.tessera.dev")
MIG_3G = exactly("mig.tessera.dev", selectors=('device.attributes["gpu.tessera.dev"].migProfile == "3g.40gb"',))
MIG_1G = exactly("mig.tessera.dev", selectors=('device.attributes["gpu.tessera.dev"].migProfile == "1g.10gb"',))
SHARE_25 = exactly("shared-gpu.tessera.dev", capacity={"compute": "20"})


def adaptive_gpus(count: int, node: str = "node-a", current: str = "whole", recuttable: bool = True,
                  pol: SharingPolicy | None = None) -> list[AdaptiveGpu]:
    pol = pol or policy()
    return [AdaptiveGpu(node, gpu(i), pol, current, recuttable) for i in range(count)]


# ---------------------------------------------------------------- reading claims


def test_claims_of_other_drivers_allocated_claims_and_admin_access_are_not_demand() -> None:
    assert claim_demand(claim_body("x", [exactly("gpu.example.com")]), OURS) is None
    allocated = {**claim_body("y", [WHOLE]), "status": {"allocation": {"devices": {"results": []}}}}
    assert claim_demand(allocated, OURS) is None
    admin = {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev", "adminAccess": True}}
    assert claim_demand(claim_body("z", [admin]), OURS) is None
    mixed = claim_body("w", [{"name": "r", "firstAvailable": [
        {"name": "a", "deviceClassName": "mig.tessera.dev"}, {"name": "b", "deviceClassName": "gpu.example.com"}]}])
    assert claim_demand(mixed, OURS) is None


def test_first_available_alternatives_keep_their_order_and_capacity_requests_are_read() -> None:
    d = demand("fa", {"name": "r", "firstAvailable": [
        {"name": "big", "deviceClassName": "whole-gpu.tessera.dev"},
        {"name": "share", "deviceClassName": "shared-gpu.tessera.dev",
         "capacity": {"requests": {"compute": "50", "memory": "10Gi"}}},
    ]})
    assert [a.name for a in d.requests[0].alternatives] == ["r/big", "r/share"]
    assert dict(d.requests[0].alternatives[1].capacity) == {"compute": Fraction(50), "memory": Fraction(10 * 2**30)}


# ---------------------------------------------------------------- fitting


def test_a_whole_gpu_claim_fits_a_whole_gpu_and_not_mig_slices() -> None:
    options = {o.layout_name: o for o in menu_devices(policy(), gpu(0))}
    assert fit(demand("c", WHOLE), slots_of(options["whole"].devices), CLASSES) is not None
    assert fit(demand("c", WHOLE), slots_of(options["slices"].devices), CLASSES) is None
    assert fit(demand("c", MIG_3G), slots_of(options["halves"].devices), CLASSES) is not None
    assert fit(demand("c", MIG_3G), slots_of(options["slices"].devices), CLASSES) is None


def test_mps_compute_is_rounded_up_by_its_valid_values_and_runs_out() -> None:
    options = {o.layout_name: o for o in menu_devices(policy(), gpu(0))}
    slots = slots_of(options["mps"].devices)
    placed = 0
    while fit(demand(f"s{placed}", SHARE_25), slots, CLASSES, consume=True) is not None:
        placed += 1
    assert placed == 4  # 20% asked, rounded up to 25 (the valid values are 25 and 50): four fit in 100
    half = exactly("shared-gpu.tessera.dev", capacity={"compute": "60"})
    assert fit(demand("h", half), slots_of(options["mps"].devices), CLASSES) is None  # above the largest value


def test_match_attribute_keeps_two_requests_on_one_gpu() -> None:
    pol = policy()
    two = [*slots_of(menu_devices(pol, gpu(0))[1].devices), *slots_of(menu_devices(pol, gpu(1))[1].devices)]
    same_gpu = demand("pair", {**MIG_1G, "name": "a"}, {**MIG_1G, "name": "b"},
                      constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.tessera.dev/parentUUID"}])
    result = fit(same_gpu, two, CLASSES)
    assert result is not None
    chosen = [two[i].gpu for _, idx in result.picks for i in idx]
    assert len(set(chosen)) == 1
    distinct = demand("apart", {**MIG_1G, "name": "a"}, {**MIG_1G, "name": "b"},
                      constraints=[{"requests": ["a", "b"], "distinctAttribute": "gpu.tessera.dev/parentUUID"}])
    result = fit(distinct, two, CLASSES)
    assert result is not None
    assert len({two[i].gpu for _, idx in result.picks for i in idx}) == 2


def test_a_tainted_device_is_never_chosen() -> None:
    device = menu_devices(policy(), gpu(0))[0].devices.devices[0]
    tainted = {**device, "taints": [{"key": "tessera.dev/repartition", "effect": "NoSchedule"}]}
    assert fit(demand("c", WHOLE), [slot_of("g", tainted, Fraction(1))], CLASSES) is None


# ---------------------------------------------------------------- choosing


def test_an_idle_gpu_is_recut_for_a_claim_that_fits_no_published_device() -> None:
    gpus = adaptive_gpus(2, current="whole")
    plan = plan_recuts([demand("llm-0", MIG_3G)], gpus, CLASSES, {"adaptive": 2})
    assert [(r.gpu, r.layout, r.claims) for r in plan.recuts] == [(gpus[0].gpu.uuid, "halves", ("team-a/llm-0",))]
    assert plan.recuts[0].reason == "recut for claim team-a/llm-0"
    assert plan.placed["team-a/llm-0"] == (gpus[0].gpu.uuid,)
    assert plan.unsatisfiable == ()
    assert plan.waiting == ()


def test_later_claims_pack_into_what_a_recut_leaves_before_another_gpu_is_cut() -> None:
    gpus = adaptive_gpus(4, current="whole")
    pending = [demand(f"s{i}", SHARE_25) for i in range(6)]
    plan = plan_recuts(pending, gpus, CLASSES, {"adaptive": 4})
    assert [r.layout for r in plan.recuts] == ["mps", "mps"]  # 4 shares per GPU: two GPUs for six
    assert sorted(len(r.claims) for r in plan.recuts) == [2, 4]
    assert set(plan.placed) == {c.key for c in pending}


def test_among_equal_recut_counts_the_layout_that_also_hosts_the_next_claims_wins() -> None:
    gpus = adaptive_gpus(2, current="whole")
    # Any MIG partition fits both 'slices' (seven 1g) and 'halves' (two 3g); only 'halves' also
    # takes the 3g claim waiting behind it, so one GPU is recut for both.
    any_mig = exactly("mig.tessera.dev")
    plan = plan_recuts([demand("m", any_mig), demand("big", MIG_3G)], gpus, CLASSES, {"adaptive": 2})
    assert [(r.layout, r.claims) for r in plan.recuts] == [("halves", ("team-a/m", "team-a/big"))]
    assert plan.fragmentation == 0


def test_fragmentation_breaks_the_tie_when_the_queue_says_nothing() -> None:
    menu = SharingPolicy.model_validate({"metadata": {"name": "adaptive"}, "spec": {
        "strategy": "Adaptive", "adaptive": {"idle": "whole", "layouts": [
            {"name": "whole"},
            {"name": "balanced", "strategy": "MIG", "mig": {"preset": "all-balanced"}},
            {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}},
        ]}}})
    gpus = adaptive_gpus(1, current="whole", pol=menu)
    # The claim takes a 1g or a 3g. On 'balanced' (first on the menu) it leaves a 2g that no
    # claim seen could use (2/8 of a GPU); on 'halves' it leaves a 3g that they could.
    one_or_three = exactly("mig.tessera.dev", selectors=(
        'device.attributes["gpu.tessera.dev"].migProfile in ["1g.10gb", "3g.40gb"]',))
    plan = plan_recuts([demand("m", one_or_three)], gpus, CLASSES, {"adaptive": 1}, recent=[demand("r", MIG_3G)])
    assert plan.recuts[0].layout == "halves"
    assert plan.fragmentation == 0


def test_the_cap_bounds_recuts_and_the_rest_wait() -> None:
    gpus = adaptive_gpus(8, current="whole")
    pending = [demand(f"m{i}", MIG_3G, {**MIG_3G, "name": "second"}) for i in range(8)]
    plan = plan_recuts(pending, gpus, CLASSES, {"adaptive": 3})
    assert len(plan.recuts) == 3
    assert len(plan.placed) == 3
    assert len(plan.waiting) == 5


def test_gpus_not_recuttable_are_never_recut() -> None:
    gpus = adaptive_gpus(3, current="whole", recuttable=False)
    plan = plan_recuts([demand("m", MIG_3G)], gpus, CLASSES, {"adaptive": 3})
    assert plan.recuts == ()
    assert plan.waiting == ("team-a/m",)  # it could fit once a GPU is free: no Warning


def test_a_claim_no_menu_can_ever_satisfy_is_named_with_its_request() -> None:
    huge = exactly("whole-gpu.tessera.dev", name="big",
                   selectors=('device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("500Gi")) >= 0',))
    plan = plan_recuts([demand("huge", huge)], adaptive_gpus(2), CLASSES, {"adaptive": 2})
    assert plan.recuts == ()
    assert plan.waiting == ()
    (never,) = plan.unsatisfiable
    assert never.claim == "team-a/huge"
    assert "request 'big' (class whole-gpu.tessera.dev, count 1" in never.message
    assert "menus of adaptive" in never.message


def test_fragmentation_counts_free_pieces_no_recent_claim_could_use() -> None:
    options = {o.layout_name: o for o in menu_devices(policy(), gpu(0))}
    slices = slots_of(options["slices"].devices)
    assert fragmentation(slices, [demand("w", WHOLE)], CLASSES) == Fraction(7, 8)
    assert fragmentation(slices, [demand("s", MIG_1G)], CLASSES) == 0


# ---------------------------------------------------------------- properties

_SHAPES = [WHOLE, MIG_3G, MIG_1G, SHARE_25, exactly("mig.tessera.dev", count=2)]


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(st.integers(0, len(_SHAPES) - 1), min_size=1, max_size=10),
    recuttable=st.lists(st.booleans(), min_size=1, max_size=5),
    cap=st.integers(0, 4),
)
def test_a_plan_recuts_only_free_gpus_within_the_cap_and_every_claim_it_places_fits(
    kinds: list[int], recuttable: list[bool], cap: int
) -> None:
    pol = policy()
    gpus = [AdaptiveGpu("node-a", gpu(i), pol, "whole", free) for i, free in enumerate(recuttable)]
    pending = [demand(f"c{i}", _SHAPES[k]) for i, k in enumerate(kinds)]
    menus = MenuCache()
    plan = plan_recuts(pending, gpus, CLASSES, {"adaptive": cap}, menus=menus)
    free = {g.gpu.uuid for g in gpus if g.recuttable}
    assert {r.gpu for r in plan.recuts} <= free
    assert len(plan.recuts) <= cap
    assert len({r.gpu for r in plan.recuts}) == len(plan.recuts)
    outcome = [*plan.placed, *plan.waiting, *(u.claim for u in plan.unsatisfiable)]
    assert sorted(outcome) == sorted(c.key for c in pending)  # each claim has exactly one outcome
    # Replaying the placed claims, in order, on the recut GPUs' devices reproduces the plan.
    recut_of = {r.gpu: r.layout for r in plan.recuts}
    slots = [
        s for g in gpus if g.gpu.uuid in recut_of
        for o in menus.options(pol, g.gpu) if o.layout_name == recut_of[g.gpu.uuid]
        for s in slots_of(o.devices)
    ]
    for claim in pending:
        if claim.key in plan.placed:
            assert fit(claim, slots, CLASSES, consume=True) is not None


def test_a_free_cut_gpu_goes_back_to_idle_unless_held_cooling_planned_or_kept() -> None:
    pol = policy()
    cut = AdaptiveGpu("node-a", gpu(0), pol, "halves", True)
    whole_free = AdaptiveGpu("node-a", gpu(1), pol, "whole", True)
    nothing = plan_recuts([], [cut, whole_free], CLASSES, {"adaptive": 2})
    assert back_to_idle([cut, whole_free], nothing) == [cut], "free, cooled, on another layout: back"
    assert back_to_idle([cut, whole_free], nothing, keep={gpu(0).uuid}) == [], "kept for claims expected"
    busy_cut = AdaptiveGpu("node-a", gpu(0), pol, "halves", False)
    assert back_to_idle([busy_cut, whole_free], nothing) == [], "held or cooling down: never"


def test_a_thousand_waiting_claims_recut_no_more_than_the_cap() -> None:
    pol = policy(max_recuts=4)
    gpus = [AdaptiveGpu(f"node-{n}", gpu(i), pol, "whole", True) for n in range(8) for i in range(8)]
    shapes = [MIG_3G, SHARE_25, MIG_1G]
    pending = [demand(f"c{i:04d}", shapes[i % 3]) for i in range(1000)]
    plan = plan_recuts(pending, gpus, CLASSES, {"adaptive": 4})
    assert len(plan.recuts) == 4
    assert len(plan.placed) + len(plan.waiting) == 1000
    assert len(plan.placed) == sum(len(r.claims) for r in plan.recuts)  # each placed claim on a recut GPU


# ---------------------------------------------------------------- free devices beside a recut


def _halves_slots(pol: SharingPolicy, index: int) -> list[Any]:
    option = next(o for o in menu_devices(pol, gpu(index)) if o.layout_name == "halves")
    return slots_of(option.devices)


def test_a_claim_spanning_a_recut_gpu_and_a_device_free_beside_it_is_served() -> None:
    pol = policy()
    # GPU 0 is cut in halves and cooling down (not recuttable), both its 3g instances free;
    # GPU 1 is whole and free. Three 3g instances: one recut of GPU 1 plus GPU 0's free ones.
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "halves", False), AdaptiveGpu("node-a", gpu(1), pol, "whole", True)]
    trio = demand("trio", {**MIG_3G, "exactly": {**MIG_3G["exactly"], "count": 3}})
    without = plan_recuts([trio], gpus, CLASSES, {"adaptive": 2})
    assert without.recuts == ()
    assert without.waiting == ("team-a/trio",), "not offered GPU 0's devices, no one recut is enough"
    plan = plan_recuts([trio], gpus, CLASSES, {"adaptive": 2}, free={"node-a": _halves_slots(pol, 0)})
    assert [(r.index, r.layout, r.claims) for r in plan.recuts] == [(1, "halves", ("team-a/trio",))]
    assert set(plan.placed["team-a/trio"]) == {gpu(0).uuid, gpu(1).uuid}


def test_a_gpu_is_never_recut_to_the_layout_it_has() -> None:
    pol = policy()
    # GPU 0 is already in halves, free and recuttable; its devices are offered as free. The
    # claim needs three 3g instances: only GPU 1 is recut, GPU 0 serves as it is.
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "halves", True), AdaptiveGpu("node-a", gpu(1), pol, "whole", True)]
    trio = demand("trio", {**MIG_3G, "exactly": {**MIG_3G["exactly"], "count": 3}})
    plan = plan_recuts([trio], gpus, CLASSES, {"adaptive": 2}, free={"node-a": _halves_slots(pol, 0)})
    assert [(r.index, r.layout) for r in plan.recuts] == [(1, "halves")]
    assert set(plan.placed["team-a/trio"]) == {gpu(0).uuid, gpu(1).uuid}


def test_the_devices_of_a_gpu_being_recut_are_not_counted_beside_its_new_ones() -> None:
    pol = policy()
    # GPU 0 is whole, free and recuttable: its whole device is offered as free. Recut, that
    # device is gone: three devices of any kind need seven 1g slices, not two halves beside
    # the whole device that would no longer exist.
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "whole", True), AdaptiveGpu("node-a", gpu(1), pol, "whole", False)]
    whole_slots = slots_of(menu_devices(pol, gpu(0))[0].devices)
    three = demand("three", exactly("gpu.tessera.dev", count=3))
    plan = plan_recuts([three], gpus, CLASSES, {"adaptive": 2}, free={"node-a": whole_slots})
    assert [(r.index, r.layout) for r in plan.recuts] == [(0, "slices")]
    assert plan.placed["team-a/three"] == (gpu(0).uuid,)


def test_a_gpu_away_from_the_idle_layout_is_recut_before_a_whole_one() -> None:
    pol = policy()
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "whole", True), AdaptiveGpu("node-a", gpu(1), pol, "slices", True)]
    plan = plan_recuts([demand("m", MIG_3G)], gpus, CLASSES, {"adaptive": 2})
    assert [(r.index, r.layout) for r in plan.recuts] == [(1, "halves")]


def test_on_a_tie_the_node_with_the_fewest_gpus_free_to_recut_is_recut() -> None:
    pol = policy()
    # node-a sorts first but has four free GPUs; node-b has one (the rest busy). Cutting
    # node-b keeps node-a whole for a claim of many GPUs.
    gpus = [AdaptiveGpu("node-a", gpu(i), pol, "whole", True) for i in range(4)]
    gpus += [AdaptiveGpu("node-b", gpu(i), pol, "whole", i == 3) for i in range(4)]
    plan = plan_recuts([demand("m", MIG_3G)], gpus, CLASSES, {"adaptive": 2})
    assert [(r.node, r.index) for r in plan.recuts] == [("node-b", 3)]


# ---------------------------------------------------------------- ahead of demand


def test_claims_like_the_recent_ones_get_a_gpu_recut_ahead_when_nothing_published_fits_them() -> None:
    pol = policy()
    gpus = adaptive_gpus(3, current="whole")
    whole = {"node-a": [s for g in gpus for s in slots_of(menu_devices(pol, g.gpu)[0].devices)]}
    expected = [demand("e0", MIG_3G), demand("e1", MIG_3G), demand("e2", MIG_3G)]
    ahead = plan_ahead(expected, gpus, CLASSES, {"adaptive": 2}, free=whole)
    assert [(r.layout, r.ahead) for r in ahead.recuts] == [("halves", True), ("halves", True)]
    assert ahead.recuts[0].reason == "recut ahead for claims like team-a/e0, team-a/e1"
    assert ahead.keep == frozenset(), "no expected claim fits a device published now"


def test_expected_claims_that_fit_free_devices_keep_those_gpus_and_recut_nothing() -> None:
    pol = policy()
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "halves", True), AdaptiveGpu("node-a", gpu(1), pol, "whole", True)]
    free = {"node-a": [*_halves_slots(pol, 0), *slots_of(menu_devices(pol, gpu(1))[0].devices)]}
    ahead = plan_ahead([demand("e", MIG_3G), demand("w", WHOLE)], gpus, CLASSES, {"adaptive": 2}, free=free)
    assert ahead.recuts == ()
    assert ahead.keep == {gpu(0).uuid, gpu(1).uuid}
    nothing = plan_recuts([], gpus, CLASSES, {"adaptive": 2})
    assert back_to_idle(gpus, nothing) == [gpus[0]], "unkept, the free cut GPU goes back to idle"
    assert back_to_idle(gpus, nothing, keep=ahead.keep) == [], "kept for the claims expected"


def test_ahead_recuts_spare_busy_gpus_and_respect_the_cap() -> None:
    gpus = adaptive_gpus(2, current="whole")
    expected = [demand("e", MIG_3G)]
    assert plan_ahead(expected, gpus, CLASSES, {"adaptive": 0}, free={}).recuts == ()
    busy = plan_ahead(expected, gpus, CLASSES, {"adaptive": 2}, free={}, busy={gpus[0].gpu.uuid})
    assert [r.index for r in busy.recuts] == [1]


def test_claims_of_the_cooldown_keep_the_free_devices_they_would_use_but_recut_nothing() -> None:
    # Hysteresis: a 3g claim that came within the cooldown, but before the lead time, keeps the
    # free halves GPU it would use from going back to idle (no recut ahead for it, though);
    # the free sevenths GPU no such claim would use goes back.
    pol = policy()
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "halves", True), AdaptiveGpu("node-a", gpu(1), pol, "whole", True)]
    free = {"node-a": [*_halves_slots(pol, 0), *slots_of(menu_devices(pol, gpu(1))[0].devices)]}
    lately = [demand("old", MIG_3G)]
    ahead = plan_ahead([], gpus, CLASSES, {"adaptive": 2}, free=free, lately=lately)
    assert ahead.recuts == ()
    assert ahead.keep == {gpu(0).uuid}
    nothing = plan_recuts([], gpus, CLASSES, {"adaptive": 2})
    assert back_to_idle(gpus, nothing, keep=ahead.keep) == []
    assert back_to_idle(gpus, nothing, keep=plan_ahead([], gpus, CLASSES, {"adaptive": 2}, free=free).keep) == [
        gpus[0]], "no claim within the cooldown: back to idle"


def test_claims_of_the_cooldown_take_free_devices_only_after_the_expected_ones() -> None:
    # One free 3g device and two whole GPUs: the expected 3g claim takes the device as it is;
    # the older one finds nothing left and causes no recut (only the expected claims do).
    pol = policy()
    gpus = [AdaptiveGpu("node-a", gpu(0), pol, "halves", False), AdaptiveGpu("node-a", gpu(1), pol, "whole", True)]
    free = {"node-a": [*_halves_slots(pol, 0)[:1], *slots_of(menu_devices(pol, gpu(1))[0].devices)]}
    ahead = plan_ahead([demand("new", MIG_3G)], gpus, CLASSES, {"adaptive": 2}, free=free,
                       lately=[demand("old", MIG_3G)])
    assert ahead.recuts == ()
    assert ahead.keep == {gpu(0).uuid}


# ---------------------------------------------------------------- nodes kept for gang claims


def _two_nodes(pol: SharingPolicy, busy_a: int, busy_b: int) -> tuple[list[AdaptiveGpu], set[str], dict[str, list]]:
    """node-a (GPUs 0-3) and node-b (GPUs 4-7), whole; the first ``busy_*`` GPUs of each held.
    Returns the GPUs, the busy UUIDs and the free devices per node."""
    gpus, busy, free = [], set(), {}
    for node, first, held in (("node-a", 0, busy_a), ("node-b", 4, busy_b)):
        for i in range(first, first + 4):
            taken = i - first < held
            gpus.append(AdaptiveGpu(node, gpu(i), pol, "whole", not taken))
            if taken:
                busy.add(gpu(i).uuid)
            else:
                free.setdefault(node, []).extend(slots_of(menu_devices(pol, gpu(i))[0].devices))
    return gpus, busy, free


GANG_4 = exactly("whole-gpu.tessera.dev", count=4)


def test_a_claim_no_single_gpu_can_host_keeps_the_node_closest_to_empty() -> None:
    pol = policy()
    gpus, busy, free = _two_nodes(pol, busy_a=2, busy_b=1)
    gang, small = demand("gang", GANG_4), demand("small", WHOLE)
    kept = plan_reservations([small, gang], gpus, CLASSES, free=free, busy=busy, limit=2)
    assert [(r.node, r.claim, r.ready) for r in kept] == [("node-b", "team-a/gang", False)], \
        "one GPU serves the small claim: nothing is kept for it; node-b has the fewest busy GPUs"
    # No other claim is planned on the kept node: the small MIG claim is recut on node-a.
    plan = plan_recuts([demand("m", MIG_3G)], gpus, CLASSES, {"adaptive": 2}, free=free,
                       reserved={r.node: r.claim for r in kept})
    assert [r.node for r in plan.recuts] == ["node-a"]
    ahead = plan_ahead([demand("e", WHOLE), demand("e2", MIG_3G)], gpus, CLASSES, {"adaptive": 2}, free=free,
                       reserved={"node-b"})
    assert set(ahead.keep) | {r.gpu for r in ahead.recuts} <= {g.gpu.uuid for g in gpus if g.node == "node-a"}


def test_a_kept_node_stays_kept_while_it_could_host_and_is_ready_once_its_free_devices_fit() -> None:
    pol = policy()
    gpus, busy, free = _two_nodes(pol, busy_a=2, busy_b=3)
    gang = demand("gang", GANG_4)
    first = plan_reservations([gang], gpus, CLASSES, free=free, busy=busy, limit=1)
    assert [(r.node, r.ready) for r in first] == [("node-a", False)]
    # node-b now has fewer busy GPUs, but the claim keeps the node it has (no moving drain).
    gpus, busy, free = _two_nodes(pol, busy_a=1, busy_b=0)
    assert [(r.node, r.ready) for r in plan_reservations([gang], gpus, CLASSES, free=free, busy=busy,
                                                         previous={"team-a/gang": "node-a"}, limit=1)] \
        == [("node-a", False)]
    gpus, busy, free = _two_nodes(pol, busy_a=0, busy_b=2)
    ready = plan_reservations([gang], gpus, CLASSES, free=free, busy=busy, previous={"team-a/gang": "node-a"},
                              limit=1)
    assert [(r.node, r.ready) for r in ready] == [("node-a", True)]


def test_reservations_respect_the_limit_and_one_claim_per_node() -> None:
    pol = policy()
    gpus, busy, free = _two_nodes(pol, busy_a=1, busy_b=1)
    gangs = [demand(f"g{i}", GANG_4) for i in range(3)]
    kept = plan_reservations(gangs, gpus, CLASSES, free=free, busy=busy, limit=5)
    assert [(r.node, r.claim) for r in kept] == [("node-a", "team-a/g0"), ("node-b", "team-a/g1")], \
        "two nodes, two claims kept; the third waits for one"
    assert len(plan_reservations(gangs, gpus, CLASSES, free=free, busy=busy, limit=1)) == 1
    too_big = demand("big", exactly("whole-gpu.tessera.dev", count=5))
    assert plan_reservations([too_big], gpus, CLASSES, free=free, busy=busy, limit=2) == [], \
        "no node could ever host it: nothing is drained for it"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 5)), min_size=1, max_size=6),
       st.integers(0, 4), st.integers(0, 4), st.integers(0, 3))
def test_reservations_never_share_a_node_and_plans_never_place_others_on_one(
    claims: list[tuple[int, int]], busy_a: int, busy_b: int, limit: int
) -> None:
    pol = policy()
    gpus, busy, free = _two_nodes(pol, busy_a, busy_b)
    pending = [demand(f"c{i}", exactly("whole-gpu.tessera.dev", count=n) if kind else MIG_3G)
               for i, (kind, n) in enumerate(claims)]
    kept = plan_reservations(pending, gpus, CLASSES, free=free, busy=busy, limit=limit)
    assert len(kept) <= limit
    assert len({r.node for r in kept}) == len(kept)
    reserved = {r.node: r.claim for r in kept}
    plan = plan_recuts(pending, gpus, CLASSES, {"adaptive": 4}, free=free, reserved=reserved)
    nodes = {g.gpu.uuid: g.node for g in gpus}
    for claim, uuids in plan.placed.items():
        for uuid in uuids:
            assert reserved.get(nodes[uuid], claim) == claim, f"{claim} planned on a node kept for another"
    for recut in plan.recuts:
        for claim in recut.claims:
            assert reserved.get(recut.node, claim) == claim
