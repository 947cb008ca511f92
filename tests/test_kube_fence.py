"""The write fence: its deadline on a monotonic clock, and the client's check of it at the wire.

The wire checks use a bare TCP listener that records the bytes it receives (no Kubernetes
semantics are involved: what matters is whether a refused write left the process at all)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tessera.kube.fence import NotLeading, WriteFence
from tessera.kube.http import Credentials, KubeClient
from tessera.kube.lease import LeaseTiming, micro_time, record_of
from tests.fakeclock import FakeClock


def test_a_fence_is_shut_until_opened_and_shuts_by_itself_at_its_deadline() -> None:
    clock = FakeClock(100.0)
    fence = WriteFence(clock)
    with pytest.raises(NotLeading, match="PATCH /x refused"):
        fence.check("PATCH", "/x")
    fence.check("GET", "/x")  # reads are never fenced
    fence.open_until(110.0)
    fence.check("POST", "/x")
    assert fence.remaining() == 10.0
    clock.now = 109.999
    fence.check("DELETE", "/x")
    clock.now = 110.0  # time passed; nobody shut it
    with pytest.raises(NotLeading):
        fence.check("PUT", "/x")
    assert fence.refused == 2
    fence.open_until(200.0)
    fence.shut()
    with pytest.raises(NotLeading):
        fence.check("PATCH", "/x")


def test_lease_timing_refuses_a_renew_deadline_that_leaves_no_margin() -> None:
    LeaseTiming()  # client-go's 15/10/2
    with pytest.raises(ValueError, match=r"renew deadline \(15\) < lease duration \(15\)"):
        LeaseTiming(lease_duration=15, renew_deadline=15, retry_period=2)
    with pytest.raises(ValueError, match="retry period"):
        LeaseTiming(lease_duration=15, renew_deadline=10, retry_period=10)


def test_a_lease_record_changes_with_every_renewal_and_micro_time_is_rfc3339_with_microseconds() -> None:
    from datetime import UTC, datetime

    moment = datetime(2026, 12, 4, 15, 0, 0, 123456, tzinfo=UTC)
    assert micro_time(moment) == "2026-12-04T15:00:00.123456Z"
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": micro_time(moment)}
    lease: dict[str, Any] = {"spec": spec}
    renewed = {"spec": {**lease["spec"], "renewTime": "2026-12-04T15:00:02.000000Z"}}
    assert record_of(lease) != record_of(renewed)
    assert record_of(lease) == record_of({"spec": dict(lease["spec"]), "metadata": {"resourceVersion": "9"}})


async def _sink() -> tuple[asyncio.Server, list[bytes]]:
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(65536)
        received.append(data)
        if data:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0), received


async def test_a_write_refused_at_the_wire_sends_no_byte_however_long_it_waited_before() -> None:
    """The fence shuts between the caller's call and the moment the request would go out (as
    it does for a process frozen in between): nothing of the write reaches the server."""
    server, received = await _sink()
    port = server.sockets[0].getsockname()[1]
    fence = WriteFence()
    sent: list[str] = []
    client = KubeClient(Credentials(server=f"http://127.0.0.1:{port}"), fence=fence,
                        on_write=lambda method, url: sent.append(method))
    try:
        fence.open_until(time.monotonic() + 30)
        assert await client.patch("/apis/x", {"a": 1}) == {}
        assert received[-1].startswith(b"PATCH /apis/x")

        real_send = client._send

        async def frozen_then_woken(*args: Any) -> Any:
            fence.shut()  # the lease ran out while the request waited
            return await real_send(*args)

        client._send = frozen_then_woken  # type: ignore[method-assign,assignment]
        writes: list[Callable[[], Awaitable[Any]]] = [
            lambda: client.patch("/apis/x", {"a": 2}), lambda: client.create("/apis/x", {"b": 1}),
            lambda: client.delete("/apis/x")]
        for write in writes:
            fence.open_until(time.monotonic() + 30)
            count = len(received)
            with pytest.raises(NotLeading):
                await asyncio.wait_for(write(), timeout=10)
            await asyncio.sleep(0.05)
            assert all(data == b"" for data in received[count:]), "no byte of a refused write reached the server"
        assert sent == ["PATCH"]
        client._send = real_send  # type: ignore[method-assign]
        assert await client.get("/apis/x") == {}  # reads go on while the fence is shut
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
