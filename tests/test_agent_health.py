"""GPU health as the agent tracks it: events mark a GPU, the probe clears it again (after a reset,
once a lost GPU answers, or after the quiet period), a restart does not wash it away, and the
kubelet's health stream (NodeWatchResources, through a real gRPC client on the plugin's unix
socket) sends every device on connect, on every change and as a refresh."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from tessera.agent.backends.base import HealthEvent, HealthEventKind
from tessera.agent.backends.simulated import SimulatedBackend
from tessera.agent.health import HealthTracker
from tessera.agent.plugin import KubeletPlugin, PluginConfig
from tessera.agent.plugin.health import MAX_MESSAGE, health_response
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2 as pb
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2_grpc as pb_grpc
from tessera.agent.reconciler import apply_layout
from tessera.agent.status import build_status
from tessera.models.layout import GpuLayout, Health, NodeLayoutSpec, NodeLayoutStatus, PlacedInstance
from tessera.models.policy import Strategy
from tests.fakeclock import FakeClock
from tests.plugin_helpers import FakeClaimReader, PluginDirs, short_tmp_dir

NODE = "gpu-node-1"


def sim() -> SimulatedBackend:
    return SimulatedBackend.from_spec(NODE, "2xH100-80GB")


def events(backend: SimulatedBackend) -> list[HealthEvent]:
    return backend.wait_health_events(0.2)


def health_of(tracker: HealthTracker, backend: SimulatedBackend) -> list[Health]:
    return [g.health for g in tracker.observe(backend.inventory()).gpus]


def status_of(backend: SimulatedBackend, tracker: HealthTracker, spec: NodeLayoutSpec) -> NodeLayoutStatus:
    result = apply_layout(backend, spec)
    inventory = tracker.observe(result.inventory)
    return build_status(inventory, spec, result.plans, backend="simulated", agent_version="t", observed_generation=1)


# -- the tracker -----------------------------------------------------------------------------


def test_a_fatal_xid_marks_the_gpu_until_it_is_reset_and_an_application_xid_never() -> None:
    backend, tracker = sim(), HealthTracker(recovery_seconds=0)
    backend.hardware.inject_xid(0, 13)
    assert tracker.record_events(events(backend)) is False
    assert health_of(tracker, backend) == [Health.HEALTHY, Health.HEALTHY]

    backend.hardware.inject_xid(0, 79)
    assert tracker.record_events(events(backend)) is True
    assert health_of(tracker, backend) == [Health.UNHEALTHY, Health.HEALTHY]
    assert health_of(tracker, backend) == [Health.UNHEALTHY, Health.HEALTHY], "no quiet period: it stays"
    message = tracker.observe(backend.inventory()).gpus[0].health_message
    assert "XID 79" in message
    assert "reset" in message

    backend.hardware.reset_gpu(0)
    tracker.record_events(events(backend))
    assert health_of(tracker, backend) == [Health.HEALTHY, Health.HEALTHY]
    assert tracker.recoveries == 1


def test_an_unhealthy_gpu_clears_after_the_quiet_period_and_a_new_error_restarts_it() -> None:
    clock = FakeClock(1_000_000.0)
    backend, tracker = sim(), HealthTracker(recovery_seconds=300, clock=clock)
    backend.hardware.inject_ecc_error(1)
    tracker.record_events(events(backend))
    clock.now += 200
    assert health_of(tracker, backend)[1] is Health.UNHEALTHY
    backend.hardware.inject_xid(1, 48)  # fatal again, same message: the quiet period starts over
    tracker.record_events(events(backend))
    clock.now += 200
    assert health_of(tracker, backend)[1] is Health.UNHEALTHY
    clock.now += 101
    assert health_of(tracker, backend)[1] is Health.HEALTHY


def test_a_lost_gpu_is_healthy_again_as_soon_as_it_answers() -> None:
    backend, tracker = sim(), HealthTracker(recovery_seconds=0)
    backend.hardware.lose_gpu(0)
    tracker.record_events(events(backend))
    assert health_of(tracker, backend)[0] is Health.LOST
    backend.hardware.inject_xid(0, 79)  # an XID on a lost GPU keeps it lost
    tracker.record_events(events(backend))
    assert health_of(tracker, backend)[0] is Health.LOST
    backend.hardware.reset_gpu(0)
    events(backend)  # even without hearing the reset: the probe answers
    assert health_of(tracker, backend)[0] is Health.HEALTHY


def test_a_restarted_agent_starts_from_the_health_it_reported() -> None:
    backend, first = sim(), HealthTracker(recovery_seconds=0)
    backend.hardware.inject_xid(1, 79)
    first.record_events(events(backend))
    reported = status_of(backend, first, NodeLayoutSpec())
    assert [g.health for g in reported.gpus] == [Health.HEALTHY, Health.UNHEALTHY]

    restarted = HealthTracker(recovery_seconds=0)
    restarted.seed(reported)
    assert health_of(restarted, backend) == [Health.HEALTHY, Health.UNHEALTHY]
    backend.hardware.reset_gpu(1)
    restarted.record_events(events(backend))
    assert health_of(restarted, backend) == [Health.HEALTHY, Health.HEALTHY]


def test_health_events_reach_the_stream_before_the_next_pass() -> None:
    backend, tracker = sim(), HealthTracker(recovery_seconds=0)
    tracker.publish(status_of(backend, tracker, NodeLayoutSpec()))
    uuid = backend.inventory().gpus[0].uuid
    tracker.record_events([HealthEvent(uuid, HealthEventKind.XID, 79, message="XID 79")])
    assert [g.health for g in tracker.snapshot()] == [Health.UNHEALTHY, Health.HEALTHY]


# -- the message -----------------------------------------------------------------------------


def test_every_published_device_of_a_gpu_carries_its_gpus_health() -> None:
    backend, tracker = sim(), HealthTracker(recovery_seconds=0)
    gpu0, gpu1 = (g.uuid for g in backend.inventory().gpus)
    spec = NodeLayoutSpec(gpus=[
        GpuLayout(uuid=gpu0, strategy=Strategy.MIG, mig_instances=[
            PlacedInstance(profile="3g.40gb", start=0), PlacedInstance(profile="3g.40gb", start=4)]),
        GpuLayout(uuid=gpu1, strategy=Strategy.DYNAMIC_MIG),
    ])
    backend.hardware.inject_xid(1, 79)
    tracker.record_events(events(backend))
    tracker.publish(status_of(backend, tracker, spec))

    response = health_response(tracker.device_health(), NODE, now=1234, timeout_s=30)

    by_name = {d.device.device_name: d for d in response.devices}
    assert {d.device.pool_name for d in response.devices} == {NODE}
    assert {n for n in by_name if n.startswith("gpu-0")} == {"gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-4"}
    dynamic = [n for n in by_name if n.startswith("gpu-1-dyn-")]
    assert len(dynamic) == 25, "every DynamicMIG placement published for GPU 1"
    assert {by_name[n].health for n in by_name if n.startswith("gpu-0")} == {pb.HEALTHY}
    assert {by_name[n].health for n in dynamic} == {pb.UNHEALTHY}
    assert "XID 79" in by_name[dynamic[0]].message
    assert {(d.last_updated_time, d.health_check_timeout_seconds) for d in response.devices} == {(1234, 30)}


def test_a_long_message_is_cut_to_what_the_kubelet_keeps() -> None:
    backend, tracker = sim(), HealthTracker(recovery_seconds=0)
    tracker.publish(status_of(backend, tracker, NodeLayoutSpec()))
    uuid = backend.inventory().gpus[0].uuid
    tracker.record_events([HealthEvent(uuid, HealthEventKind.XID, 79, message="x" * 5000)])
    (device, _) = health_response(tracker.device_health(), NODE, now=1, timeout_s=30).devices
    assert len(device.message) == MAX_MESSAGE
    assert device.message.endswith("...")


# -- the stream, through a real gRPC client on the unix socket -------------------------------


@pytest.fixture
def dirs() -> Iterator[PluginDirs]:
    for root in short_tmp_dir():
        yield PluginDirs(root)


async def next_message(stream: object, timeout: float = 5.0) -> pb.NodeWatchResourcesResponse:
    message: pb.NodeWatchResourcesResponse = await asyncio.wait_for(stream.read(), timeout)  # type: ignore[attr-defined]
    assert message is not grpc.aio.EOF
    return message


def health_by_device(message: pb.NodeWatchResourcesResponse) -> dict[str, int]:
    return {d.device.device_name: d.health for d in message.devices}


async def test_the_kubelets_stream_sends_every_device_on_connect_on_change_and_as_a_refresh(dirs: PluginDirs) -> None:
    backend, tracker = sim(), HealthTracker(recovery_seconds=0)
    tracker.publish(status_of(backend, tracker, NodeLayoutSpec()))
    config = PluginConfig(node_name=NODE, registry_dir=dirs.registry, plugin_dir=dirs.plugin, cdi_dir=dirs.cdi,
                          proc_root=dirs.proc, health_refresh_s=1.5, stop_grace_s=30)
    async with KubeletPlugin(config, backend, FakeClaimReader(), health=tracker) as plugin, \
            grpc.aio.insecure_channel(f"unix://{plugin.config.dra_socket}") as channel:
        stub = pb_grpc.DRAResourceHealthStub(channel)
        stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest())

        first = await next_message(stream)
        assert health_by_device(first) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.HEALTHY}

        # Unhealthy: heard at once, before any reconcile pass.
        backend.hardware.inject_xid(1, 79)
        tracker.record_events(events(backend))
        changed = await next_message(stream, timeout=1.0)
        assert health_by_device(changed) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.UNHEALTHY}

        # Nothing changes: the same news again within the refresh period.
        again = await next_message(stream, timeout=3.0)
        assert health_by_device(again) == health_by_device(changed)

        # Healthy again: a reset, then the agent's pass (probe + publish).
        backend.hardware.reset_gpu(1)
        tracker.record_events(events(backend))
        tracker.publish(status_of(backend, tracker, NodeLayoutSpec()))
        for _ in range(4):
            recovered = await next_message(stream, timeout=3.0)
            if health_by_device(recovered)["gpu-1"] == pb.HEALTHY:
                break
        assert health_by_device(recovered) == {"gpu-0": pb.HEALTHY, "gpu-1": pb.HEALTHY}
        stopping_at = asyncio.get_running_loop().time()
    # The open stream ends when the plugin stops; it does not hold the stop for its 30 s grace.
    assert asyncio.get_running_loop().time() - stopping_at < 10
