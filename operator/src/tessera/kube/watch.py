"""A list-then-watch loop that keeps a consumer current on one kind of object, cheaply: every
event goes straight to a callback as the plain dict the API sent (no copies, nothing stored on
the objects, no per-object bookkeeping but a small stub of each object seen).

``ListWatch`` lists (page by page), tells the callback what is new or changed since it last
looked as each page arrives, and what is gone (``DELETED`` with the stub it kept), then
watches from the list's resourceVersion. A watch the server ends is resumed from the last
resourceVersion seen (bookmarks included); one that fell too far behind (410 Gone) is
replaced by a fresh list, so no deletion is missed; any other error is retried after a
backoff. ``stop()`` ends it.

A watch that hears nothing — no event and no bookmark — for ``WATCH_IDLE_TIMEOUT_S`` (90 s;
``TESSERA_IDLE_TIMEOUT`` overrides it) raises ``WatchSilentError`` inside the loop, which closes
the connection and reopens the watch from the last resourceVersion. Why 90 s: the watch asks for
bookmarks, and the apiserver's watch cache sends every watcher one about once a minute even when
nothing changes, so a healthy watch is never silent that long; a silent one is a connection that
died without a FIN or RST (a node or NAT that lost its state, an apiserver frozen or partitioned
away: the TCP connection stays half-open), which without the bound is noticed only when the read
timeout (the server's 300 s plus 30 s) runs out: five and a half minutes of a stale view. The cost
is nothing on a healthy watch (no extra request: the bound only re-arms a timer per event). A 15 s
bound was tried and dropped (2b68a97): that short, it had to be met by reopening every watch every
15 s whether or not it was healthy, one request per watch per 15 s across a fleet of agents, and
bought nothing after an apiserver kill (a killed apiserver closes its sockets; the watch sees that
at once). The bound is for the case a kill does not show: the silent peer. Its price in that rare
case: the apiserver keeps a watch's past events for at least 75 s, so a watch reopened 90 s after
its last word may find its resourceVersion gone (410 Gone) and list again, which is handled. Kopf's
watches of the operator get the same bound (``settings.watching.inactivity_timeout``, whose own
default is 70 s, in ``tessera.controller.handlers``): one bound, one override, for every watch.

What it keeps of each object is its resourceVersion and its stub as compact JSON (a stub held
as dicts costs about five times as much; an operator at thousands of nodes keeps one for every
Node, NodeLayout and slice), unpacked only to announce a deletion a relist found.
Not for: what the events mean (the callback's business), or one-off lists
(``tessera.kube.objects``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from tessera.kube.http import RETRY_BACKOFF, ApiError, KubeClient, resource_path, retry_delay
from tessera.tasks import cancel

log = structlog.get_logger("tessera.kube.watch")

WATCH_IDLE_TIMEOUT_S = 90.0  # see the module head: above the apiserver's ~60 s bookmarks, far below 330 s


def idle_timeout_from_environment() -> float:
    """``TESSERA_IDLE_TIMEOUT`` in seconds, or ``WATCH_IDLE_TIMEOUT_S``; a bad value is refused."""
    text = os.environ.get("TESSERA_IDLE_TIMEOUT")
    if text is None or not text.strip():
        return WATCH_IDLE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"TESSERA_IDLE_TIMEOUT={text!r}: write how many seconds a watch may hear nothing "
                         f"before it is reopened, a number above 0 (default {WATCH_IDLE_TIMEOUT_S:g})")
    return value


class WatchSilentError(Exception):
    """A watch heard neither an event nor a bookmark for its idle bound: its connection is
    taken for dead (half-open) and the watch reopened."""

    def __init__(self, path: str, idle_timeout: float) -> None:
        super().__init__(f"the watch of {path} heard nothing (not even a bookmark) for {idle_timeout:g} s")
        self.path = path
        self.idle_timeout = idle_timeout

OnEvent = Callable[[str, dict[str, Any]], None]  # (ADDED | MODIFIED | DELETED, object)
Stub = Callable[[Mapping[str, Any]], dict[str, Any] | None]  # None: not kept (its deletion is not told)


def without_managed_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """An object as kept in memory: ``metadata.managedFields`` (who wrote which field, often the
    larger part of an object several writers touched) is of no use to what Tessera keeps."""
    meta = body.get("metadata") or {}
    if "managedFields" not in meta:
        return dict(body)
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def metadata_stub(body: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of an object to announce its deletion after a relist: who it was."""
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels") if k in meta}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": kept}


@dataclass(frozen=True, slots=True)
class Seen:
    """What a watch keeps of an object: its resourceVersion, and its stub packed."""

    resource_version: str | None
    packed_stub: bytes

    @classmethod
    def of(cls, body: Mapping[str, Any], stub: Stub) -> Seen | None:
        """What to keep of ``body``; None where its stub says not to keep it."""
        kept = stub(body)
        if kept is None:
            return None
        # A copy: orjson's bytes keep the 4 KiB buffer it wrote into (measured with tracemalloc:
        # 10,000 stubs of ~70 bytes held 40 MB), and a stub is kept as long as its object exists.
        return cls(_version(body), bytes(memoryview(orjson.dumps(kept))))

    def stub(self) -> dict[str, Any]:
        unpacked: dict[str, Any] = orjson.loads(self.packed_stub)
        return unpacked


def _version(body: Mapping[str, Any]) -> str | None:
    version = (body.get("metadata") or {}).get("resourceVersion")
    return None if version is None else str(version)


