"""A watch whose connection goes silent — no FIN, no RST, no bytes: a half-open TCP connection,
as when a NAT or a node between loses its state — is reopened within its idle bound, and a quiet
but healthy watch is not (the real apiserver's bookmarks keep it talking). A TCP relay in front
of the real kube-apiserver plays the silent network: told to, it stops passing bytes on the
connections it holds, without closing them, while new connections go through. (The idle bound's
logic on a scripted API is in tests/test_kube_watch.py.)
The silent watch gets a short bound (``SHORT_IDLE_S``): what is tested there is the half-open
connection noticed and reopened, whatever the bound. The quiet watch keeps the real one
(``WATCH_IDLE_TIMEOUT_S``) and waits for the apiserver's first bookmark, which must come well
inside it: that is what keeps a healthy watch from being reopened. Both run side by side, about
a minute (the apiserver's bookmark period)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tessera.kube.http import KubeClient, load_kubeconfig, resource_path
from tessera.kube.watch import WATCH_IDLE_TIMEOUT_S, ListWatch
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for

pytestmark = pytest.mark.integration

SHORT_IDLE_S = 15.0  # the silent watch's bound: the mechanism, without waiting out the real 90 s
BOOKMARK_MARGIN_S = 15.0  # how far inside the real bound the apiserver's first bookmark must come


class SilentRelay:
    """127.0.0.1:<port> relayed to ``target``; ``go_silent`` mutes every connection open now."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connections = 0
        self._muted: list[asyncio.Event] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def go_silent(self) -> None:
        for muted in self._muted:
            muted.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:  # the half-open ones too, at last
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _accept(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_in, server_out = await asyncio.open_connection(self.host, self.port)
        self._writers += [client_out, server_out]
        muted = asyncio.Event()
        self._muted.append(muted)
        for reader, writer in ((client_in, server_out), (server_in, client_out)):
            task = asyncio.create_task(self._pipe(reader, writer, muted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, muted: asyncio.Event) -> None:
        try:
            while data := await reader.read(65536):
                if not muted.is_set():  # muted: read and dropped, so neither end hears a thing
                    writer.write(data)
                    await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if not muted.is_set():  # a muted connection is never closed: it is half-open
                writer.close()


@pytest.fixture
async def direct(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(load_kubeconfig(cluster.kubeconfig)) as client:
        yield client


@contextlib.asynccontextmanager
async def relayed(cluster: LocalCluster) -> AsyncIterator[tuple[KubeClient, SilentRelay]]:
    """A client whose every connection goes through a relay of its own."""
    credentials = load_kubeconfig(cluster.kubeconfig)
    server = urlsplit(credentials.server)
    relay = SilentRelay(server.hostname or "127.0.0.1", server.port or 443)
    port = await relay.start()
    through = dataclasses.replace(credentials, server=f"https://127.0.0.1:{port}")
    try:
        async with KubeClient(through) as client:
            yield client, relay
    finally:
        await relay.close()


async def watched_namespace(direct: KubeClient) -> str:
    namespace = f"ws-{uuid.uuid4().hex[:8]}"
    await direct.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    return namespace


def configmap(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"v": "0"}}


async def test_a_silent_watch_is_reopened_within_its_idle_bound_and_a_quiet_healthy_one_is_not(
        cluster: LocalCluster, direct: KubeClient) -> None:
    """Side by side, each through its own relay."""
    async with relayed(cluster) as silent, relayed(cluster) as quiet:
        await asyncio.gather(a_silent_watch_is_reopened(direct, *silent),
                             a_quiet_healthy_watch_is_not_reopened(direct, *quiet))


async def a_silent_watch_is_reopened(direct: KubeClient, client: KubeClient, relay: SilentRelay) -> None:
    namespace = await watched_namespace(direct)
    configmaps = resource_path("", "v1", "configmaps", namespace=namespace)
    seen: list[str] = []
    watch = ListWatch(client, "", "v1", "configmaps", lambda kind, body: seen.append(body["metadata"]["name"]),
                      field_selector=f"metadata.namespace={namespace}", idle_timeout=SHORT_IDLE_S)
    watch.start()
    try:
        await asyncio.wait_for(watch.listed.wait(), 30)
        await direct.create(configmaps, configmap("before"))
        await wait_for(lambda: "before" in seen, timeout=30, message="a change through the open relay")

        relay.go_silent()
        silent_at = time.monotonic()
        opened = relay.connections
        await direct.create(configmaps, configmap("during"))
        await wait_for(lambda: "during" in seen, timeout=SHORT_IDLE_S + 30,
                       message="the change made while the connection was silent")
        waited = time.monotonic() - silent_at

        assert watch.silences == 1, "the watch was reopened because it heard nothing"
        assert relay.connections > opened, "over a new connection"
        assert SHORT_IDLE_S - 5 <= waited <= SHORT_IDLE_S + 15, (
            f"the change arrived {waited:.0f} s after the connection fell silent: the bound is "
            f"{SHORT_IDLE_S:g} s (a client without it waits for its 330 s read timeout)")
        assert watch.lists == 1, "reopened from the last version heard, not listed again"
    finally:
        await watch.stop()
        with contextlib.suppress(Exception):
            await direct.delete(f"/api/v1/namespaces/{namespace}")


async def a_quiet_healthy_watch_is_not_reopened(direct: KubeClient, client: KubeClient, relay: SilentRelay) -> None:
    namespace = await watched_namespace(direct)
    watch = ListWatch(client, "", "v1", "configmaps", lambda kind, body: None,
                      field_selector=f"metadata.namespace={namespace}")
    assert watch.idle_timeout == WATCH_IDLE_TIMEOUT_S
    watch.start()
    try:
        await asyncio.wait_for(watch.listed.wait(), 30)
        opened, watching_since = relay.connections, asyncio.get_running_loop().time()
        # Nothing changes in the namespace meanwhile: what the watch hears is a bookmark.
        await wait_for(lambda: watch.bookmarks > 0, timeout=WATCH_IDLE_TIMEOUT_S + 10,
                       message="the apiserver's first bookmark on a quiet watch")
        assert watch.heard_at is not None
        quiet_for = watch.heard_at - watching_since
        assert quiet_for <= WATCH_IDLE_TIMEOUT_S - BOOKMARK_MARGIN_S, (
            f"the first bookmark came {quiet_for:.0f} s after the watch opened: too close to the "
            f"{WATCH_IDLE_TIMEOUT_S:g} s bound for a healthy quiet watch to be safe from it")
        assert watch.silences == 0, "a healthy watch with nothing to say was not reopened"
        assert relay.connections == opened, "and kept its one connection"
    finally:
        await watch.stop()
        with contextlib.suppress(Exception):
            await direct.delete(f"/api/v1/namespaces/{namespace}")
