"""``tessera.kube.http.KubeClient`` against a fake apiserver on loopback: the paths, query
parameters, content types and bodies it sends, what it makes of the answers (Status errors,
pages, watch streams with bookmarks and 410 Gone), and where its credentials come from."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from tessera.kube import http as kube_http
from tessera.kube.http import ApiError, Credentials, KubeClient, load_kubeconfig, resource_path

Handler = Callable[[web.Request], Any]


class FakeApiServer:
    """Answers each request with the next handler queued for its method and path; keeps the
    requests (method, path, query, headers, body) for the test to read."""

    def __init__(self) -> None:
        self.handlers: dict[tuple[str, str], list[Handler]] = {}
        self.requests: list[dict[str, Any]] = []

    def on(self, method: str, path: str, handler: Handler) -> None:
        self.handlers.setdefault((method, path), []).append(handler)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append({"method": request.method, "path": request.path, "query": dict(request.query),
                              "headers": dict(request.headers), "body": json.loads(body) if body else None})
        queue = self.handlers.get((request.method, request.path)) or []
        if not queue:
            return web.json_response({"kind": "Status", "reason": "NotFound", "message": "no such thing",
                                      "code": 404}, status=404)
        result = queue.pop(0)(request)
        return (await result) if hasattr(result, "__await__") else result


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApiServer, KubeClient]]:
    server = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    async with TestServer(app, host="127.0.0.1") as http_server:
        credentials = Credentials(server=str(http_server.make_url("")).rstrip("/"), token="s3cret-token")
        async with KubeClient(credentials) as client:
            yield server, client


def reply(body: dict[str, Any], status: int = 200) -> Handler:
    return lambda _request: web.json_response(body, status=status)


LAYOUTS = resource_path("tessera.dev", "v1alpha1", "nodelayouts")


def test_paths_of_core_and_group_resources_objects_and_subresources() -> None:
    assert resource_path("", "v1", "nodes", "n1") == "/api/v1/nodes/n1"
    assert resource_path("resource.k8s.io", "v1", "resourceclaims", "c", namespace="ns", subresource="status") == (
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    )
    assert LAYOUTS == "/apis/tessera.dev/v1alpha1/nodelayouts"


async def test_get_sends_the_bearer_token_and_returns_the_json(fake: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = fake
    server.on("GET", f"{LAYOUTS}/n1", reply({"metadata": {"name": "n1"}}))
    assert await client.get(f"{LAYOUTS}/n1") == {"metadata": {"name": "n1"}}
    assert server.requests[0]["headers"]["Authorization"] == "Bearer s3cret-token"


async def test_an_error_answer_raises_api_error_with_the_status_reason_and_details(
    fake: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = fake
    status = {"kind": "Status", "code": 422, "reason": "Invalid", "message": "metadata.uid: Invalid value",
              "details": {"causes": [{"field": "metadata.uid"}]}}
    server.on("PUT", f"{LAYOUTS}/n1/status", reply(status, 422))
    with pytest.raises(ApiError) as raised:
        await client.replace(resource_path("tessera.dev", "v1alpha1", "nodelayouts", "n1", subresource="status"), {})
    assert (raised.value.status, raised.value.reason) == (422, "Invalid")
    assert raised.value.message == "metadata.uid: Invalid value"
    assert raised.value.details["causes"] == [{"field": "metadata.uid"}]

    server.on("GET", "/api/v1/nodes/x", lambda _r: web.Response(status=503, text="upstream gone"))
    with pytest.raises(ApiError, match="HTTP 503 : upstream gone"):
        await client.get("/api/v1/nodes/x")


async def test_list_follows_continue_tokens_and_passes_selectors(fake: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = fake
    server.on("GET", LAYOUTS, reply({"items": [{"n": 1}, {"n": 2}], "metadata": {"continue": "page-2"}}))
    server.on("GET", LAYOUTS, reply({"items": [{"n": 3}], "metadata": {}}))
    items = await client.list(LAYOUTS, label_selector="a=b", field_selector="metadata.name=n1", page_size=2)
    assert items == [{"n": 1}, {"n": 2}, {"n": 3}]
    first, second = (r["query"] for r in server.requests)
    assert first == {"labelSelector": "a=b", "fieldSelector": "metadata.name=n1", "limit": "2"}
    assert second == {**first, "continue": "page-2"}


@pytest.mark.parametrize(
    ("patch_type", "content_type"),
    [("merge", "application/merge-patch+json"), ("strategic", "application/strategic-merge-patch+json"),
     ("json", "application/json-patch+json"), ("apply", "application/apply-patch+yaml")],
)
async def test_each_patch_type_goes_out_with_its_content_type(
    fake: tuple[FakeApiServer, KubeClient], patch_type: kube_http.PatchType, content_type: str
) -> None:
    server, client = fake
    server.on("PATCH", f"{LAYOUTS}/n1", reply({"ok": True}))
    body: Any = [{"op": "add", "path": "/x", "value": 1}] if patch_type == "json" else {"spec": {"gpus": []}}
    await client.patch(f"{LAYOUTS}/n1", body, patch_type, field_manager="tessera", force=patch_type == "apply")
    (request,) = server.requests
    assert request["headers"]["Content-Type"] == content_type
    assert request["body"] == body
    expected = {"fieldManager": "tessera", "force": "true"} if patch_type == "apply" else {"fieldManager": "tessera"}
    assert request["query"] == expected


async def test_server_side_apply_without_a_field_manager_is_refused_before_sending(
    fake: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = fake
    with pytest.raises(ValueError, match="field manager"):
        await client.patch(f"{LAYOUTS}/n1", {}, "apply")
    assert server.requests == []


async def test_create_and_delete_send_their_bodies(fake: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = fake
    server.on("POST", LAYOUTS, reply({"metadata": {"name": "n1", "uid": "u1"}}, 201))
    server.on("DELETE", f"{LAYOUTS}/n1", reply({"kind": "Status", "status": "Success"}))
    created = await client.create(LAYOUTS, {"metadata": {"name": "n1"}})
    await client.delete(f"{LAYOUTS}/n1", {"preconditions": {"uid": created["metadata"]["uid"]}})
    assert [r["body"] for r in server.requests] == [{"metadata": {"name": "n1"}}, {"preconditions": {"uid": "u1"}}]


def watch_stream(*events: dict[str, Any], chunk: int = 7) -> Handler:
    """A watch answer written in small chunks, so that lines arrive split across reads."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        for start in range(0, len(data), chunk):
            await response.write(data[start:start + chunk])
        await response.write_eof()
        return response

    return handler