def _key(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


class ListWatch:
    """Feeds ``on_event`` every change to the objects of one resource (``group`` "" is core)."""

    def __init__(self, client: KubeClient, group: str, version: str, plural: str, on_event: OnEvent, *,
                 label_selector: str | None = None, field_selector: str | None = None,
                 stub: Stub = metadata_stub, timeout_seconds: int = 300,
                 backoff: Sequence[float] = RETRY_BACKOFF, page_size: int = 500,
                 idle_timeout: float | None = None, on_listed: Callable[[], None] | None = None) -> None:
        self.client = client
        self.path = resource_path(group, version, plural)
        self.api_version = f"{group}/{version}" if group else version
        self.on_event = on_event
        self.label_selector = label_selector
        self.field_selector = field_selector  # e.g. metadata.name=<name>: one object
        self.stub = stub
        self.timeout_seconds = timeout_seconds
        self.backoff = tuple(backoff)
        self.page_size = page_size
        self.idle_timeout = idle_timeout_from_environment() if idle_timeout is None else idle_timeout
        self.silences = 0  # how many times a watch was reopened because it heard nothing
        self.bookmarks = 0  # how many bookmarks it heard (what keeps a quiet watch inside its idle bound)
        self.heard_at: float | None = None  # the event loop's time of the last event or bookmark heard
        self.known: dict[str, Seen] = {}  # namespace/name -> the object as last seen
        self.lists = 0  # how many times it listed (the first, then one per 410 Gone)
        self.listed = asyncio.Event()  # set once the first list has been passed on
        # True while a list is being passed on, page by page: the events passed on so far are a
        # part of one snapshot, the rest of the consumer's view is older. A consumer that proves
        # something by an event's place in the stream (a fence's echo) waits for ``on_listed``,
        # called once every object of the list, and every deletion it implies, has been passed on.
        self.relisting = False
        self.on_listed = on_listed
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        selector = f", label_selector={self.label_selector!r}" if self.label_selector else ""
        selector += f", field_selector={self.field_selector!r}" if self.field_selector else ""
        return f"ListWatch({self.path!r}{selector})"

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"tessera-watch {self.path}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def run(self) -> None:
        """List and watch until cancelled."""
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    version = await self._relist()
                loop = asyncio.get_running_loop()
                idle = asyncio.timeout(self.idle_timeout)
                try:
                    async with idle:
                        async for kind, body in self.client.watch(
                            self.path, resource_version=version, label_selector=self.label_selector,
                            field_selector=self.field_selector, timeout_seconds=self.timeout_seconds,
                            bookmarks=True, restart_expired=False,
                        ):
                            self.heard_at = loop.time()
                            idle.reschedule(self.heard_at + self.idle_timeout)
                            failures = 0
                            if kind != "BOOKMARK":
                                self._deliver(kind, body)
                            else:
                                self.bookmarks += 1
                            version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                except TimeoutError:
                    if not idle.expired():  # aiohttp's own read timeout, not the idle bound
                        raise
                    self.silences += 1
                    raise WatchSilentError(self.path, self.idle_timeout) from None
            except asyncio.CancelledError:
                raise
            except WatchSilentError as exc:  # reopened at once: the server is likely fine, the socket not
                log.warning("watch silent; reopening", path=self.path, error=str(exc))
            except ApiError as exc:
                if exc.status == 410:  # too far behind: the truth is a fresh list
                    log.info("watch expired; listing again", path=self.path)
                    version = None
                    continue
                failures = await self._pause(failures, exc)
            except Exception as exc:  # the connection broke, the apiserver went away, a bad line ...
                failures = await self._pause(failures, exc)

    async def _pause(self, failures: int, error: Exception) -> int:
        delay = retry_delay(failures, self.backoff)
        log.warning("watch failed; retrying", path=self.path, error=repr(error), retry_in=delay)
        await asyncio.sleep(delay)
        return failures + 1

    async def _relist(self) -> str:
        """Pass on what changed since the objects were last seen; the list's resourceVersion."""
        seen: dict[str, Seen] = {}
        token: str | None = None
        version = ""
        self.relisting = True
        while True:
            page = await self.client.list_page(self.path, label_selector=self.label_selector,
                                               field_selector=self.field_selector, limit=self.page_size,
                                               continue_=token)
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            kind = str(page.get("kind") or "").removesuffix("List")
            # Passed on page by page, each item let go once passed on: a large first list is never
            # held whole, and a page only until it has been passed on.
            items: list[dict[str, Any]] = page.pop("items", None) or []
            items.reverse()
            while items:
                item = items.pop()
                item.setdefault("apiVersion", self.api_version)  # list items do not say what they are
                item.setdefault("kind", kind)
                key = _key(item)
                entry = Seen.of(item, self.stub)
                if entry is not None:
                    seen[key] = entry
                before = self.known.get(key)
                if before is None or before.resource_version != _version(item):
                    self._call("ADDED" if before is None else "MODIFIED", item)
            token = meta.get("continue")
            if not token:
                break
        gone = [entry for key, entry in self.known.items() if key not in seen]
        self.known = seen
        self.lists += 1
        for entry in gone:
            self._call("DELETED", entry.stub())
        self.relisting = False
        self.listed.set()
        if self.on_listed is not None:
            self.on_listed()
        return version

    def _deliver(self, kind: str, body: dict[str, Any]) -> None:
        key = _key(body)
        entry = None if kind == "DELETED" else Seen.of(body, self.stub)
        if entry is None:
            self.known.pop(key, None)
        else:
            self.known[key] = entry
        self._call(kind, body)

    def _call(self, kind: str, body: dict[str, Any]) -> None:
        try:
            self.on_event(kind, body)
        except Exception:  # a consumer's bug must not stop the watch, nor replay the event forever
            log.exception("watch event handler failed", path=self.path, event_type=kind, object=_key(body))
