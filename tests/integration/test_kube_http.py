"""``tessera.kube.http.KubeClient`` against the real kube-apiserver of the local control plane,
over its TLS with the credentials it issues (the kubeconfig's bearer token; a service account's
token, in-cluster style): reads, paged and filtered lists, every write verb and patch type, the
status subresource, the apiserver's own errors, and watches (order, resume, bookmarks, 410 Gone).

The local control plane issues no client certificates (its CA key is not kept), so certificate
authentication is not exercised here; the kubeconfig parsing of certificates is a unit test."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tessera.kube import http as kube_http
from tessera.kube.http import ApiError, Credentials, KubeClient, load_kubeconfig, resource_path
from tessera.localcluster import LocalCluster
from tessera.localcluster.cluster import wait_for

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "crds" / "tessera.dev_nodelayouts.yaml"
LAYOUTS = resource_path("tessera.dev", "v1alpha1", "nodelayouts")
LABEL = "tessera.dev/test"


@pytest.fixture
async def api(cluster: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(load_kubeconfig(cluster.kubeconfig)) as client:
        yield client


@pytest.fixture
async def namespace(api: KubeClient) -> AsyncIterator[str]:
    """A fresh namespace (no waiting for its ServiceAccount: nothing here runs Pods)."""
    name = f"kh-{uuid.uuid4().hex[:8]}"
    await api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    await api.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
async def layouts(cluster: LocalCluster, api: KubeClient) -> AsyncIterator[str]:
    """The NodeLayout CRD installed and served; yields a label value that marks this test's
    NodeLayouts (cluster-scoped, so they are deleted by label at the end)."""
    cluster.apply(CRD)

    async def served() -> bool:
        try:
            await api.list_page(LAYOUTS, limit=1)
        except ApiError as error:  # 404 until the CRD is served, 429 while its cache fills
            if error.status in (404, 429):
                return False
            raise
        return True

    await wait_for(served, timeout=30, message="the NodeLayout CRD served")
    mark = uuid.uuid4().hex[:8]
    yield mark
    for item in await api.list(LAYOUTS, label_selector=f"{LABEL}={mark}"):
        await api.delete(f"{LAYOUTS}/{item['metadata']['name']}")


def configmaps(namespace: str, name: str | None = None) -> str:
    return resource_path("", "v1", "configmaps", name, namespace=namespace)


def configmap(name: str, mark: str = "x", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {LABEL: mark}},
            "data": data}


def raw_events(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every watch event as the apiserver sent it, before the client chose what to pass on."""
    seen: list[dict[str, Any]] = []
    original = kube_http._json_lines

    async def recording(stream: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
        async for event in original(stream):
            seen.append(event)
            yield event

    monkeypatch.setattr(kube_http, "_json_lines", recording)
    return seen


def sent_params(monkeypatch: pytest.MonkeyPatch, client: KubeClient) -> list[dict[str, Any]]:
    """The query parameters of every request the client sends."""
    sent: list[dict[str, Any]] = []
    original = client._send

    async def recording(method: str, path: str, params: Any, *rest: Any) -> aiohttp.ClientResponse:
        sent.append(dict(params or {}))
        return await original(method, path, params, *rest)

    monkeypatch.setattr(client, "_send", recording)
    return sent


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in items)


# -- reads -----------------------------------------------------------------------------------

async def test_a_kubeconfig_client_reads_over_the_apiservers_tls_with_its_token(
    cluster: LocalCluster, api: KubeClient
) -> None:
    credentials = load_kubeconfig(cluster.kubeconfig)
    assert credentials.server.startswith("https://")
    assert credentials.ca_file
    assert credentials.token
    namespace = await api.get("/api/v1/namespaces/default")
    assert namespace["metadata"]["name"] == "default"

    async with KubeClient(Credentials(server=credentials.server, ca_file=credentials.ca_file,
                                      token="not-a-token")) as stranger:
        with pytest.raises(ApiError) as raised:
            await stranger.get("/api/v1/namespaces/default")
    assert (raised.value.status, raised.value.reason) == (401, "Unauthorized")

    async with KubeClient(Credentials(server=credentials.server, token=credentials.token)) as untrusting:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the system CAs know not ours
            await untrusting.get("/api/v1/namespaces/default")


