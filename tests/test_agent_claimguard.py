"""The agent as the last line (unit level): which devices each operation changes, and the guard
that refuses an operation when a claim allocation names one of them, on both backends. The
same guard against the real API server is in tests/integration/test_agent_claimguard.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tessera import DRIVER_NAME
from tessera.agent.backends.base import DeviceBackend, GpuInfo
from tessera.agent.backends.simulated import SimulatedHardware, parse_simulate_spec
from tessera.agent.claimguard import ClaimGuard, allocated_devices_on_node
from tessera.agent.reconciler import BlockReason, Operation, OpKind, apply_layout, devices_changed
from tessera.agent.status import build_status
from tessera.models.layout import GpuLayout, GpuStatus, NodeLayoutSpec, NodeLayoutStatus, PlacedInstance
from tessera.models.policy import MpsSpec, Strategy, TimeSliceInterval, TimeSlicingSpec
from tests.fake_pynvml import BACKEND_KINDS, backend_over

NODE = "node-a"


def claim(
    name: str, *devices: str, node: str = NODE, driver: str = DRIVER_NAME, shared: bool = False, admin: bool = False
) -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": driver, "pool": node, "device": d,
         **({"shareID": "0a1b"} if shared else {}), **({"adminAccess": True} if admin else {})}
        for d in devices
    ]
    return {
        "metadata": {"namespace": "team-a", "name": name},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def mig(uuid: str, *placed: tuple[str, int]) -> GpuLayout:
    instances = [PlacedInstance(profile=p, start=s) for p, s in placed]
    return GpuLayout(uuid=uuid, strategy=Strategy.MIG, mig_instances=instances)


class Claims:
    """What the API would answer; counts the reads."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.items: list[dict[str, Any]] = list(claims)
        self.reads = 0
        self.fail: Exception | None = None

    def __call__(self) -> Sequence[Mapping[str, Any]]:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return list(self.items)


