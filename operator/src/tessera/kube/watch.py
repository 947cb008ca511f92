"""A list-then-watch loop that keeps a consumer current on one kind of object, cheaply: every
event goes straight to a callback as the plain dict the API sent (no copies, nothing stored on
the objects, no per-object bookkeeping but a small stub of each object seen).

``ListWatch`` lists (page by page), tells the callback what is new or changed since it last
looked as each page arrives, and what is gone (``DELETED`` with the stub it kept), then
watches from the list's resourceVersion. A watch the server ends is resumed from the last
resourceVersion seen (bookmarks included); one that fell too far behind (410 Gone) is
replaced by a fresh list, so no deletion is missed; any other error is retried after a
backoff. ``stop()`` ends it.

What it keeps of each object is its resourceVersion and its stub as compact JSON (a stub held
as dicts costs about five times as much; an operator at thousands of nodes keeps one for every
Node, NodeLayout and slice), unpacked only to announce a deletion a relist found.
Not for: what the events mean (the callback's business), or one-off lists
(``tessera.kube.objects``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from tessera.kube.http import RETRY_BACKOFF, ApiError, KubeClient, resource_path, retry_delay

log = structlog.get_logger("tessera.kube.watch")

OnEvent = Callable[[str, dict[str, Any]], None]  # (ADDED | MODIFIED | DELETED, object)
Stub = Callable[[Mapping[str, Any]], dict[str, Any] | None]  # None: not kept (its deletion is not told)


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
        return cls(_version(body), json.dumps(kept, separators=(",", ":")).encode())

    def stub(self) -> dict[str, Any]:
        unpacked: dict[str, Any] = json.loads(self.packed_stub)
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
                 backoff: Sequence[float] = RETRY_BACKOFF, page_size: int = 500) -> None:
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
        self.known: dict[str, Seen] = {}  # namespace/name -> the object as last seen
        self.lists = 0  # how many times it listed (the first, then one per 410 Gone)
        self.listed = asyncio.Event()  # set once the first list has been passed on
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
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """List and watch until cancelled."""
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    version = await self._relist()
                async for kind, body in self.client.watch(
                    self.path, resource_version=version, label_selector=self.label_selector,
                    field_selector=self.field_selector, timeout_seconds=self.timeout_seconds, bookmarks=True,
                    restart_expired=False,
                ):
                    failures = 0
                    if kind != "BOOKMARK":
                        self._deliver(kind, body)
                    version = str((body.get("metadata") or {}).get("resourceVersion") or version)
            except asyncio.CancelledError:
                raise
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
        self.listed.set()
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
