"""A small asynchronous Kubernetes client on aiohttp: JSON in, plain dicts out.

``KubeClient`` speaks the API's REST verbs on paths built by ``resource_path``: get, list (every
page, or one with ``list_page``; label and field selectors), create, replace, patch (merge, strategic
merge, JSON patch, server-side apply with a field manager), delete, and watch (newline-delimited
JSON events; bookmarks are not passed on; a 410 Gone starts the watch again from the current
state). Any answer outside 2xx raises ``ApiError`` with the
apiserver's Status; a connection that breaks in the middle of a call (the apiserver killed or
restarted while it answered) raises ``ConnectionLostError``, an ``OSError`` like a refused connection,
so that a caller that retries on I/O errors retries on it too (aiohttp's own exceptions for it
are not OSErrors: an agent pass that caught only OSError died of one in a long run).
Credentials come from a kubeconfig (server, CA, client certificate and
key, bearer token or token file, or an ``exec`` credential plugin: ``tessera.kube.execauth``,
run again before its token expires and after a 401) or from the in-cluster service account,
whose token file is read again when the kubelet rotates it. Kubeconfig users Tessera does not
support are refused with an error that names them: ``auth-provider`` (kubectl removed its
gcp and azure providers; use their exec plugins, or kubelogin for oidc), ``username`` and
``password`` (basic authentication, gone from Kubernetes since 1.19), and impersonation
(``as``, ``as-uid``, ``as-groups``, ``as-user-extra``). A client given a ``WriteFence``
(``tessera.kube.fence``) checks it for every mutating request at the last moment before the
request's bytes go out (when aiohttp has its connection and is about to write), and raises
``NotLeading`` instead of writing; ``on_write`` is told of every mutating request that does go out.

It is Tessera's one Kubernetes client, so that neither the node agent nor the operator loads a
library of a thousand API models to read a few kinds of object. Tokens and keys never appear in
a repr or a log.
It also owns Tessera's one retry schedule: ``retry_delay(attempt)`` is how long any caller waits
before trying a failed call again (``RETRY_BACKOFF``: 1, 2, 5, then every 10 s), and every
retry loop of Tessera asks it: the operator's reconcile of a node and its start-up lists, the
``ListWatch`` loops (the agent's NodeLayout watch among them), the agent's passes after a failure
and its wait for its NodeLayout, and Kopf's own ``error_backoffs``. One schedule of its own:
``CONFLICT_BACKOFF``, for a write that lost an optimistic-concurrency race (409 Conflict) and is
read and tried again at once: the other writer is done within milliseconds, not seconds.
JSON is written and read with orjson. At 1,000 nodes the operator's profile spent 5.8 s in
``json.dumps``; orjson writes a node's MIG slice 15x faster and reads it 1.9x faster, a
NodeLayout's status 2.7x (``benchmarks/bench_json.py``). Reading with it once cost the operator
17 MiB more at 1,000 MIG nodes, when its views kept whole objects; they keep models and digests
now, and over 1,000 nodes its peak RSS was 130 MiB with either reader (120 MiB against 117-118
after a restart). An error's body, which may be anything, is read with the standard library.
Not for: what the calls mean (``tessera.kube.nodelayouts``, ``claims``, ``claimstatus``,
``objects``), keeping a view current (``tessera.kube.watch``), or which errors are worth another
try (the callers decide).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import orjson

from tessera.kube.execauth import ExecPlugin, ExecToken, run_exec_plugin
from tessera.kube.fence import MUTATING_METHODS, NotLeading, WriteFence
from tessera.kube.outages import Outages

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # the kubelet rotates projected tokens well before they expire
RETRY_BACKOFF: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0)  # seconds before the 1st, 2nd, 3rd, 4th and later retry
CONFLICT_BACKOFF: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8)  # a 409 Conflict: read again and retry soon


def retry_delay(attempt: int, backoff: Sequence[float] = RETRY_BACKOFF) -> float:
    """Seconds to wait before retry number ``attempt`` (0: the first) of a call that failed;
    past the end of ``backoff`` its last step repeats."""
    return backoff[min(max(attempt, 0), len(backoff) - 1)]


Objects = list[dict[str, Any]]  # named here: inside KubeClient, ``list`` is the method
PatchType = Literal["merge", "strategic", "json", "apply"]
PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",  # JSON is YAML, so the body goes as JSON
}


class ConnectionLostError(ConnectionError):
    """The connection broke before the whole answer came: the server went away mid-call. Whether
    the call took effect is unknown; like any I/O error, worth another try after a backoff."""


class ApiError(Exception):
    """The apiserver answered outside 2xx. ``status`` is the HTTP code, ``reason`` the Status
    reason (``NotFound``, ``Conflict``, ``Invalid``, ...), ``details`` the Status details
    (e.g. ``causes``), when the answer was a Status object."""

    def __init__(self, status: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}

    @classmethod
    def from_response(cls, status: int, body: bytes) -> ApiError:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("kind") == "Status":
            return cls(status, str(parsed.get("reason") or ""), str(parsed.get("message") or ""),
                       parsed.get("details") or {})
        return cls(status, "", body[:300].decode(errors="replace"))


def resource_path(group: str, version: str, plural: str, name: str | None = None, *,
                  namespace: str | None = None, subresource: str | None = None) -> str:
    """The API path of a resource, an object, or an object's subresource. ``group`` is "" for
    the core API (``/api/v1``)."""
    parts = ["/api", version] if not group else ["/apis", group, version]
    if namespace is not None:
        parts += ["namespaces", quote(namespace, safe="")]
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
    return "/".join(parts)


@dataclass(frozen=True)
class Credentials:
    """Where the apiserver is and how to prove who we are. Secrets stay out of the repr."""

    server: str
    ca_file: str | None = None
    ca_data: str | None = field(default=None, repr=False)  # PEM
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = field(default=None, repr=False)  # PEM
    key_data: bytes | None = field(default=None, repr=False)  # PEM
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    exec_plugin: ExecPlugin | None = None  # a kubeconfig's exec credential plugin

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS settings for aiohttp: our CA and client certificate, or False (no checks)."""
        if self.insecure:
            return False
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file and self.key_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        elif self.cert_data and self.key_data:
            # ssl reads a certificate chain only from files: a private folder, removed at once.
            with tempfile.TemporaryDirectory(prefix="tessera-tls-") as folder:
                cert, key = Path(folder) / "tls.crt", Path(folder) / "tls.key"
                for path, data in ((cert, self.cert_data), (key, self.key_data)):
                    path.touch(mode=0o600)
                    path.write_bytes(data)
                context.load_cert_chain(str(cert), str(key))
        return context


