"""The plugins' gRPC serving (``tessera.agent.plugin.rpc``, grpclib) called by another gRPC
implementation (grpcio's client, through the stubs generated from our .proto files), as the
kubelet's grpc-go calls it: replies, streams, aborts, and a stop that keeps grpc.aio's promise
(new calls refused, calls in flight finished within the grace, the rest cancelled), under
random timing."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2 as health_pb
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from tessera.agent.plugin.proto import pluginregistration_v1_pb2 as pb
from tessera.agent.plugin.proto import pluginregistration_v1_pb2_grpc as pb_grpc
from tessera.agent.plugin.rpc import RpcAbortError, ServerStream, Service, SocketServer, Unary, serve_on_socket
from tessera.agent.plugin.server import REGISTRATION_SERVICE
from tests.plugin_helpers import short_tmp_dir


@pytest.fixture
def socket() -> Iterator[Path]:
    for root in short_tmp_dir():
        yield root / "rpc" / "test.sock"


def registration(get_info: Unary) -> Service:
    return Service(REGISTRATION_SERVICE, {"GetInfo": get_info})


def channel(socket: Path) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix://{socket}")


async def test_a_unary_call_gets_its_reply_and_an_abort_its_message(socket: Path) -> None:
    async def get_info(request: pb.InfoRequest) -> pb.PluginInfo:
        return pb.PluginInfo(type="DRAPlugin", name="gpu.tessera.dev", supported_versions=["v1.DRAPlugin"])

    async def notify(request: pb.RegistrationStatus) -> pb.RegistrationStatusResponse:
        raise RpcAbortError(f"failed registration process: {request.error}")

    service = Service(REGISTRATION_SERVICE, {
        "GetInfo": Unary(get_info, pb.InfoRequest, pb.PluginInfo),
        "NotifyRegistrationStatus": Unary(notify, pb.RegistrationStatus, pb.RegistrationStatusResponse),
    })
    server = await serve_on_socket(socket, [service])
    try:
        async with channel(socket) as ch:
            stub = pb_grpc.RegistrationStub(ch)  # type: ignore[no-untyped-call]  # generated
            info = await stub.GetInfo(pb.InfoRequest())
            assert (info.type, info.name, list(info.supported_versions)) == (
                "DRAPlugin", "gpu.tessera.dev", ["v1.DRAPlugin"])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.NotifyRegistrationStatus(pb.RegistrationStatus(plugin_registered=False, error="no"))
            assert refused.value.code() == grpc.StatusCode.UNKNOWN
            assert refused.value.details() == "failed registration process: no"
            await server.stop(1)
            with pytest.raises(grpc.aio.AioRpcError) as stopped:  # its connection is closed too
                await stub.GetInfo(pb.InfoRequest(), timeout=5)
            assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(1)


async def test_a_stream_sends_every_reply_in_order(socket: Path) -> None:
    async def watch(request: health_pb.NodeWatchResourcesRequest) -> AsyncIterator[
            health_pb.NodeWatchResourcesResponse]:
        for i in range(5):
            response = health_pb.NodeWatchResourcesResponse()
            response.devices.add(device=health_pb.DeviceIdentifier(pool_name="n", device_name=f"gpu-{i}"))
            yield response

    service = Service("v1alpha1.DRAResourceHealth", {"NodeWatchResources": ServerStream(
        watch, health_pb.NodeWatchResourcesRequest, health_pb.NodeWatchResourcesResponse)})
    server = await serve_on_socket(socket, [service])
    try:
        async with channel(socket) as ch:
            stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(health_pb.NodeWatchResourcesRequest())
            names = [message.devices[0].device.device_name async for message in stream]
        assert names == [f"gpu-{i}" for i in range(5)]
    finally:
        await server.stop(1)


async def test_a_method_it_does_not_serve_is_unimplemented(socket: Path) -> None:
    async def get_info(request: pb.InfoRequest) -> pb.PluginInfo:
        return pb.PluginInfo()

    server = await serve_on_socket(socket, [registration(Unary(get_info, pb.InfoRequest, pb.PluginInfo))])
    try:
        async with channel(socket) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await pb_grpc.RegistrationStub(ch).NotifyRegistrationStatus(pb.RegistrationStatus())
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(1)


@pytest.mark.parametrize("seed", range(6))
async def test_stop_finishes_the_calls_within_its_grace_refuses_new_ones_and_cancels_the_rest(
        socket: Path, seed: int) -> None:
    """Calls of random length run while ``stop(grace)`` begins at a random moment: a call that
    ends within the grace gets its own reply, one that does not is cancelled in the server and
    answered UNAVAILABLE (not left waiting), a call made after the stop began is refused; none
    is answered wrongly, and nothing runs on once ``stop`` returns."""
    rng = random.Random(seed)
    grace = rng.uniform(0.15, 0.4)
    durations = {f"c{i}": rng.uniform(0.0, 0.7) for i in range(8)}
    finished: set[str] = set()
    cancelled: set[str] = set()

    async def get_info(request: pb.InfoRequest) -> pb.PluginInfo:
        name = names[len(entered)]  # an InfoRequest carries nothing: the calls come in one by one
        entered.append(name)
        came_in.set()
        try:
            await asyncio.sleep(durations[name])
        except asyncio.CancelledError:
            cancelled.add(name)
            raise
        finished.add(name)
        return pb.PluginInfo(name=name)

    names: list[str] = sorted(durations)
    entered: list[str] = []
    came_in = asyncio.Event()
    server: SocketServer = await serve_on_socket(socket, [registration(Unary(get_info, pb.InfoRequest, pb.PluginInfo))])
    async with channel(socket) as ch:
        stub = pb_grpc.RegistrationStub(ch)  # type: ignore[no-untyped-call]  # generated
        await ch.channel_ready()
        calls = []
        for _ in names:
            came_in.clear()
            calls.append(asyncio.ensure_future(stub.GetInfo(pb.InfoRequest())))
            await asyncio.wait_for(came_in.wait(), 10)
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        stopping = asyncio.ensure_future(server.stop(grace))
        await asyncio.sleep(0.01)
        late = None
        if not stopping.done():
            with pytest.raises(grpc.aio.AioRpcError) as late_error:
                await stub.GetInfo(pb.InfoRequest())
            late = late_error.value.code()
        await stopping
        assert server.calls_in_flight == 0
        outcomes = await asyncio.gather(*calls, return_exceptions=True)

    if late is not None:
        assert late == grpc.StatusCode.UNAVAILABLE
    assert finished | cancelled == set(durations)
    assert not finished & cancelled
    for name, outcome in zip(names, outcomes, strict=True):
        if name in finished:
            assert isinstance(outcome, pb.PluginInfo), (name, outcome)
            assert outcome.name == name
        else:
            assert isinstance(outcome, grpc.aio.AioRpcError), (name, outcome)
            assert outcome.code() == grpc.StatusCode.UNAVAILABLE
            assert outcome.details() == "the plugin stopped before the call finished"
