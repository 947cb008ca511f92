"""``tessera.kube.http`` without any server: API paths, what an error answer becomes, and where
credentials come from (kubeconfig files and data, the in-cluster service account, a token file
read again). What the client does against a real apiserver is
``tests/integration/test_kube_http.py``."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import aiohttp
import pytest
import yaml

from tessera.kube import http as kube_http
from tessera.kube.http import ApiError, ConnectionLostError, Credentials, KubeClient, load_kubeconfig, resource_path


def test_paths_of_core_and_group_resources_objects_and_subresources() -> None:
    assert resource_path("", "v1", "nodes", "n1") == "/api/v1/nodes/n1"
    assert resource_path("resource.k8s.io", "v1", "resourceclaims", "c", namespace="ns", subresource="status") == (
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    )
    assert resource_path("tessera.dev", "v1alpha1", "nodelayouts") == "/apis/tessera.dev/v1alpha1/nodelayouts"


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


def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [1000.0]
    monkeypatch.setattr(kube_http.time, "monotonic", lambda: now[0])
    client = KubeClient(Credentials(server="http://k", token_file=str(token)))
    assert client._file_token() == "first"
    token.write_text("second\n")
    assert client._file_token() == "first", "within the minute: the token read before"
    now[0] += kube_http.TOKEN_REREAD_SECONDS
    assert client._file_token() == "second"


def test_an_error_answer_becomes_api_error_with_the_status_reason_and_details() -> None:
    status = {"kind": "Status", "code": 422, "reason": "Invalid", "message": "metadata.uid: Invalid value",
              "details": {"causes": [{"field": "metadata.uid"}]}}
    error = ApiError.from_response(422, json.dumps(status).encode())
    assert (error.status, error.reason, error.message) == (422, "Invalid", "metadata.uid: Invalid value")
    assert error.details["causes"] == [{"field": "metadata.uid"}]
    assert str(ApiError.from_response(503, b"upstream gone")) == "HTTP 503 : upstream gone"


async def test_server_side_apply_without_a_field_manager_is_refused_before_sending() -> None:
    async with KubeClient(Credentials(server="http://127.0.0.1:9")) as client:  # nothing listens there
        with pytest.raises(ValueError, match="field manager"):
            await client.patch("/api/v1/namespaces/n/configmaps/c", {}, "apply")


def test_a_kubeconfig_with_file_names_gives_absolute_paths_and_its_token(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://k:6443", "certificate-authority-data":
                                               base64.b64encode(b"PEM CA").decode()}}],
        "users": [{"name": "u", "user": {"client-certificate": "sub/tls.crt", "client-key": "/abs/tls.key",
                                         "token": "t0k"}}],
    }
    path = tmp_path / "sub" / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    credentials = load_kubeconfig(path)
    assert credentials.ca_data == "PEM CA"
    assert credentials.cert_file == str(tmp_path / "sub" / "sub" / "tls.crt")
    assert credentials.key_file == "/abs/tls.key"
    assert (credentials.token, credentials.token_file, credentials.cert_data) == ("t0k", None, None)


def test_secrets_stay_out_of_reprs() -> None:
    credentials = Credentials(server="https://k", token="s3cret-token", key_data=b"PRIVATE", cert_data=b"CERT",
                              ca_data="CA")
    for text in (repr(credentials), repr(KubeClient(Credentials(server="http://k", token="s3cret-token")))):
        assert "s3cret-token" not in text
        assert "PRIVATE" not in text


@pytest.mark.parametrize("answer", [
    b"",  # closed after reading the request: aiohttp's ServerDisconnectedError
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"kind\":",  # cut short
])
async def test_a_connection_that_breaks_mid_call_raises_an_os_error(answer: bytes) -> None:
    async def half_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(half_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with KubeClient(Credentials(server=f"http://127.0.0.1:{port}")) as client:
            with pytest.raises(ConnectionLostError, match="GET /api/v1/namespaces/x: the connection broke") as caught:
                await client.get("/api/v1/namespaces/x")
        assert isinstance(caught.value, OSError), "callers that retry on I/O errors retry on this one"
    finally:
        server.close()
        await server.wait_closed()


async def test_the_client_keeps_the_spells_in_which_the_apiserver_did_not_answer() -> None:
    """Refused or cut short begins a spell; 503 and 429 neither begin nor end one (an apiserver
    starting answers so, and so does one whose etcd or webhook fails); any other status ends it. A
    loopback server plays the apiserver's faults (what the real one does when killed is the
    fault campaign's and ``test_watch_recovery``'s)."""
    answers = [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}",
               b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}",
               b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}",
               b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
               b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}",
               b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"kind\":"]  # cut short

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answers.pop(0))
        await writer.drain()
        writer.close()

    refused = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = refused.sockets[0].getsockname()[1]
    refused.close()
    await refused.wait_closed()
    async with KubeClient(Credentials(server=f"http://127.0.0.1:{port}")) as client:
        with pytest.raises(aiohttp.ClientConnectorError):
            await client.get("/api/v1/namespaces/x")
        began = client.outages.since
        assert began is not None, "a refused connection begins a spell"
        server = await asyncio.start_server(answer, "127.0.0.1", port)
        try:
            for _ in range(2):  # 503, 429
                with pytest.raises((OSError, ApiError)):
                    await client.get("/api/v1/namespaces/x")
                assert client.outages.since == began
                assert not client.outages.spells
            with pytest.raises(ApiError):
                await client.get("/api/v1/namespaces/x")  # 404: the apiserver answers
            assert client.outages.since is None
            assert len(client.outages.spells) == 1
            assert client.outages.spells[0][0] == began
            assert client.outages.spells[0].blind, "the client never had an answer before it: blind"
            await client.get("/api/v1/namespaces/x")
            assert len(client.outages.spells) == 1, "answers after a spell add none"
            with pytest.raises(ApiError):
                await client.get("/api/v1/namespaces/x")  # 503 from an apiserver that is up
            assert client.outages.since is None, "a 5xx does not begin a spell"
            with pytest.raises(ConnectionLostError):
                await client.get("/api/v1/namespaces/x")  # cut short
            assert client.outages.since is not None, "an answer broken off begins a spell"
        finally:
            server.close()
            await server.wait_closed()