UNSUPPORTED_USER_FIELDS: dict[str, str] = {
    "auth-provider": "use the provider's exec credential plugin instead (gke-gcloud-auth-plugin, kubelogin; "
                     "kubelogin also serves oidc)",
    "username": "basic authentication is gone from Kubernetes: use a token, a client certificate or an exec plugin",
    "password": "basic authentication is gone from Kubernetes: use a token, a client certificate or an exec plugin",
    "as": "impersonation is not supported: use the impersonated identity's own credentials",
    "as-uid": "impersonation is not supported: use the impersonated identity's own credentials",
    "as-groups": "impersonation is not supported: use the impersonated identity's own credentials",
    "as-user-extra": "impersonation is not supported: use the impersonated identity's own credentials",
}


def load_kubeconfig(path: str | Path) -> Credentials:
    """The credentials of a kubeconfig's current context. Relative file names are relative to
    the kubeconfig's folder, as kubectl reads them. A user Tessera cannot authenticate as
    (``UNSUPPORTED_USER_FIELDS``) raises ValueError naming the field and what to use instead."""
    import yaml  # here, not above: an agent in a Pod reads no kubeconfig and need not load YAML

    path = Path(path)
    config = yaml.safe_load(path.read_text()) or {}
    context_name = config.get("current-context")
    contexts = {c["name"]: c.get("context") or {} for c in config.get("contexts") or []}
    if context_name not in contexts:
        raise ValueError(f"{path}: current-context {context_name!r} is not among its contexts")
    context = contexts[context_name]
    clusters = {c["name"]: c.get("cluster") or {} for c in config.get("clusters") or []}
    users = {u["name"]: u.get("user") or {} for u in config.get("users") or []}
    cluster = clusters.get(context.get("cluster"))
    if cluster is None or not cluster.get("server"):
        raise ValueError(f"{path}: context {context_name!r} names no cluster with a server")
    user = users.get(context.get("user"), {})
    where = f"{path}: user {context.get('user')!r}"
    for key, instead in UNSUPPORTED_USER_FIELDS.items():
        if user.get(key):
            raise ValueError(f"{where}: {key} is not supported by Tessera's Kubernetes client: {instead}")
    plugin = None
    if user.get("exec"):
        plugin = ExecPlugin.from_kubeconfig(user["exec"], folder=path.parent, cluster=cluster, where=where)

    def file(value: str | None) -> str | None:
        return str(path.parent / value) if value else None

    def data(value: str | None) -> bytes | None:
        return base64.b64decode(value) if value else None

    ca_data = data(cluster.get("certificate-authority-data"))
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        ca_file=file(cluster.get("certificate-authority")),
        ca_data=ca_data.decode() if ca_data else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file(user.get("client-certificate")),
        key_file=file(user.get("client-key")),
        cert_data=data(user.get("client-certificate-data")),
        key_data=data(user.get("client-key-data")),
        token=user.get("token"),
        token_file=file(user.get("tokenFile")),
        exec_plugin=plugin,
    )


