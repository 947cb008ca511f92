"""gRPC on a unix socket for the kubelet plugins (GPU and NIC), served with grpclib.

The kubelet calls a DRA driver in gRPC over two unix sockets: registration and DRA (prepare,
unprepare, the health stream). The messages are protobuf, from the generated ``*_pb2``
modules; a service is described here by its name and its methods, each an async function from
request to reply (``Unary``) or to a stream of replies (``ServerStream``).

Why grpclib (HTTP/2 in Python over h2) and not grpcio: the agent runs on every GPU node, and its
budget is 64 MiB resident (issue 22). grpcio's C core was the largest single part of it: the
agent idled at 64.6 MiB with grpcio, 9.2 MiB of that its mapped library, and idles at 54.8 MiB
with grpclib (``benchmarks/bench_agent_memory.py``, one simulated H100; its 300 prepares ran at
53/s, against 36/s with grpcio). A few calls a Pod over a local socket do not need grpcio's C
core. grpcio stays for clients (the tests, the kubelet stand-in), so every test of these servers
goes through another gRPC implementation than theirs, as the kubelet's grpc-go does.

Kept from grpc.aio's server: ``stop(grace_s)`` refuses new calls (UNAVAILABLE), lets the calls in
flight finish for up to ``grace_s``, then ends what is left with status UNAVAILABLE (grpclib's
own close would cancel them without a word to the client, which would wait on the call). A
handler's ``RpcAbortError`` ends its call with status UNKNOWN and the abort's message, as
grpc-go's registration client expects.
Not for: what the calls do (``tessera.agent.plugin.server``, ``tessera.agent.nics.plugin``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

EXPIRED_ANSWER_S = 1.0  # for the calls cut at the end of a grace to send their answer


class RpcAbortError(Exception):
    """Raised by a handler: the call ends with status UNKNOWN and this message."""


@dataclass(frozen=True)
class Unary:
    func: Callable[[Any], Awaitable[Any]]
    request_type: Any
    reply_type: Any


@dataclass(frozen=True)
class ServerStream:
    func: Callable[[Any], AsyncIterator[Any]]
    request_type: Any
    reply_type: Any


@dataclass(frozen=True)
class Service:
    """``name`` is the proto's ``package.Service``; ``methods`` by their proto names."""

    name: str
    methods: dict[str, Unary | ServerStream]


class _ConnectionsServer(Server):
    """grpclib's Server that knows its connections, to close them when it stops: its own close
    stops listening and leaves them open (grpclib 0.4.9), where a client would keep calling a
    stopped plugin. ``_protocol_factory`` is grpclib's (private, pinned), wrapped, not changed."""

    def __init__(self, handlers: Sequence[Any]) -> None:
        super().__init__(handlers)
        self.transports: set[asyncio.BaseTransport] = set()

    def _protocol_factory(self) -> asyncio.Protocol:  # type: ignore[override]  # asyncio asks only a Protocol
        return _TrackedProtocol(super()._protocol_factory(), self.transports)

    def close_connections(self) -> None:
        for transport in list(self.transports):
            transport.close()


class _TrackedProtocol(asyncio.Protocol):
    """An HTTP/2 protocol whose transport is in ``transports`` while it is connected."""

    def __init__(self, inner: asyncio.Protocol, transports: set[asyncio.BaseTransport]) -> None:
        self._inner = inner
        self._transports = transports
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._transports.add(transport)
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._transports.discard(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def remove_socket(socket: Path) -> None:
    """Make way for a socket: its folder exists, no stale socket file is left in it."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()


class SocketServer:
    """One unix socket serving some services; ``stop`` as grpc.aio's (see the module head)."""

    def __init__(self, services: Sequence[Service]) -> None:
        self._services = list(services)
        self._calls: set[asyncio.Task[Any]] = set()
        self._expired: set[asyncio.Task[Any]] = set()  # cancelled by stop, past its grace
        self._stopping = False
        self._server: _ConnectionsServer | None = None

    def __mapping__(self) -> dict[str, Handler]:  # what grpclib asks a servable for
        mapping: dict[str, Handler] = {}
        for service in self._services:
            for name, method in service.methods.items():
                cardinality = Cardinality.UNARY_UNARY if isinstance(method, Unary) else Cardinality.UNARY_STREAM
                mapping[f"/{service.name}/{name}"] = Handler(
                    self._call(method), cardinality, method.request_type, method.reply_type)
        return mapping

    def _call(self, method: Unary | ServerStream) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
        async def call(stream: Stream[Any, Any]) -> None:
            if self._stopping:
                raise GRPCError(Status.UNAVAILABLE, "the plugin is stopping")
            task = asyncio.current_task()
            assert task is not None  # grpclib runs every call in a task of its own
            self._calls.add(task)  # until the task ends: the reply's trailers are sent after we return
            task.add_done_callback(self._calls.discard)
            try:
                request = await stream.recv_message()
                if isinstance(method, Unary):
                    await stream.send_message(await method.func(request))
                else:
                    async for reply in method.func(request):
                        await stream.send_message(reply)
            except RpcAbortError as abort:
                raise GRPCError(Status.UNKNOWN, str(abort)) from None
            except asyncio.CancelledError:
                if task not in self._expired:
                    raise  # grpclib's: the client went away
                # ours, past the grace: an answer, so that the client does not wait on a dead call
                raise GRPCError(Status.UNAVAILABLE, "the plugin stopped before the call finished") from None

        return call

    async def start(self, socket: Path) -> None:
        """Listen on ``socket`` (a stale socket file from a crash is replaced)."""
        remove_socket(socket)
        self._server = _ConnectionsServer([self])
        await self._server.start(path=str(socket))

    @property
    def calls_in_flight(self) -> int:
        return len(self._calls)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls, give those in flight ``grace_s`` seconds, then end the rest."""
        self._stopping = True
        if self._calls:
            await asyncio.wait(set(self._calls), timeout=grace_s)
        self._expired = set(self._calls)
        for task in self._expired:
            task.cancel()  # each answers UNAVAILABLE (grpclib's own cancel would answer nothing)
        if self._expired:
            await asyncio.wait(self._expired, timeout=EXPIRED_ANSWER_S)
        if self._server is not None:
            self._server.close()  # stops listening
            self._server.close_connections()
            await self._server.wait_closed()
            self._server = None


async def serve_on_socket(socket: Path, services: Sequence[Service]) -> SocketServer:
    """A started ``SocketServer`` on ``socket``."""
    server = SocketServer(services)
    await server.start(socket)
    return server