@pytest.fixture(params=BACKEND_KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> DeviceBackend:
    hw = SimulatedHardware(NODE, parse_simulate_spec("2xH100-80GB"), tmp_path / "gpus.json", str(tmp_path / "mps"))
    return backend_over(request.param, hw, str(tmp_path / "mps"))


def published(backend: DeviceBackend, spec: NodeLayoutSpec) -> NodeLayoutStatus:
    result = apply_layout(backend, spec)
    return build_status(result.inventory, spec, result.plans, backend="t", agent_version="t", observed_generation=1)


def guard_for(claims: Claims, spec: NodeLayoutSpec, status: NodeLayoutStatus | None) -> ClaimGuard:
    return ClaimGuard(claims, driver=DRIVER_NAME, node=NODE, spec=spec, published=status)


# -- pure parts ---------------------------------------------------------------------------


def test_only_allocations_of_our_driver_in_this_nodes_pool_count() -> None:
    claims = [
        claim("mine", "gpu-0", "gpu-1-mig-3g-40gb-4"),
        claim("other-node", "gpu-0", node="node-b"),
        claim("other-driver", "gpu-0", driver="gpu.nvidia.com"),
        {"metadata": {"namespace": "team-a", "name": "pending"}, "status": {}},
        claim("share", "gpu-1", shared=True),
        claim("monitor", "gpu-0", "gpu-1", admin=True),
    ]
    found = allocated_devices_on_node(claims, DRIVER_NAME, NODE)
    assert [(c.claim, c.device, c.shared) for c in found] == [
        ("team-a/mine", "gpu-0", False),
        ("team-a/share", "gpu-1", True),
        ("team-a/mine", "gpu-1-mig-3g-40gb-4", False),
    ]


def gpu_info(index: int = 0, **kw: Any) -> GpuInfo:
    return GpuInfo(uuid=f"GPU-{index}", index=index, product_name="NVIDIA H100 80GB HBM3", memory_mib=81559, **kw)


def test_each_destructive_operation_names_the_devices_it_changes() -> None:
    gpu = gpu_info(1)
    destroy = Operation(OpKind.DESTROY_INSTANCE, gpu.uuid, 1, profile="3g.40gb", start=4, gpu_instance_id=2)
    changed = devices_changed(destroy, gpu, None, None)
    assert changed is not None
    assert changed.names == {"gpu-1-mig-3g-40gb-4", "gpu-1-dyn-3g-40gb-4"}
    assert not changed.covers("gpu-1")
    assert not changed.covers("gpu-1-mig-3g-40gb-0")

    mode = devices_changed(Operation(OpKind.SET_MIG_MODE, gpu.uuid, 1, enabled=False), gpu, None, None)
    assert mode is not None
    assert mode.covers("gpu-1")
    assert mode.covers("gpu-1-dyn-1g-10gb-6")
    assert mode.covers("gpu-1-mig-7g-80gb-0")
    assert not mode.covers("gpu-0")
    assert not mode.covers("gpu-10-mig-7g-80gb-0")
    assert not mode.covers("nvidia-0")

    create = Operation(OpKind.CREATE_INSTANCE, gpu.uuid, 1, profile="7g.80gb", start=0)
    assert devices_changed(create, gpu, None, None) is None


def test_restarting_an_mps_daemon_or_retiming_a_time_sliced_gpu_changes_nothing_published() -> None:
    gpu = gpu_info(0)
    start = Operation(OpKind.START_MPS, gpu.uuid, 0, device_uuid=gpu.uuid)
    mps = GpuLayout(uuid=gpu.uuid, strategy=Strategy.MPS, mps=MpsSpec())
    was_exclusive = GpuStatus(uuid=gpu.uuid, index=0, product_name="x", memory_mib=1, strategy=Strategy.EXCLUSIVE)
    was_mps = was_exclusive.model_copy(update={"strategy": Strategy.MPS})
    assert devices_changed(start, gpu, mps, was_mps) is None, "a daemon that died comes back: same devices"
    changed = devices_changed(start, gpu, mps, was_exclusive)
    assert changed is not None
    assert changed.names == {"gpu-0"}, "an exclusive GPU becomes shared"
    assert devices_changed(start, gpu, mps, None) is not None, "nothing published yet: check"

    long = TimeSlicingSpec(interval=TimeSliceInterval.LONG)
    ts = GpuLayout(uuid=gpu.uuid, strategy=Strategy.TIME_SLICING, time_slicing=long)
    retime = Operation(OpKind.SET_TIME_SLICE, gpu.uuid, 0, interval=TimeSliceInterval.LONG)
    was_ts = was_exclusive.model_copy(update={"strategy": Strategy.TIME_SLICING})
    assert devices_changed(retime, gpu, ts, was_ts) is None
    back = Operation(OpKind.SET_TIME_SLICE, gpu.uuid, 0, interval=TimeSliceInterval.DEFAULT)
    assert devices_changed(back, gpu, GpuLayout(uuid=gpu.uuid), was_ts) is not None, "time-slicing ends"


# -- the guard in apply_layout, on both backends -------------------------------------------


def test_a_claimed_instance_is_not_destroyed_and_the_claim_is_named(backend: DeviceBackend) -> None:
    gpu0 = backend.inventory().gpus[0].uuid
    before = NodeLayoutSpec(gpus=[mig(gpu0, ("3g.40gb", 0), ("3g.40gb", 4))])
    status = published(backend, before)
    claims = Claims(claim("vllm-0", "gpu-0-mig-3g-40gb-4"))
    after = NodeLayoutSpec(gpus=[mig(gpu0, ("7g.80gb", 0))])

    result = apply_layout(backend, after, guard=guard_for(claims, after, status))

    left = [(i.profile, i.start) for i in backend.inventory().gpus[0].instances]
    assert ("3g.40gb", 4) in left, "the claimed instance exists"
    assert [(op.kind, op.start) for op, _ in result.refusals] == [(OpKind.DESTROY_INSTANCE, 4)]
    (blocker,) = [b for b in result.plans[0].blockers if "refused" in b.message]
    assert blocker.reason is BlockReason.INSTANCE_IN_USE
    assert "ResourceClaim team-a/vllm-0 is allocated device gpu-0-mig-3g-40gb-4" in blocker.message
    status_after = build_status(
        result.inventory, after, result.plans, backend="t", agent_version="t", observed_generation=2
    )
    ready = next(c for c in status_after.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "InstanceInUse")
    assert "team-a/vllm-0" in ready.message

    claims.items.clear()  # the claim is released: the next pass goes through
    again = apply_layout(backend, after, guard=guard_for(claims, after, status_after))
    assert again.refusals == []
    assert [(i.profile, i.start) for i in backend.inventory().gpus[0].instances] == [("7g.80gb", 0)]


def test_a_dynamic_mig_gpu_with_an_allocated_partition_keeps_mig_mode(backend: DeviceBackend) -> None:
    gpu0 = backend.inventory().gpus[0].uuid
    dynamic = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu0, strategy=Strategy.DYNAMIC_MIG)])
    status = published(backend, dynamic)
    assert backend.inventory().gpus[0].mig_mode_current
    # Allocated by the scheduler, not prepared yet: no instance exists, nothing is "in use".
    claims = Claims(claim("trainer", "gpu-0-dyn-3g-40gb-0"))
    exclusive = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu0, strategy=Strategy.EXCLUSIVE)])

    result = apply_layout(backend, exclusive, guard=guard_for(claims, exclusive, status))

    assert backend.inventory().gpus[0].mig_mode_current, "MIG mode stays on for the allocated partition"
    assert [op.kind for op, _ in result.refusals] == [OpKind.SET_MIG_MODE]
    assert "team-a/trainer" in result.refusals[0][1].message