def in_cluster_credentials(folder: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    """The Pod's service account: the apiserver from the environment, the token file kept as a
    file so that a rotated token is picked up."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError("not in a cluster (no KUBERNETES_SERVICE_HOST/PORT) and no kubeconfig: pass --kubeconfig")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return Credentials(server=f"https://{host}:{port}", ca_file=str(folder / "ca.crt"),
                       token_file=str(folder / "token"))


class KubeClient:
    """One connection pool to one apiserver. Use ``async with`` or call ``close()``.

    At most ``connections`` requests are open at once; more wait for a free connection. Each
    open TLS connection costs a 128 KiB read buffer, so a pool that grows to every write a
    busy operator has in flight costs tens of MiB; a watch holds its connection while it runs."""

    def __init__(self, credentials: Credentials, timeout_s: float = 300.0, connections: int = 32, *,
                 fence: WriteFence | None = None, on_write: Callable[[str, str], None] | None = None) -> None:
        self.credentials = credentials
        self.fence = fence  # mutating requests go out only while it is open
        self.on_write = on_write  # (method, url) of each mutating request as it goes out
        self.timeout_s = timeout_s  # per request, unless a call says otherwise
        self.connections = connections
        self._ssl = credentials.ssl_context() if credentials.server.startswith("https") else False
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = credentials.token
        self._token_read_at = -TOKEN_REREAD_SECONDS
        self._exec_token: ExecToken | None = None
        self._exec_lock = asyncio.Lock()  # one plugin run at a time, however many requests wait
        self.exec_runs = 0  # how many times the exec plugin ran (tests)
        self.outages = Outages()  # spells in which no call of this client was answered

    def __repr__(self) -> str:
        return f"KubeClient(server={self.credentials.server!r})"

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, *, fence: WriteFence | None = None,
                         on_write: Callable[[str, str], None] | None = None) -> KubeClient:
        """A client for ``kubeconfig``, else ``$KUBECONFIG``, else the in-cluster account."""
        path = kubeconfig or os.environ.get("KUBECONFIG")
        return cls(load_kubeconfig(path) if path else in_cluster_credentials(), fence=fence, on_write=on_write)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the verbs -------------------------------------------------------------------------

    async def get(self, path: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self.request("GET", path, timeout_s=timeout_s)

    async def list_page(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
                        limit: int | None = None, continue_: str | None = None,
                        resource_version: str | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """One page of a list, as the API sent it (``items``, ``metadata.continue``)."""
        params = _drop_none({"labelSelector": label_selector, "fieldSelector": field_selector,
                             "limit": limit, "continue": continue_, "resourceVersion": resource_version})
        return await self.request("GET", path, params=params, timeout_s=timeout_s)

    async def list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
                   page_size: int = 500, timeout_s: float | None = None) -> Objects:
        """Every item, page by page (``list_page`` for one page), each naming its ``apiVersion``
        and ``kind`` as a single get would (list items leave them out)."""
        items: Objects = []
        token: str | None = None
        while True:
            page = await self.list_page(path, label_selector=label_selector, field_selector=field_selector,
                                   limit=page_size, continue_=token, timeout_s=timeout_s)
            kind = str(page.get("kind", "")).removesuffix("List")
            for item in page.get("items") or []:
                item.setdefault("apiVersion", page.get("apiVersion"))
                item.setdefault("kind", kind)
                items.append(item)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def create(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self.request("POST", path, body=body, timeout_s=timeout_s)

    async def replace(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        return await self.request("PUT", path, body=body, timeout_s=timeout_s)

    async def patch(self, path: str, body: Any, patch_type: PatchType = "merge", *,
                    field_manager: str | None = None, force: bool = False,
                    timeout_s: float | None = None) -> dict[str, Any]:
        """A patch of ``patch_type``; server-side apply (``"apply"``) needs a ``field_manager``."""
        if patch_type == "apply" and not field_manager:
            raise ValueError("server-side apply needs a field manager")
        params = _drop_none({"fieldManager": field_manager, "force": "true" if force else None})
        return await self.request("PATCH", path, params=params, body=body,
                                  content_type=PATCH_CONTENT_TYPES[patch_type], timeout_s=timeout_s)

    async def delete(self, path: str, body: Mapping[str, Any] | None = None, *,
                     timeout_s: float | None = None) -> dict[str, Any]:
        """Delete; ``body`` is DeleteOptions (preconditions, propagationPolicy)."""
        return await self.request("DELETE", path, body=body, timeout_s=timeout_s)

    async def watch(self, path: str, *, resource_version: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None, send_initial_events: bool = False,
                    timeout_seconds: int = 300, bookmarks: bool = False,
                    restart_expired: bool = True) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) until the server ends the watch after ``timeout_seconds``.

        From ``resource_version`` on: the changes after that version. Without it the server
        begins with an ADDED event for every current object. ``send_initial_events`` asks for
        those ADDED events as a watch-list stream (``sendInitialEvents``), which the server ends
        with a bookmark. Bookmarks are asked for, and passed on only when ``bookmarks`` says so
        (a caller that resumes a watch later wants their resourceVersion). When the
        resourceVersion is too old (410 Gone: the real apiserver sends it as an ERROR event in a
        200 answer once the version has left its watch cache), the watch starts again from the
        current state, so the caller sees ADDED for what exists now, as after a relist, but
        nothing for what went meanwhile; a caller that must see deletions passes
        ``restart_expired=False``, gets ``ApiError`` 410, and lists again itself. Any other
        error raises ``ApiError``, e.g. 429 while the apiserver's cache of a newly created
        resource is still filling."""
        version = resource_version
        while True:
            params = _drop_none({"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": timeout_seconds,
                                 "labelSelector": label_selector, "fieldSelector": field_selector,
                                 "resourceVersion": version})
            if send_initial_events:
                params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
            expired = False
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_seconds + 30)
            async with await self._send("GET", path, params, None, None, timeout) as response:
                if response.status == 410:
                    expired = True
                elif not 200 <= response.status <= 299:
                    raise ApiError.from_response(response.status, await response.read())
                else:
                    try:
                        async for event in _json_lines(response.content):
                            kind, obj = str(event.get("type")), event.get("object") or {}
                            if kind == "ERROR":
                                if obj.get("code") == 410:
                                    expired = True
                                    break
                                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""),
                                               str(obj.get("message") or ""), obj.get("details"))
                            if kind != "BOOKMARK" or bookmarks:
                                yield kind, obj
                    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError):
                        self.outages.failed()  # the stream broke: the apiserver went away mid-watch
                        raise
            if not expired:
                return
            if not restart_expired:
                raise ApiError(410, "Expired", f"the watch of {path} fell behind resourceVersion {version}")
            version = None

    # -- the wire --------------------------------------------------------------------------

    async def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout_s: float | None = None) -> dict[str, Any]:
        """One call; the JSON answer as a dict. Raises ApiError outside 2xx, NotLeading for a
        write the fence refused."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        if self.fence is not None:
            self.fence.check(method, path)  # fail early; the last check is at the wire
        try:
            async with await self._send(method, path, params, body, content_type, timeout) as response:
                data = await response.read()
                if not 200 <= response.status <= 299:
                    raise ApiError.from_response(response.status, data)
        except aiohttp.ClientError as exc:
            refused = _refused_by_fence(exc)  # aiohttp wraps what the body writer raised
            if refused is not None:
                raise refused from exc
            if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
                self.outages.failed()
                raise ConnectionLostError(f"{method} {path}: the connection broke before the whole answer came "
                                     f"({exc})") from exc
            raise
        if not data:
            return {}
        answer: dict[str, Any] = orjson.loads(data)
        return answer

    async def _send(self, method: str, path: str, params: Mapping[str, Any] | None, body: Any,
                    content_type: str | None, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        if self._session is None:
            request_class = aiohttp.ClientRequest
            if self.fence is not None or self.on_write is not None:
                request_class = _fenced_request_class(self.fence, self.on_write)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.connections),
                                                  request_class=request_class)
        data = None
        if body is not None:
            data = orjson.dumps(body)
        query = {k: str(v) for k, v in (params or {}).items()}
        for attempt in range(2):
            headers = {"Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = content_type or "application/json"
            token = await self.bearer_token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                response = await self._session.request(method, self.credentials.server + path, params=query,
                                                       data=data, headers=headers, ssl=self._ssl, timeout=timeout)
            except (aiohttp.ClientConnectionError, OSError) as exc:
                if _refused_by_fence(exc) is None:
                    self.outages.failed()
                raise
            self.outages.answer(response.status)
            if response.status != 401 or self.credentials.exec_plugin is None or attempt:
                return response
            # The plugin's token was refused (revoked, or expired early): run it again, once.
            response.release()
            await self.refresh_credentials(refused=token)
        raise AssertionError("unreachable: the second attempt always returns")

    async def bearer_token(self) -> str | None:
        """The token to send: the exec plugin's (run again when due), a file's (read again every
        minute: the kubelet rotates it), or the kubeconfig's."""
        if self.credentials.exec_plugin is not None:
            current = self._exec_token
            if current is None or current.due(datetime.now(UTC)):
                await self.refresh_credentials(refused=current.token if current else None)
            return self._exec_token.token if self._exec_token else None
        return self._file_token()

    def _file_token(self) -> str | None:
        if self.credentials.token_file and time.monotonic() - self._token_read_at >= TOKEN_REREAD_SECONDS:
            self._token = Path(self.credentials.token_file).read_text().strip()  # a few bytes, from tmpfs
            self._token_read_at = time.monotonic()
        return self._token

    @property
    def token_expires_at(self) -> datetime | None:
        """When the exec plugin's current token expires (None: no plugin, or no expiry given)."""
        return self._exec_token.expires_at if self._exec_token else None

    async def refresh_credentials(self, refused: str | None = None, *, force: bool = False) -> None:
        """Get new credentials now: run the exec plugin again (unless, without ``force``, another
        request already replaced ``refused``, the token that failed), read a token file again."""
        plugin = self.credentials.exec_plugin
        if plugin is None:
            self._token_read_at = -TOKEN_REREAD_SECONDS
            return
        async with self._exec_lock:
            current = self._exec_token
            if not force and current is not None and current.token != refused and not current.due(datetime.now(UTC)):
                return  # another request ran the plugin while this one waited
            self._exec_token = await run_exec_plugin(plugin)
            self.exec_runs += 1


