"""The reconciler against both backends (simulated, and NVML over the NVML stand-in), driven by
the same simulated GPUs: layouts apply, a second pass does nothing, a crash half-way heals on
restart, instances in use survive with a reason, Ampere waits for a reset without looping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tessera.agent.backends.base import DeviceBackend, GpuInfo
from tessera.agent.backends.simulated import SimulatedCrash, SimulatedHardware, parse_simulate_spec
from tessera.agent.reconciler import BlockReason, OpKind, apply_layout, plan_gpu
from tessera.models.layout import GpuLayout, NodeLayoutSpec, PlacedInstance
from tessera.models.policy import ShareStrategy, Strategy, TimeSliceInterval, TimeSlicingSpec
from tests.fake_pynvml import BACKEND_KINDS, backend_over


class Rig:
    """Simulated hardware plus a backend of one kind; ``restart()`` is a new agent process."""

    def __init__(self, kind: str, spec: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp = tmp_path
        self.hw = SimulatedHardware("node-a", parse_simulate_spec(spec), tmp_path / "gpus.json", str(tmp_path / "mps"))
        self.backend: DeviceBackend = backend_over(kind, self.hw, str(tmp_path / "mps"))

    def restart(self) -> None:
        self.backend.close()
        self.hw = SimulatedHardware.open(self.hw.state_file)  # type: ignore[arg-type]  # set above
        self.backend = backend_over(self.kind, self.hw, str(self.tmp / "mps"))

    def gpu(self, index: int) -> GpuInfo:
        return self.backend.inventory().gpus[index]

    def uuid(self, index: int) -> str:
        return self.gpu(index).uuid

    def placements(self, index: int) -> list[tuple[str, int]]:
        return [(i.profile, i.start) for i in self.gpu(index).instances]


@pytest.fixture(params=BACKEND_KINDS)
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Rig:
    return Rig(request.param, "2xH100-80GB,1xA100-80GB", tmp_path)


def mig(uuid: str, *placed: tuple[str, int], **kw: Any) -> GpuLayout:
    return GpuLayout(
        uuid=uuid,
        strategy=Strategy.MIG,
        mig_instances=[PlacedInstance(profile=p, start=s) for p, s in placed],
        **kw,
    )


def spec(*gpus: GpuLayout) -> NodeLayoutSpec:
    return NodeLayoutSpec(gpus=list(gpus))


BALANCED = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))


def test_a_mig_layout_is_applied_in_order_and_a_second_pass_does_nothing(rig: Rig) -> None:
    want = spec(mig(rig.uuid(0), *BALANCED))
    first = apply_layout(rig.backend, want)
    kinds = [op.kind for op in first.executed]
    assert kinds == [OpKind.SET_MIG_MODE] + [OpKind.CREATE_INSTANCE] * 4
    assert rig.placements(0) == list(BALANCED)
    assert all(p.converged for p in first.plans)
    assert all(i.uuid and i.uuid.startswith("MIG-") for i in rig.gpu(0).instances)

    second = apply_layout(rig.backend, want)
    assert second.executed == []
    assert second.failures == []


def test_gpus_absent_from_the_spec_are_left_alone(rig: Rig) -> None:
    rig.hw.set_mig_mode(1, True)
    result = apply_layout(rig.backend, spec(mig(rig.uuid(0), ("7g.80gb", 0))))
    assert {op.gpu_index for op in result.executed} == {0}
    assert rig.gpu(1).mig_mode_current


def test_a_changed_layout_destroys_before_it_creates(rig: Rig) -> None:
    apply_layout(rig.backend, spec(mig(rig.uuid(0), ("3g.40gb", 0), ("3g.40gb", 4))))
    result = apply_layout(rig.backend, spec(mig(rig.uuid(0), ("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5))))
    assert [op.kind for op in result.executed] == [OpKind.DESTROY_INSTANCE] + [OpKind.CREATE_INSTANCE] * 2
    assert rig.placements(0) == [("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)]


@pytest.mark.parametrize(
    ("operation", "after"),
    [
        ("create_gpu_instance", 0),
        ("create_gpu_instance", 2),
        ("create_compute_instance", 0),  # a GI without its CI is left behind
        ("create_compute_instance", 3),
        ("set_mig_mode", 0),
    ],
)
def test_a_crash_in_the_middle_heals_after_a_restart(rig: Rig, operation: str, after: int) -> None:
    want = spec(mig(rig.uuid(0), *BALANCED))
    rig.hw.fail_next(operation, "Crash", gpu_index=0, after=after)
    with pytest.raises(SimulatedCrash):
        apply_layout(rig.backend, want)

    rig.restart()
    result = apply_layout(rig.backend, want)
    assert result.failures == []
    assert all(p.converged for p in result.plans)
    assert rig.placements(0) == list(BALANCED)
    assert all(i.compute_instance_id is not None for i in rig.gpu(0).instances)


def test_a_crash_while_tearing_down_heals_after_a_restart(rig: Rig) -> None:
    apply_layout(rig.backend, spec(mig(rig.uuid(0), *BALANCED)))
    rig.hw.fail_next("destroy_gpu_instance", "Crash", gpu_index=0, after=1)  # CI gone, GI stays
    with pytest.raises(SimulatedCrash):
        apply_layout(rig.backend, spec(GpuLayout(uuid=rig.uuid(0))))
    assert any(i.compute_instance_id is None for i in rig.gpu(0).instances)

    rig.restart()
    result = apply_layout(rig.backend, spec(GpuLayout(uuid=rig.uuid(0))))
    assert all(p.converged for p in result.plans)
    gpu = rig.gpu(0)
    assert gpu.instances == ()
    assert not gpu.mig_mode_current


def test_an_instance_in_use_survives_a_spec_that_removes_it(rig: Rig) -> None:
    apply_layout(rig.backend, spec(mig(rig.uuid(1), *BALANCED)))
    busy = next(i for i in rig.gpu(1).instances if i.start == 1)
    assert busy.uuid is not None
    rig.hw.hold(busy.uuid, "pid:4242")  # a process runs on 1g.10gb at slice 1

    want = spec(mig(rig.uuid(1), ("3g.40gb", 0), ("3g.40gb", 4)))
    result = apply_layout(rig.backend, want)
    assert ("1g.10gb", 1) in rig.placements(1)
    assert ("3g.40gb", 4) in rig.placements(1)  # the part that does not touch the busy one is done
    plan = result.plan(rig.uuid(1))
    assert plan is not None
    assert [b.reason for b in plan.blockers] == [BlockReason.INSTANCE_IN_USE]
    assert plan.blockers[0].message == "GPU 1: 1g.10gb at slice 1 is in use; the spec wants 3g.40gb at slice 0"
    assert not any(op.kind is OpKind.DESTROY_INSTANCE and op.start == 1 for op in result.executed)

    again = apply_layout(rig.backend, want)
    assert again.executed == []  # blocked, not looping

    rig.hw.release(busy.uuid, "pid:4242")
    done = apply_layout(rig.backend, want)
    assert all(p.converged for p in done.plans)
    assert rig.placements(1) == [("3g.40gb", 0), ("3g.40gb", 4)]


def test_mig_mode_does_not_change_under_a_busy_gpu(rig: Rig) -> None:
    rig.hw.hold(rig.uuid(0), "pid:7")
    result = apply_layout(rig.backend, spec(mig(rig.uuid(0), ("7g.80gb", 0))))
    assert result.executed == []
    plan = result.plan(rig.uuid(0))
    assert plan is not None
    assert [b.reason for b in plan.blockers] == [BlockReason.GPU_IN_USE]
    assert not rig.gpu(0).mig_mode_current


def test_ampere_waits_for_a_reset_and_does_not_loop(rig: Rig) -> None:
    a100 = rig.uuid(2)
    want = spec(mig(a100, ("7g.80gb", 0)))
    first = apply_layout(rig.backend, want)
    assert [op.kind for op in first.executed] == [OpKind.SET_MIG_MODE]
    gpu = rig.gpu(2)
    assert (gpu.mig_mode_current, gpu.mig_mode_pending) == (False, True)
    plan = first.plan(a100)
    assert plan is not None
    assert [b.reason for b in plan.blockers] == [BlockReason.RESET_REQUIRED]
    assert "nvidia-smi -r -i 2" in plan.blockers[0].message

    assert apply_layout(rig.backend, want).executed == []

    rig.hw.reset_gpu(2)
    done = apply_layout(rig.backend, want)
    assert [op.kind for op in done.executed] == [OpKind.CREATE_INSTANCE]
    assert rig.placements(2) == [("7g.80gb", 0)]


def test_dynamic_mig_keeps_instances_in_use_and_clears_idle_leftovers(rig: Rig) -> None:
    apply_layout(rig.backend, spec(mig(rig.uuid(0), ("3g.40gb", 0), ("3g.40gb", 4))))
    busy = next(i for i in rig.gpu(0).instances if i.start == 4)
    assert busy.uuid is not None
    rig.hw.hold(busy.uuid, "claim-1")

    result = apply_layout(rig.backend, spec(GpuLayout(uuid=rig.uuid(0), strategy=Strategy.DYNAMIC_MIG)))
    assert rig.placements(0) == [("3g.40gb", 4)]
    assert rig.gpu(0).mig_mode_current
    assert all(p.converged for p in result.plans)


def test_the_plugin_can_create_a_held_instance_that_the_reconciler_keeps(rig: Rig) -> None:
    dyn = spec(GpuLayout(uuid=rig.uuid(0), strategy=Strategy.DYNAMIC_MIG))
    apply_layout(rig.backend, dyn)
    made = rig.backend.create_instance(rig.uuid(0), "2g.20gb", 2, hold="claim-9")
    assert apply_layout(rig.backend, dyn).executed == []
    assert rig.placements(0) == [("2g.20gb", 2)]
    rig.backend.release(made.uuid, "claim-9")
    if rig.kind == "simulated":  # NVML holds are per process: the hardware shows no process
        assert not rig.gpu(0).in_use
    apply_layout(rig.backend, dyn)
    assert rig.placements(0) == []


def test_time_slicing_sets_the_interval_and_mps_runs_a_daemon(rig: Rig) -> None:
    ts = GpuLayout(
        uuid=rig.uuid(0), strategy=Strategy.TIME_SLICING, time_slicing=TimeSlicingSpec(interval="Long")
    )
    mps = GpuLayout(uuid=rig.uuid(1), strategy=Strategy.MPS)
    result = apply_layout(rig.backend, spec(ts, mps))
    assert {(op.gpu_index, op.kind) for op in result.executed} == {(0, OpKind.SET_TIME_SLICE), (1, OpKind.START_MPS)}
    assert rig.gpu(0).time_slice is TimeSliceInterval.LONG
    assert rig.gpu(1).mps_running
    assert apply_layout(rig.backend, spec(ts, mps)).executed == []

    back = apply_layout(rig.backend, spec(GpuLayout(uuid=rig.uuid(0)), GpuLayout(uuid=rig.uuid(1))))
    assert {(op.gpu_index, op.kind) for op in back.executed} == {(0, OpKind.SET_TIME_SLICE), (1, OpKind.STOP_MPS)}
    assert not rig.gpu(1).mps_running


def test_mig_instances_shared_by_mps_each_get_a_daemon_after_creation(rig: Rig) -> None:
    want = spec(mig(rig.uuid(0), ("3g.40gb", 0), ("3g.40gb", 4), mig_sharing=ShareStrategy.MPS))
    result = apply_layout(rig.backend, want)
    assert [op.kind for op in result.executed][-2:] == [OpKind.START_MPS, OpKind.START_MPS]
    assert result.rounds == 3  # MIG mode, then the instances, then their daemons (they need MIG UUIDs)
    assert all(i.mps_running for i in rig.gpu(0).instances)


def test_a_failed_create_is_reported_and_retried_on_the_next_pass(rig: Rig) -> None:
    want = spec(mig(rig.uuid(0), ("7g.80gb", 0)))
    rig.hw.fail_next("create_gpu_instance", "InsufficientResources", gpu_index=0)
    result = apply_layout(rig.backend, want)
    assert len(result.failures) == 1
    plan = result.plan(rig.uuid(0))
    assert plan is not None
    assert BlockReason.OPERATION_FAILED in [b.reason for b in plan.blockers]
    assert "create 7g.80gb at slice 0 failed" in plan.blockers[-1].message
    assert all(i.compute_instance_id is not None for i in rig.gpu(0).instances)

    assert all(p.converged for p in apply_layout(rig.backend, want).plans)
    assert rig.placements(0) == [("7g.80gb", 0)]


def test_a_lost_gpu_blocks_only_itself(rig: Rig) -> None:
    lost_uuid = rig.uuid(1)  # the agent saw it before it was lost (NVML then knows its UUID)
    rig.hw.lose_gpu(1)
    result = apply_layout(rig.backend, spec(mig(rig.uuid(0), ("7g.80gb", 0)), mig(lost_uuid, ("7g.80gb", 0))))
    lost = result.plan(lost_uuid)
    assert lost is not None
    assert [b.reason for b in lost.blockers] == [BlockReason.GPU_LOST]
    assert rig.placements(0) == [("7g.80gb", 0)]


def test_an_impossible_layout_is_refused_with_the_reason(rig: Rig) -> None:
    result = apply_layout(rig.backend, spec(mig(rig.uuid(0), ("3g.40gb", 0), ("4g.40gb", 0), ("1g.5gb", 7))))
    plan = result.plan(rig.uuid(0))
    assert plan is not None
    assert result.executed == []
    assert [b.reason for b in plan.blockers] == [BlockReason.INVALID_LAYOUT]
    assert "4g.40gb at slice 0 overlaps 3g.40gb at slice 0" in plan.blockers[0].message
    assert "no MIG profile 1g.5gb" in plan.blockers[0].message


def test_a_plan_for_a_converged_gpu_is_empty() -> None:
    gpu = GpuInfo(uuid="GPU-x", index=0, product_name="NVIDIA H100 80GB HBM3", memory_mib=81559)
    plan = plan_gpu(GpuLayout(uuid="GPU-x"), gpu)
    assert plan.converged
    assert plan_gpu(None, gpu).converged
