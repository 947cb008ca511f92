"""``tessera plan --live``'s pure part: a Fleet as the cluster reports it, policy files that
replace or join the cluster's policies, and per GPU today's layout, the new one, the devices
that would drain and the claims holding them, and the conflicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.cli import main
from tessera.cli.liveplan import adaptive_preview, live_rows, render_adaptive, render_live
from tessera.models.policy import SharingPolicy
from tests.controller_fleet import NODE, applied, claim_body, fleet_of, layout_of, policy_body
from tests.dra_gpus import gpu, mig_gpu

POLICY = Path(__file__).resolve().parents[1] / "examples" / "policies" / "h100-inference.yaml"


def _policy(name: str, **spec: object) -> SharingPolicy:
    return SharingPolicy.model_validate(policy_body(name, **spec))


def test_a_policy_change_shows_the_devices_that_would_drain_and_the_claim_that_holds_one() -> None:
    now = mig_gpu(0, policy="mig")  # 3g@0, 2g@4, 1g@6
    spare = applied(gpu(1), layout_of(gpu(1), "mig"))
    fleet = fleet_of(
        [now, spare], [layout_of(now, "mig"), layout_of(spare, "mig")],
        policies=[policy_body("mig", strategy="MIG", mig={"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}},
                              gpuSelector={"cel": 'device.attributes["gpu.tessera.dev"].index == 0'})],
        claims=[claim_body("train", ["gpu-0-mig-2g-20gb-4"], namespace="ml", pods=["trainer"])],
    )
    whole = _policy("mig", strategy="MIG", mig={"preset": "whole"},
                    gpuSelector={"cel": 'device.attributes["gpu.tessera.dev"].index == 0'})

    plan = live_rows(fleet, [whole])

    row = next(r for r in plan.rows if r.index == 0)
    assert row.today == "MIG 3g.40gb@0 2g.20gb@4 1g.10gb@6"
    assert row.new == "MIG 7g.80gb@0"
    assert row.drains == ("gpu-0-mig-1g-10gb-6", "gpu-0-mig-2g-20gb-4", "gpu-0-mig-3g-40gb-0")
    assert row.holders == (("gpu-0-mig-2g-20gb-4", "ml/train"),)
    other = next(r for r in plan.rows if r.index == 1)
    assert other.drains == ()
    text = render_live(plan)
    assert "gpu-0-mig-2g-20gb-4  held by ml/train" in text
    assert "drains  3 device(s); 1 held by a claim" in text
    assert "free: gpu-0-mig-1g-10gb-6 gpu-0-mig-3g-40gb-0" in text


def test_the_cluster_as_it_is_changes_nothing() -> None:
    now = mig_gpu(0, policy="mig")
    body = policy_body("mig", strategy="MIG", mig={"profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}})
    fleet = fleet_of([now], [layout_of(now, "mig")], policies=[body],
                     claims=[claim_body("train", ["gpu-0-mig-2g-20gb-4"], namespace="ml")])

    (row,) = live_rows(fleet, [SharingPolicy.model_validate(body)]).rows

    assert (row.drains, row.holders, row.changes) == ((), (), False)
    assert row.today == row.new


def test_a_new_policy_that_outranks_another_is_reported_as_a_conflict() -> None:
    now = gpu(0)
    fleet = fleet_of([now], [layout_of(now, "base")], policies=[policy_body("base", strategy="Exclusive")],
                     claims=[claim_body("job", ["gpu-0"], namespace="team-a")])
    slicing = _policy("slicing", priority=10, strategy="TimeSlicing", timeSlicing={"replicas": 4})

    plan = live_rows(fleet, [slicing])

    (row,) = plan.rows
    assert (row.policy_today, row.policy_new) == ("base", "slicing")
    assert row.new == "TimeSlicing x4"
    assert row.holders == (("gpu-0", "team-a/job"),), "a change of strategy drains the whole GPU"
    ((conflict),) = plan.conflicts
    assert (conflict.node, conflict.winner, conflict.losers) == (NODE, "slicing", ("base",))
    assert "slicing wins over base" in render_live(plan)


def test_live_without_a_reachable_cluster_says_so_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--policy", str(POLICY), "--live", "--kubeconfig", str(tmp_path / "missing")])
    assert code == 2
    assert "tessera plan --live: cannot read the cluster" in capsys.readouterr().err


def test_live_and_an_inventory_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--policy", str(POLICY), "--live", "--inventory", "inv.yaml"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_gpu_no_policy_selects_stays_as_it_is() -> None:
    now = mig_gpu(0)  # made by hand: no policy
    fleet = fleet_of([now])

    (row,) = live_rows(fleet, [_policy("elsewhere", strategy="Exclusive",
                                       nodeSelector={"matchLabels": {"pool": "other"}})]).rows

    assert (row.policy_today, row.policy_new) == (None, None)
    assert row.new == row.today == "MIG 3g.40gb@0 2g.20gb@4 1g.10gb@6"
    assert (row.drains, row.changes) == ((), False)


def test_live_shows_what_an_adaptive_policy_would_recut_for_a_waiting_pod() -> None:
    adaptive = _policy("adaptive", strategy="Adaptive", adaptive={
        "layouts": [{"name": "whole"}, {"name": "halves", "strategy": "MIG", "mig": {"profiles": {"3g.40gb": 2}}}],
        "idle": "whole"})
    whole = [applied(gpu(i), layout_of(gpu(i), "adaptive")) for i in range(2)]
    spec = [layout_of(g, "adaptive").model_copy(update={"menu_layout": "whole"}) for g in whole]
    fleet = fleet_of(whole, spec)
    cel = 'device.attributes["gpu.tessera.dev"].migProfile == "3g.40gb"'
    claim = {"metadata": {"name": "llm-0", "namespace": "ml"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "mig.tessera.dev", "selectors": [{"cel": {"expression": cel}}]}}
    ]}}}
    pod = {"metadata": {"name": "llm", "namespace": "ml"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "llm-0"}]},
           "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}

    text = render_adaptive(adaptive_preview(fleet, [adaptive], [claim], [pod]))

    assert f"recut {NODE} GPU 0 to 'halves' (adaptive): recut for claim ml/llm-0" in text
    assert render_adaptive(adaptive_preview(fleet, [adaptive], [claim], [])).endswith("nothing waits: no recut")
    assert adaptive_preview(fleet, [], [claim], [pod]) is None, "no Adaptive policy: no preview"

    pair = {"metadata": {"name": "pair-0", "namespace": "ml"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "whole-gpu.tessera.dev", "count": 2}}]}}}
    waiting = {**pod, "metadata": {"name": "pair", "namespace": "ml"},
               "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "pair-0"}]}}
    text = render_adaptive(adaptive_preview(fleet, [adaptive], [pair], [waiting]))
    assert f"keep {NODE} for ml/pair-0 (no single GPU can host it" in text