def _fenced_request_class(fence: WriteFence | None,
                          on_write: Callable[[str, str], None] | None) -> type[aiohttp.ClientRequest]:
    """aiohttp's request, checking ``fence`` where the request meets its connection: ``send``
    (a request without a body goes out there) and the start of ``write_bytes`` (aiohttp holds
    a request's headers back to send them with the first bytes of its body). Between either
    check and the socket's write there is no await, so nothing of a refused write leaves the
    process, however long it waited for a connection or was frozen before."""

    def check(request: aiohttp.ClientRequest) -> None:
        if fence is not None and request.method in MUTATING_METHODS:
            fence.check(request.method, request.url)

    class FencedRequest(aiohttp.ClientRequest):
        async def send(self, conn: Any) -> aiohttp.ClientResponse:
            check(self)
            if on_write is not None and self.method in MUTATING_METHODS:
                on_write(self.method, str(self.url))  # told once; the body's check may still refuse it
            return await super().send(conn)

        async def write_bytes(self, writer: Any, conn: Any, content_length: int | None = None) -> None:
            try:
                check(self)
            except NotLeading as refused:  # fail the response that waits on this connection, as aiohttp would
                conn.protocol.set_exception(aiohttp.ClientConnectionError(str(refused)), refused)
                conn.close()
                return
            await super().write_bytes(writer, conn, content_length)

    return FencedRequest


def _refused_by_fence(error: BaseException) -> NotLeading | None:
    """The NotLeading behind an aiohttp error, if the fence caused it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, NotLeading):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


async def _json_lines(stream: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """One JSON object per line, however long the line (an object can pass 64 KiB)."""
    buffer = b""
    async for chunk in stream.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield orjson.loads(line)
    if buffer.strip():
        yield orjson.loads(buffer)


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