def event(kind: str, name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": version}, **extra}}


async def test_watch_yields_events_skips_bookmarks_and_reads_lines_longer_than_64_kib(
    fake: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = fake
    big = "x" * 100_000
    server.on("GET", LAYOUTS, watch_stream(event("ADDED", "n1", "5"), event("BOOKMARK", "", "9"),
                                           event("MODIFIED", "n1", "10", spec={"note": big}), chunk=4096))
    seen = [(kind, obj["metadata"]["resourceVersion"])
            async for kind, obj in client.watch(LAYOUTS, resource_version="4", field_selector="metadata.name=n1")]
    assert seen == [("ADDED", "5"), ("MODIFIED", "10")]
    query = server.requests[0]["query"]
    assert query["watch"] == "true"
    assert query["allowWatchBookmarks"] == "true"
    assert (query["resourceVersion"], query["fieldSelector"]) == ("4", "metadata.name=n1")


async def test_a_watch_too_old_410_gone_starts_again_from_the_current_state(
    fake: tuple[FakeApiServer, KubeClient],
) -> None:
    server, client = fake
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    server.on("GET", LAYOUTS, watch_stream(event("MODIFIED", "n1", "7"), gone))
    server.on("GET", LAYOUTS, watch_stream(event("ADDED", "n1", "12")))
    seen = [(kind, obj["metadata"]["resourceVersion"])
            async for kind, obj in client.watch(LAYOUTS, resource_version="3")]
    assert seen == [("MODIFIED", "7"), ("ADDED", "12")]
    assert [r["query"].get("resourceVersion") for r in server.requests] == ["3", None]


async def test_a_watch_error_other_than_gone_raises(fake: tuple[FakeApiServer, KubeClient]) -> None:
    server, client = fake
    failure = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError", "message": "boom"}}
    server.on("GET", LAYOUTS, watch_stream(failure))
    with pytest.raises(ApiError, match="boom"):
        async for _ in client.watch(LAYOUTS):
            pass


def test_a_kubeconfig_gives_the_current_contexts_server_ca_and_credentials(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    config = {
        "current-context": "mine",
        "contexts": [{"name": "other", "context": {"cluster": "c2", "user": "u2"}},
                     {"name": "mine", "context": {"cluster": "c1", "user": "u1"}}],
        "clusters": [{"name": "c1", "cluster": {"server": "https://10.0.0.1:6443/", "certificate-authority": "ca.crt"}},
                     {"name": "c2", "cluster": {"server": "https://elsewhere"}}],
        "users": [{"name": "u1", "user": {"client-certificate-data": base64.b64encode(b"CERT").decode(),
                                          "client-key-data": base64.b64encode(b"KEY").decode(),
                                          "tokenFile": "token"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    credentials = load_kubeconfig(path)
    assert credentials.server == "https://10.0.0.1:6443"
    assert credentials.ca_file == str(tmp_path / "ca.crt"), "relative to the kubeconfig's folder"
    assert (credentials.cert_data, credentials.key_data) == (b"CERT", b"KEY")
    assert credentials.token_file == str(tmp_path / "token")


def test_a_kubeconfig_without_its_current_context_says_so(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"current-context": "gone", "contexts": []}))
    with pytest.raises(ValueError, match="current-context 'gone'"):
        load_kubeconfig(path)


def test_in_cluster_credentials_come_from_the_environment_and_the_service_account_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    credentials = kube_http.in_cluster_credentials(tmp_path)
    assert credentials.server == "https://[fd00::1]:443"
    assert (credentials.ca_file, credentials.token_file) == (str(tmp_path / "ca.crt"), str(tmp_path / "token"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ValueError, match="--kubeconfig"):
        kube_http.in_cluster_credentials(tmp_path)


async def test_a_rotated_token_file_is_read_again(
    fake: tuple[FakeApiServer, KubeClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = fake
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [1000.0]
    monkeypatch.setattr(kube_http.time, "monotonic", lambda: now[0])
    rotating = KubeClient(Credentials(server=client.credentials.server, token_file=str(token)))
    for path in ("/a", "/b", "/c"):
        server.on("GET", path, reply({}))
    async with rotating:
        await rotating.get("/a")
        token.write_text("second\n")
        await rotating.get("/b")  # within the minute: the token read before
        now[0] += kube_http.TOKEN_REREAD_SECONDS
        await rotating.get("/c")
    assert [r["headers"]["Authorization"] for r in server.requests] == ["Bearer first", "Bearer first", "Bearer second"]


def test_secrets_stay_out_of_reprs() -> None:
    credentials = Credentials(server="https://k", token="s3cret-token", key_data=b"PRIVATE", cert_data=b"CERT",
                              ca_data="CA")
    for text in (repr(credentials), repr(KubeClient(Credentials(server="http://k", token="s3cret-token")))):
        assert "s3cret-token" not in text
        assert "PRIVATE" not in text