def test_an_exclusive_claim_keeps_its_gpu_from_becoming_an_mps_share(backend: DeviceBackend) -> None:
    gpu0 = backend.inventory().gpus[0].uuid
    status = published(backend, NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu0)]))
    claims = Claims(claim("whole", "gpu-0"))
    mps = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu0, strategy=Strategy.MPS, mps=MpsSpec())])

    result = apply_layout(backend, mps, guard=guard_for(claims, mps, status))

    assert not backend.inventory().gpus[0].mps_running
    assert [op.kind for op, _ in result.refusals] == [OpKind.START_MPS]


def test_claims_that_cannot_be_read_stop_the_destroy(backend: DeviceBackend) -> None:
    gpu0 = backend.inventory().gpus[0].uuid
    status = published(backend, NodeLayoutSpec(gpus=[mig(gpu0, ("7g.80gb", 0))]))
    claims = Claims()
    claims.fail = TimeoutError("the apiserver did not answer")
    back = NodeLayoutSpec(gpus=[GpuLayout(uuid=gpu0)])

    result = apply_layout(backend, back, guard=guard_for(claims, back, status))

    assert [(i.profile, i.start) for i in backend.inventory().gpus[0].instances] == [("7g.80gb", 0)]
    (_op, blocker), = result.refusals
    assert blocker.reason is BlockReason.CLAIM_CHECK_FAILED
    assert "the apiserver did not answer" in blocker.message


def test_creating_reads_no_claims_and_claims_elsewhere_do_not_block(backend: DeviceBackend) -> None:
    gpu0, gpu1 = (g.uuid for g in backend.inventory().gpus)
    claims = Claims(claim("on-gpu-1", "gpu-1"), claim("other-node", "gpu-0-mig-7g-80gb-0", node="node-b"))
    want = NodeLayoutSpec(gpus=[mig(gpu0, ("7g.80gb", 0))])
    status = published(backend, NodeLayoutSpec(gpus=[]))
    guard = guard_for(claims, want, status)

    result = apply_layout(backend, want, guard=guard)

    assert result.refusals == []
    assert [op.kind for op in result.executed] == [OpKind.SET_MIG_MODE, OpKind.CREATE_INSTANCE]
    assert claims.reads == 1, "one read, before turning MIG mode on; none for the create"
    assert gpu1 not in {op.gpu_uuid for op in result.executed}
