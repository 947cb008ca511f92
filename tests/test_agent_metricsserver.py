"""The agent's /metrics and /healthz server, over a real socket: each route's status, type and
body; HEAD without a body; 404, 405 and 400 for what it does not serve, 500 for a route that
fails; a client that never finishes its request is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tessera.agent import metricsserver
from tessera.agent.metricsserver import TEXT, MetricsServer


@pytest.fixture
async def port() -> AsyncIterator[int]:
    server = MetricsServer({
        "/healthz": lambda: (200, TEXT, b"ok\n"),
        "/metrics": lambda: (200, "text/plain; version=0.0.4", b"a_metric 1.0\n"),
        "/broken": lambda: (200, TEXT, str(1 / 0).encode()),
    })
    bound = await server.start("127.0.0.1", 0)
    try:
        yield bound
    finally:
        await server.close()


async def exchange(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``request`` raw; the status line, headers and body of the answer (read to EOF)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


async def test_get_answers_each_route_with_its_status_type_and_body(port: int) -> None:
    status, headers, body = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-type"] == "text/plain; version=0.0.4"
    assert headers["content-length"] == str(len(body))
    assert headers["connection"] == "close"
    assert body == b"a_metric 1.0\n"
    status, _, body = await exchange(port, b"GET /healthz?verbose=1 HTTP/1.1\r\n\r\n")
    assert (status, body) == ("HTTP/1.1 200 OK", b"ok\n")


async def test_head_sends_the_headers_of_get_without_the_body(port: int) -> None:
    status, headers, body = await exchange(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert status == "HTTP/1.1 200 OK"
    assert headers["content-length"] == str(len(b"a_metric 1.0\n"))
    assert body == b""


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"GET /nothing HTTP/1.1", "HTTP/1.1 404 Not Found"),
        (b"POST /metrics HTTP/1.1", "HTTP/1.1 405 Method Not Allowed"),
        (b"nonsense", "HTTP/1.1 400 Bad Request"),
        (b"GET /broken HTTP/1.1", "HTTP/1.1 500 Internal Server Error"),
    ],
)
async def test_what_it_does_not_serve_gets_an_error_status(port: int, request_line: bytes, status: str) -> None:
    answer, _, _ = await exchange(port, request_line + b"\r\n\r\n")
    assert answer == status


async def test_a_client_that_never_finishes_its_request_is_dropped(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metricsserver, "REQUEST_TIMEOUT_SECONDS", 0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\n")  # no blank line: the head never ends
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    writer.close()
    await writer.wait_closed()
