"""The operator's list-then-watch loop (``tessera.kube.watch.ListWatch``) against the real
kube-apiserver: the first list in pages, then every create, change and delete exactly once and
in order, across watches the server ends every second. (410 Gone and error backoff, which the
real apiserver does not produce on demand, are in tests/test_kube_watch.py.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tessera.kube.http import KubeClient, load_kubeconfig, resource_path
from tessera.kube.watch import ListWatch
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(load_kubeconfig(cluster.kubeconfig)) as client:
        yield client


async def test_every_change_arrives_once_and_in_order_across_watches_the_server_ends(api: KubeClient) -> None:
    namespace, mark = f"lw-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    await api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    configmaps = resource_path("", "v1", "configmaps", namespace=namespace)

    def configmap(name: str, value: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"lw": mark}}, "data": {"v": value}}

    for name in ("a", "b", "c"):
        await api.create(configmaps, configmap(name, "0"))
    seen: list[tuple[str, str, str]] = []

    def on_event(kind: str, body: dict[str, Any]) -> None:
        seen.append((kind, body["metadata"]["name"], (body.get("data") or {}).get("v", "")))

    watch = ListWatch(api, "", "v1", "configmaps", on_event, label_selector=f"lw={mark}", timeout_seconds=1,
                      page_size=2)
    watch.start()
    try:
        await asyncio.wait_for(watch.listed.wait(), 30)
        assert sorted(seen) == [("ADDED", n, "0") for n in ("a", "b", "c")], "the first list, over two pages"
        # Changes spread over several one-second watches, some made while no watch is open.
        await api.patch(f"{configmaps}/a", {"data": {"v": "1"}})
        await asyncio.sleep(1.5)
        await api.delete(f"{configmaps}/b")
        await api.create(configmaps, configmap("d", "0"))
        await asyncio.sleep(1.2)
        await api.patch(f"{configmaps}/a", {"data": {"v": "2"}})
        await api.patch(f"{configmaps}/d", {"data": {"v": "1"}})
        await wait_for(lambda: len(seen) >= 8, timeout=30, message="the five changes")
        await asyncio.sleep(2.5)  # two more server-ended watches: nothing may be passed on twice
    finally:
        await watch.stop()
        await api.delete(f"/api/v1/namespaces/{namespace}")

    assert seen[3:] == [
        ("MODIFIED", "a", "1"),
        ("DELETED", "b", "0"),
        ("ADDED", "d", "0"),
        ("MODIFIED", "a", "2"),
        ("MODIFIED", "d", "1"),
    ]
    assert watch.lists == 1, "a watch the server ends is resumed, not replaced by a new list"
    assert set(watch.known) == {f"{namespace}/a", f"{namespace}/c", f"{namespace}/d"}