async def test_list_filters_by_label_and_field_and_follows_continue_across_pages(
    api: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(7):
        await api.create(configmaps(namespace), configmap(f"cm-{i}", "even" if i % 2 == 0 else "odd"))
    every = [f"cm-{i}" for i in range(7)]

    first = await api.list_page(configmaps(namespace), label_selector=LABEL, limit=2)
    assert len(first["items"]) == 2
    assert first["metadata"]["continue"], "the apiserver pages a list with a limit"

    sent = sent_params(monkeypatch, api)
    assert names(await api.list(configmaps(namespace), label_selector=LABEL, page_size=2)) == every
    assert len(sent) == 4, "7 objects in pages of 2"
    assert [bool(p.get("continue")) for p in sent] == [False, True, True, True]

    assert names(await api.list(configmaps(namespace), label_selector=f"{LABEL}=even", page_size=3)) == [
        "cm-0", "cm-2", "cm-4", "cm-6"]
    assert names(await api.list(configmaps(namespace), field_selector="metadata.name=cm-5")) == ["cm-5"]
    assert names(await api.list(configmaps(namespace), label_selector=f"{LABEL}=odd",
                                field_selector="metadata.name!=cm-3")) == ["cm-1", "cm-5"]

    with pytest.raises(ApiError) as raised:
        await api.list(configmaps(namespace), field_selector="data.i=1")
    assert (raised.value.status, raised.value.reason) == (400, "BadRequest")
    assert "is not a known field selector" in raised.value.message


# -- writes ----------------------------------------------------------------------------------

async def test_replace_with_a_stale_resource_version_is_a_conflict(api: KubeClient, namespace: str) -> None:
    created = await api.create(configmaps(namespace), configmap("cm", a="1"))
    stale = created["metadata"]["resourceVersion"]
    replaced = await api.replace(configmaps(namespace, "cm"), {**created, "data": {"a": "2"}})
    assert replaced["data"] == {"a": "2"}
    assert replaced["metadata"]["resourceVersion"] != stale

    with pytest.raises(ApiError) as raised:
        await api.replace(configmaps(namespace, "cm"), {**created, "data": {"a": "3"}})
    assert (raised.value.status, raised.value.reason) == (409, "Conflict")
    assert "the object has been modified" in raised.value.message
    assert (await api.get(configmaps(namespace, "cm")))["data"] == {"a": "2"}

    with pytest.raises(ApiError) as exists:
        await api.create(configmaps(namespace), configmap("cm"))
    assert (exists.value.status, exists.value.reason) == (409, "AlreadyExists")


async def test_merge_strategic_and_json_patches_change_what_they_say(api: KubeClient, namespace: str) -> None:
    path = configmaps(namespace, "cm")
    await api.create(configmaps(namespace), configmap("cm", a="1", b="2"))

    merged = await api.patch(path, {"data": {"a": None, "c": "3"}}, "merge")
    assert merged["data"] == {"b": "2", "c": "3"}, "null removes a key in a merge patch"

    strategic = await api.patch(path, {"metadata": {"labels": {"extra": "yes"}}, "data": {"b": "20"}}, "strategic")
    assert strategic["data"] == {"b": "20", "c": "3"}
    assert strategic["metadata"]["labels"] == {LABEL: "x", "extra": "yes"}

    jsonpatch = await api.patch(path, [{"op": "test", "path": "/data/c", "value": "3"},
                                       {"op": "replace", "path": "/data/c", "value": "30"},
                                       {"op": "remove", "path": "/data/b"}], "json")
    assert jsonpatch["data"] == {"c": "30"}

    with pytest.raises(ApiError) as raised:  # a failed "test" applies nothing
        await api.patch(path, [{"op": "test", "path": "/data/c", "value": "nope"},
                               {"op": "remove", "path": "/data/c"}], "json")
    assert raised.value.status == 422
    assert (await api.get(path))["data"] == {"c": "30"}


async def test_server_side_apply_owns_fields_and_a_second_manager_conflicts_unless_forced(
    api: KubeClient, namespace: str
) -> None:
    path = configmaps(namespace, "cm")
    applied = await api.patch(path, configmap("cm", a="1"), "apply", field_manager="first")
    assert applied["data"] == {"a": "1"}, "apply creates what is not there"
    assert [m["manager"] for m in applied["metadata"]["managedFields"]] == ["first"]

    with pytest.raises(ApiError) as raised:
        await api.patch(path, configmap("cm", a="2"), "apply", field_manager="second")
    assert (raised.value.status, raised.value.reason) == (409, "Conflict")
    assert [c["field"] for c in raised.value.details["causes"]] == [".data.a"]
    assert "first" in raised.value.details["causes"][0]["message"]

    forced = await api.patch(path, configmap("cm", a="2"), "apply", field_manager="second", force=True)
    assert forced["data"] == {"a": "2"}
    owners = {m["manager"]: m["fieldsV1"] for m in forced["metadata"]["managedFields"]}
    assert "f:a" in owners["second"]["f:data"]
    assert "f:data" not in owners["first"], "forcing took the field away from the first manager"


async def test_the_status_subresource_writes_status_and_only_status(
    api: KubeClient, layouts: str
) -> None:
    name = f"kh-{layouts}"
    spec = {"gpus": [{"uuid": "GPU-1", "strategy": "Exclusive"}]}
    created = await api.create(LAYOUTS, {"apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLayout",
                                         "metadata": {"name": name, "labels": {LABEL: layouts}},
                                         "spec": spec, "status": {"backend": "ignored"}})
    assert "status" not in created or "backend" not in created["status"], "the main resource ignores status"

    status_path = resource_path("tessera.dev", "v1alpha1", "nodelayouts", name, subresource="status")
    body = {**created, "spec": {"gpus": []}, "status": {"backend": "simulated", "observedGeneration": 1}}
    written = await api.replace(status_path, body)
    assert (written["status"]["backend"], written["status"]["observedGeneration"]) == ("simulated", 1)
    assert written["spec"] == spec, "the status subresource ignores the spec"

    patched = await api.patch(status_path, {"status": {"agentVersion": "9.9"}}, "merge")
    assert patched["status"]["agentVersion"] == "9.9"
    assert patched["metadata"]["generation"] == 1, "status writes do not move the generation"

    with pytest.raises(ApiError) as stale:
        await api.replace(status_path, body)  # the resourceVersion of ``created``
    assert stale.value.status == 409

    with pytest.raises(ApiError) as unsupported:
        await api.patch(f"{LAYOUTS}/{name}", {"spec": {"gpus": []}}, "strategic")
    assert (unsupported.value.status, unsupported.value.reason) == (415, "UnsupportedMediaType")


async def test_a_deleted_object_is_gone_with_the_apiservers_not_found(api: KubeClient, namespace: str) -> None:
    created = await api.create(configmaps(namespace), configmap("cm"))
    with pytest.raises(ApiError) as precondition:
        await api.delete(configmaps(namespace, "cm"), {"preconditions": {"uid": "not-its-uid"}})
    assert precondition.value.status == 409

    await api.delete(configmaps(namespace, "cm"), {"preconditions": {"uid": created["metadata"]["uid"]}})
    for call in (api.get, api.delete):
        with pytest.raises(ApiError) as raised:
            await call(configmaps(namespace, "cm"))
        assert (raised.value.status, raised.value.reason) == (404, "NotFound")
        assert raised.value.message == 'configmaps "cm" not found'
        assert raised.value.details == {"name": "cm", "kind": "configmaps"}


async def test_a_service_account_token_file_authenticates_and_is_read_again_when_rotated(
    cluster: LocalCluster, api: KubeClient, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await api.create(resource_path("", "v1", "serviceaccounts", namespace=namespace), {"metadata": {"name": "agent"}})
    request = await api.create(resource_path("", "v1", "serviceaccounts", "agent", namespace=namespace,
                                             subresource="token"), {"spec": {"expirationSeconds": 600}})
    (tmp_path / "token").write_text(request["status"]["token"])
    credentials = load_kubeconfig(cluster.kubeconfig)
    assert credentials.ca_file
    shutil.copy(credentials.ca_file, tmp_path / "ca.crt")
    host, port = credentials.server.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    now = [1000.0]
    monkeypatch.setattr(kube_http.time, "monotonic", lambda: now[0])

    async with KubeClient(kube_http.in_cluster_credentials(tmp_path)) as pod:
        with pytest.raises(ApiError) as forbidden:  # known, but granted nothing
            await pod.get("/api/v1/namespaces/default")
        assert (forbidden.value.status, forbidden.value.reason) == (403, "Forbidden")
        assert f"system:serviceaccount:{namespace}:agent" in forbidden.value.message

        (tmp_path / "token").write_text("rotated-to-nothing\n")
        with pytest.raises(ApiError) as before_reread:
            await pod.get("/api/v1/namespaces/default")
        assert before_reread.value.status == 403, "within the minute the token read before is used"
        now[0] += kube_http.TOKEN_REREAD_SECONDS
        with pytest.raises(ApiError) as after_reread:
            await pod.get("/api/v1/namespaces/default")
        assert after_reread.value.status == 401


# -- watches ---------------------------------------------------------------------------------

async def collect(events: AsyncIterator[tuple[str, dict[str, Any]]], until: Callable[[str, dict[str, Any]], bool],
                  timeout: float = 30) -> list[tuple[str, str, dict[str, str]]]:
    """(type, name, data) of each event up to the one ``until`` accepts."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    async with asyncio.timeout(timeout):
        async for kind, obj in events:
            seen.append((kind, obj["metadata"]["name"], obj.get("data") or {}))
            if until(kind, obj):
                return seen
    raise AssertionError(f"the watch ended before the awaited event; it saw {seen}")


async def test_a_watch_sees_the_changes_in_order_and_resumes_from_a_resource_version(
    api: KubeClient, namespace: str
) -> None:
    start = (await api.list_page(configmaps(namespace), limit=1))["metadata"]["resourceVersion"]
    watching = api.watch(configmaps(namespace), resource_version=start, label_selector=LABEL, timeout_seconds=60)
    watcher = asyncio.ensure_future(collect(watching, lambda kind, _obj: kind == "DELETED"))
    await asyncio.sleep(0)  # the watch is open or not: from ``start`` on, it sees the same
    await api.create(configmaps(namespace), configmap("a", v="1"))
    second = await api.patch(configmaps(namespace, "a"), {"data": {"v": "2"}}, "merge")
    await api.create(configmaps(namespace), configmap("b", v="1"))
    await api.patch(configmaps(namespace, "a"), {"data": {"v": "3"}}, "merge")
    await api.delete(configmaps(namespace, "b"))
    expected = [("ADDED", "a", {"v": "1"}), ("MODIFIED", "a", {"v": "2"}), ("ADDED", "b", {"v": "1"}),
                ("MODIFIED", "a", {"v": "3"}), ("DELETED", "b", {"v": "1"})]
    assert await watcher == expected
    await watching.aclose()

    resumed = api.watch(configmaps(namespace), resource_version=second["metadata"]["resourceVersion"],
                        label_selector=LABEL, timeout_seconds=60)
    assert await collect(resumed, lambda kind, _obj: kind == "DELETED") == expected[2:]
    await resumed.aclose()


async def test_a_watch_without_a_resource_version_begins_with_what_exists(api: KubeClient, namespace: str) -> None:
    await api.create(configmaps(namespace), configmap("old", v="1"))
    watching = api.watch(configmaps(namespace), label_selector=LABEL, timeout_seconds=60)
    first = await collect(watching, lambda _kind, _obj: True)
    assert first == [("ADDED", "old", {"v": "1"})]
    await api.create(configmaps(namespace), configmap("new", v="1"))
    assert await collect(watching, lambda _kind, _obj: True) == [("ADDED", "new", {"v": "1"})]
    await watching.aclose()


async def test_the_bookmark_that_ends_the_initial_events_is_not_passed_on(
    api: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b"):
        await api.create(configmaps(namespace), configmap(name))
    raw = raw_events(monkeypatch)
    seen = [(kind, obj["metadata"]["name"]) async for kind, obj in
            api.watch(configmaps(namespace), label_selector=LABEL, send_initial_events=True, timeout_seconds=2)]
    assert sorted(seen) == [("ADDED", "a"), ("ADDED", "b")]
    bookmarks = [e["object"]["metadata"] for e in raw if e["type"] == "BOOKMARK"]
    assert bookmarks, "the apiserver ends the initial events with a bookmark"
    assert bookmarks[0]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_a_watch_from_a_too_old_resource_version_starts_again_from_the_current_state(
    api: KubeClient, layouts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The NodeLayout watch cache began when the CRD was installed, long after version 1.
    name = f"kh-{layouts}"
    await api.create(LAYOUTS, {"apiVersion": "tessera.dev/v1alpha1", "kind": "NodeLayout",
                               "metadata": {"name": name, "labels": {LABEL: layouts}}, "spec": {"gpus": []}})
    raw = raw_events(monkeypatch)
    sent = sent_params(monkeypatch, api)
    seen = [(kind, obj["metadata"]["name"]) async for kind, obj in
            api.watch(LAYOUTS, resource_version="1", label_selector=f"{LABEL}={layouts}", timeout_seconds=2)]
    assert seen == [("ADDED", name)]
    gone = raw[0]
    assert gone["type"] == "ERROR", "the real apiserver answers 200 and sends 410 as an event"
    assert (gone["object"]["code"], gone["object"]["reason"]) == (410, "Expired")
    assert "too old resource version" in gone["object"]["message"]
    assert [p.get("resourceVersion") for p in sent] == ["1", None]


async def test_a_watch_reads_an_event_longer_than_64_kib(api: KubeClient, namespace: str) -> None:
    start = (await api.list_page(configmaps(namespace), limit=1))["metadata"]["resourceVersion"]
    await api.create(configmaps(namespace), configmap("big", v="x" * 100_000))
    watching = api.watch(configmaps(namespace), resource_version=start, label_selector=LABEL, timeout_seconds=60)
    assert await collect(watching, lambda _kind, _obj: True) == [("ADDED", "big", {"v": "x" * 100_000})]
    await watching.aclose()
