"""plan_gpu_layout: one policy on one GPU, with the GPU's current layout and what is in use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.models.catalog import MODELS, MODELS_BY_KEY
from tessera.models.layout import GpuStatus
from tessera.models.policy import ShareStrategy, SharingPolicySpec, Strategy
from tessera.planner import PlanError, PlanErrorReason, plan_gpu_layout
from tessera.planner.inventory import catalog_gpu, mig_uuid


def _spec(**kwargs: Any) -> SharingPolicySpec:
    return SharingPolicySpec.model_validate(kwargs)


def _gpu(model: str = "H100-80GB", instances: Sequence[tuple[str, int, bool]] = (), **fields: Any) -> GpuStatus:
    catalog = MODELS_BY_KEY[model]
    mig = [
        {
            "profile": profile,
            "start": start,
            "size": catalog.profile(profile).memory_slices,
            "uuid": mig_uuid("g", start, profile),
            "gpu_instance_id": n,
            "memory_mib": catalog.profile(profile).memory_mib,
            "in_use": in_use,
        }
        for n, (profile, start, in_use) in enumerate(instances, start=1)
    ]
    if mig:
        fields.setdefault("mig_mode_current", True)
    return catalog_gpu("node", 0, model, mig_instances=mig, **fields)


def _layout(spec: SharingPolicySpec, gpu: GpuStatus) -> list[tuple[str, int]]:
    return [(i.profile, i.start) for i in plan_gpu_layout(spec, gpu).mig_instances]


@pytest.mark.parametrize("model", [m.key for m in MODELS])
def test_presets_on_every_model(model: str) -> None:
    gpu = _gpu(model)
    ones = _layout(_spec(strategy="MIG", mig={"preset": "all-1g"}), gpu)
    assert [start for _, start in ones] == [0, 1, 2, 3, 4, 5, 6]
    assert {p for p, _ in ones} == {MODELS_BY_KEY[model].profiles[0].name}
    whole = _layout(_spec(strategy="MIG", mig={"preset": "whole"}), gpu)
    assert [(p[:2], s) for p, s in whole] == [("7g", 0)]
    balanced = _layout(_spec(strategy="MIG", mig={"preset": "all-balanced"}), gpu)
    assert sorted(p.split(".")[0] for p, _ in balanced) == ["1g", "1g", "2g", "3g"]


def test_layout_carries_policy_strategy_and_sharing() -> None:
    spec = _spec(
        strategy="MIG",
        mig={"preset": "all-balanced", "sharing": {"strategy": "MPS"}},
        mps={"compute": {"default": 25, "values": [25, 50]}},
    )
    layout = plan_gpu_layout(spec, _gpu(), policy="p")
    assert (layout.policy, layout.strategy, layout.mig_sharing) == ("p", Strategy.MIG, ShareStrategy.MPS)
    assert layout.mps is not None
    assert layout.mps.compute.default == 25
    assert layout.time_slicing is None
    assert [i.start for i in layout.mig_instances] == sorted(i.start for i in layout.mig_instances)


def test_time_slicing_defaults_come_from_the_spec() -> None:
    layout = plan_gpu_layout(_spec(strategy="TimeSlicing"), _gpu())
    assert layout.time_slicing is not None
    assert layout.time_slicing.replicas == 4
    assert layout.mig_instances == []


def test_keeps_the_in_use_instance_where_it_is() -> None:
    gpu = _gpu(instances=[("1g.10gb", 3, True)])
    layout = _layout(_spec(strategy="MIG", mig={"profiles": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}), gpu)
    assert ("1g.10gb", 3) in layout
    assert layout == [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]


def test_keeps_idle_instances_the_new_layout_also_wants() -> None:
    gpu = _gpu(instances=[("3g.40gb", 0, False), ("1g.10gb", 6, False)])
    layout = _layout(_spec(strategy="MIG", mig={"profiles": {"3g.40gb": 1, "1g.10gb": 3}}), gpu)
    assert ("3g.40gb", 0) in layout
    assert ("1g.10gb", 6) in layout


def test_blocked_says_which_slices_and_which_instance() -> None:
    gpu = _gpu(instances=[("1g.10gb", 5, True)])
    with pytest.raises(PlanError) as caught:
        plan_gpu_layout(_spec(strategy="MIG", mig={"profiles": {"3g.40gb": 2}}), gpu)
    assert caught.value.reason is PlanErrorReason.BLOCKED
    assert "1g.10gb at slice 5 is in use and the policy asks for no 1g.10gb" in caught.value.message
    assert [i.start for i in caught.value.blocking] == [5]
    assert caught.value.when_idle is not None
    assert [(i.profile, i.start) for i in caught.value.when_idle.mig_instances] == [("3g.40gb", 0), ("3g.40gb", 4)]


def test_the_issue_example_message() -> None:
    gpu = _gpu(instances=[("1g.10gb", 5, True)])
    with pytest.raises(PlanError, match=r"3g\.40gb needs memory slices 4-7; 1g\.10gb at slice 5 is in use"):
        plan_gpu_layout(_spec(strategy="MIG", mig={"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}), gpu)


def test_too_many_in_use_of_a_kind() -> None:
    gpu = _gpu(instances=[("1g.10gb", 0, True), ("1g.10gb", 1, True), ("1g.10gb", 2, True)])
    with pytest.raises(PlanError, match=r"3 x 1g\.10gb are in use \(slices 0, 1, 2\) and the policy asks for 2"):
        plan_gpu_layout(_spec(strategy="MIG", mig={"profiles": {"1g.10gb": 2}}), gpu)


def test_profile_the_model_lacks() -> None:
    with pytest.raises(PlanError, match=r"H200-141GB has no MIG profile '3g.40gb'; valid profiles: 1g.18gb") as caught:
        plan_gpu_layout(_spec(strategy="MIG", mig={"profiles": {"3g.40gb": 1}}), _gpu("H200-141GB"))
    assert caught.value.reason is PlanErrorReason.UNKNOWN_PROFILE


def test_profiles_that_fit_no_gpu() -> None:
    with pytest.raises(PlanError, match=r"2 x 4g\.40gb do not fit one H100-80GB: at most 1 x 4g fit one GPU"):
        plan_gpu_layout(_spec(strategy="MIG", mig={"profiles": {"4g.40gb": 2}}), _gpu())


@pytest.mark.parametrize("strategy", ["MIG", "DynamicMIG"])
def test_gpu_without_mig_gets_a_clear_error(strategy: str) -> None:
    l4 = GpuStatus(uuid="GPU-l4", index=1, product_name="NVIDIA L4", memory_mib=23034)
    spec = _spec(strategy=strategy, mig={"preset": "whole"}) if strategy == "MIG" else _spec(strategy=strategy)
    with pytest.raises(PlanError, match=r"needs a MIG-capable GPU Tessera's catalog knows; NVIDIA L4 is not in it"):
        plan_gpu_layout(spec, l4)
    no_mig = _gpu(mig_capable=False)
    with pytest.raises(PlanError, match="does not support it") as caught:
        plan_gpu_layout(spec, no_mig)
    assert caught.value.reason is PlanErrorReason.NO_MIG


def test_turning_mig_off_waits_for_instances_in_use() -> None:
    gpu = _gpu(instances=[("3g.40gb", 4, True)])
    with pytest.raises(PlanError, match=r"strategy Exclusive turns MIG off, .*3g\.40gb at slice 4 is in use") as caught:
        plan_gpu_layout(_spec(), gpu)
    assert caught.value.when_idle is not None
    assert caught.value.when_idle.strategy is Strategy.EXCLUSIVE
    assert plan_gpu_layout(_spec(), _gpu(instances=[("3g.40gb", 4, False)])).strategy is Strategy.EXCLUSIVE


def test_turning_mig_on_waits_for_an_idle_gpu() -> None:
    with pytest.raises(PlanError, match="turns MIG on, which needs an idle GPU"):
        plan_gpu_layout(_spec(strategy="MIG", mig={"preset": "whole"}), _gpu(in_use=True))


def test_dynamic_mig_keeps_dynamic_instances_but_not_static_ones_in_use() -> None:
    dynamic = _gpu(instances=[("1g.10gb", 0, True)])
    dynamic = dynamic.model_copy(
        update={"mig_instances": [dynamic.mig_instances[0].model_copy(update={"dynamic": True})]}
    )
    assert plan_gpu_layout(_spec(strategy="DynamicMIG"), dynamic).mig_instances == []
    with pytest.raises(PlanError, match="DynamicMIG has no static instances"):
        plan_gpu_layout(_spec(strategy="DynamicMIG"), _gpu(instances=[("1g.10gb", 0, True)]))


_PROFILES = st.dictionaries(
    st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    st.integers(1, 3),
    min_size=1,
    max_size=4,
)
_IN_USE = st.lists(st.tuples(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), st.integers(0, 6)), max_size=3)


@settings(max_examples=100, deadline=None)
@given(profiles=_PROFILES, in_use=_IN_USE)
def test_every_layout_keeps_in_use_instances_untouched(profiles: dict[str, int], in_use: list[tuple[str, int]]) -> None:
    model = MODELS_BY_KEY["H100-80GB"]
    used: set[int] = set()
    current: list[tuple[str, int, bool]] = []
    for name, start in in_use:
        profile = model.profile(name)
        covered = set(range(start, start + profile.memory_slices))
        if start in profile.starts and not covered & used:
            used |= covered
            current.append((name, start, True))
    gpu = _gpu(instances=current)
    spec = _spec(strategy="MIG", mig={"profiles": profiles})
    try:
        layout = plan_gpu_layout(spec, gpu)
    except PlanError as exc:
        error: PlanError | None = exc
    else:
        error = None
    if error is not None:  # refused: then with words, and never for a request that fits an idle GPU alone
        assert error.message
        assert error.reason in (PlanErrorReason.BLOCKED, PlanErrorReason.DOES_NOT_FIT)
        return
    placed = {(i.profile, i.start) for i in layout.mig_instances}
    assert {(name, start) for name, start, _ in current} <= placed
    assert sum(profiles.values()) == len(layout.mig_instances)
    assert layout == plan_gpu_layout(spec, gpu)
