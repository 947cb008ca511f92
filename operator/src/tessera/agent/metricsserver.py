"""The node agent's HTTP endpoints (``/metrics``, ``/healthz``): a few fixed routes on asyncio streams.

Each route is a function that returns (status, content type, body). The server answers GET and
HEAD, one request per connection (``Connection: close``), which is all a Prometheus scrape or a
kubelet probe asks for; a route that raises answers 500; a client that sends no complete request head within
``REQUEST_TIMEOUT_SECONDS`` or ``MAX_HEAD_BYTES`` is dropped. It exists so that the agent on every
GPU node does not load aiohttp's web server (about 2 MiB resident) for two routes.
Not for: request bodies, keep-alive, TLS, or an API of any size.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from http import HTTPStatus

import structlog

Route = Callable[[], tuple[int, str, bytes]]  # () -> (status, content type, body)

REQUEST_TIMEOUT_SECONDS = 10.0
MAX_HEAD_BYTES = 16 * 1024
TEXT = "text/plain; charset=utf-8"
log = structlog.get_logger("tessera.agent")


class MetricsServer:
    """Serves ``routes`` (path -> route) on ``host:port`` between ``start()`` and ``close()``."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self.routes = dict(routes)
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def answer(self, head: bytes) -> tuple[int, str, bytes, bool]:
        """(status, content type, body, whether to send the body) for one request head."""
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(request_line) != 3 or not request_line[2].startswith("HTTP/"):
            return HTTPStatus.BAD_REQUEST, TEXT, b"bad request\n", True
        method, target, _ = request_line
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, TEXT, b"only GET and HEAD\n", True
        route = self.routes.get(target.split("?", 1)[0])
        if route is None:
            return HTTPStatus.NOT_FOUND, TEXT, f"not found; try {', '.join(sorted(self.routes))}\n".encode(), True
        status, content_type, body = route()
        return status, content_type, body, method == "GET"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return  # a client that never finished its request, or sent a head too large
            try:
                status, content_type, body, send_body = self.answer(head)
            except Exception as e:  # a failing route answers 500; the server carries on
                log.error("an HTTP route failed", error=repr(e))
                status, content_type, body, send_body = HTTPStatus.INTERNAL_SERVER_ERROR, TEXT, b"route failed\n", True
            writer.write(
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
            )
            if send_body:
                writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass  # the client went away; nothing to tell it
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
