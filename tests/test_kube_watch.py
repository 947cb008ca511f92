"""The operator's list-then-watch loop (``tessera.kube.watch.ListWatch``) against a scripted
API: what it passes on after the first list, after a watch ends, after 410 Gone and after errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest

from tessera.kube.http import ApiError, KubeClient
from tessera.kube.watch import WATCH_IDLE_TIMEOUT_S, ListWatch, idle_timeout_from_environment


def obj(name: str, version: int, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(version)}, "spec": spec}


class ScriptedApi:
    """Lists answer with ``objects``; each watch call plays the next script: a list of events,
    then an exception to raise (or None: the server ended the watch)."""

    def __init__(self, objects: list[dict[str, Any]], version: int) -> None:
        self.objects = objects
        self.version = version
        self.scripts: list[tuple[list[tuple[str, dict[str, Any]]], BaseException | None]] = []
        self.lists = 0
        self.watched_from: list[str | None] = []
        self.page_size = 2
        self.before_error: Callable[[], None] = lambda: None  # what changes while the watch is down
        self.quiet = asyncio.Event()  # set once a watch finds no script left: all was passed on

    async def list_page(self, path: str, *, label_selector: str | None = None, limit: int | None = None,
                        continue_: str | None = None, **_: Any) -> dict[str, Any]:
        start = int(continue_ or 0)
        if start == 0:
            self.lists += 1
        end = start + self.page_size
        page = self.objects[start:end]
        more = {"continue": str(end)} if end < len(self.objects) else {}
        return {"kind": "WidgetList", "apiVersion": "example.dev/v1",
                "metadata": {"resourceVersion": str(self.version), **more}, "items": [dict(o) for o in page]}

    async def watch(self, path: str, *, resource_version: str | None = None,
                    **_: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(resource_version)
        if not self.scripts:
            self.quiet.set()
            await asyncio.Event().wait()  # a quiet watch, until cancelled
        events, error = self.scripts.pop(0)
        for event in events:
            yield event
        if error is not None:
            self.before_error()
            raise error


async def run_until(watch: ListWatch, api: ScriptedApi, watches: int, timeout: float = 5) -> None:
    """Run the loop until it has played every script and sits in a quiet watch (so every event
    before it was passed on), having started at least ``watches`` watches."""
    watch.start()
    await asyncio.wait_for(api.quiet.wait(), timeout=timeout)
    assert len(api.watched_from) >= watches
    await watch.stop()


async def test_the_first_list_passes_every_object_on_then_the_watch_starts_at_the_lists_version() -> None:
    api = ScriptedApi([obj("a", 1), obj("b", 2), obj("c", 3)], version=10)
    seen: list[tuple[str, str]] = []
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets",
                      lambda kind, body: seen.append((kind, body["metadata"]["name"])))
    api.scripts.append(([("MODIFIED", obj("b", 11))], None))

    await run_until(watch, api, watches=2)

    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c"), ("MODIFIED", "b")]
    assert api.watched_from[:2] == ["10", "11"], "a watch the server ended resumes where the last event was"
    assert api.lists == 1


async def test_list_items_are_told_what_they_are() -> None:
    api = ScriptedApi([obj("a", 1)], version=5)
    bodies: list[dict[str, Any]] = []
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", lambda _, body: bodies.append(body))

    await run_until(watch, api, watches=1)

    assert bodies[0]["kind"] == "Widget"
    assert bodies[0]["apiVersion"] == "example.dev/v1"


async def test_a_bookmark_moves_the_resume_point_but_is_not_passed_on() -> None:
    api = ScriptedApi([obj("a", 1)], version=5)
    seen: list[str] = []
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", lambda kind, _: seen.append(kind))
    api.scripts.append(([("BOOKMARK", {"metadata": {"resourceVersion": "40"}})], None))

    await run_until(watch, api, watches=2)

    assert seen == ["ADDED"]
    assert api.watched_from[:2] == ["5", "40"]
    assert watch.bookmarks == 1, "counted, as what keeps a quiet watch inside its idle bound"
    assert watch.heard_at is not None


async def test_after_410_gone_a_relist_reports_what_changed_and_what_went_missing_only() -> None:
    api = ScriptedApi([obj("a", 1), obj("b", 2), obj("c", 3)], version=10)
    seen: list[tuple[str, str, dict[str, Any]]] = []
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets",
                      lambda kind, body: seen.append((kind, body["metadata"]["name"], body)),
                      stub=lambda body: {"metadata": dict(body["metadata"]), "spec": {"pool": body["spec"]["pool"]}})
    api.objects = [obj("a", 1, pool="p"), obj("b", 2, pool="p"), obj("c", 3, pool="q")]

    def expire() -> None:
        api.objects = [obj("a", 1, pool="p"), obj("c", 30, pool="q"), obj("d", 31, pool="q")]  # b went
        api.version = 40

    api.before_error = expire
    api.scripts.append(([], ApiError(410, "Expired", "too old")))
    await run_until(watch, api, watches=2)

    after = [(kind, name) for kind, name, _ in seen[3:]]
    assert after == [("MODIFIED", "c"), ("ADDED", "d"), ("DELETED", "b")], "unchanged a is not passed on again"
    deleted = seen[-1][2]
    assert deleted["spec"] == {"pool": "p"}, "a deletion found by a relist carries what the stub kept"
    assert api.lists == 2
    assert api.watched_from[:2] == ["10", "40"]


async def test_a_list_is_marked_as_being_passed_on_until_every_page_and_deletion_is_in() -> None:
    """``relisting`` is true for every event of a list, pages and deletions alike, and
    ``on_listed`` comes after the last of them (a fence's echo is proof only from there)."""
    api = ScriptedApi([obj("a", 1), obj("b", 2), obj("c", 3)], version=10)  # two pages
    seen: list[tuple[str, str, bool]] = []
    watch: ListWatch

    def on_event(kind: str, body: dict[str, Any]) -> None:
        seen.append((kind, body["metadata"]["name"], watch.relisting))

    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", on_event, stub=lambda body: body,
                      on_listed=lambda: seen.append(("LISTED", "", watch.relisting)))

    def expire() -> None:
        api.objects = [obj("a", 1), obj("c", 30)]  # b went
        api.version = 40

    api.before_error = expire
    api.scripts.append(([("MODIFIED", obj("a", 11))], ApiError(410, "Expired", "too old")))
    await run_until(watch, api, watches=2)

    assert seen == [("ADDED", "a", True), ("ADDED", "b", True), ("ADDED", "c", True), ("LISTED", "", False),
                    ("MODIFIED", "a", False),
                    ("MODIFIED", "a", True), ("MODIFIED", "c", True), ("DELETED", "b", True), ("LISTED", "", False)]


async def test_an_error_is_retried_after_a_backoff_from_the_same_version_without_a_relist() -> None:
    api = ScriptedApi([obj("a", 1)], version=7)
    seen: list[str] = []
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", lambda kind, _: seen.append(kind),
                      backoff=[0.01])
    api.scripts.append(([("MODIFIED", obj("a", 8))], ConnectionResetError("the apiserver went away")))
    api.scripts.append(([], ApiError(500, "InternalError", "etcd hiccup")))

    await run_until(watch, api, watches=3)

    assert seen == ["ADDED", "MODIFIED"]
    assert api.watched_from[:3] == ["7", "8", "8"]
    assert api.lists == 1


async def test_a_failing_handler_does_not_stop_the_watch() -> None:
    api = ScriptedApi([obj("a", 1), obj("b", 2)], version=3)
    seen: list[str] = []

    def handler(kind: str, body: dict[str, Any]) -> None:
        if body["metadata"]["name"] == "a":
            raise RuntimeError("a bug")
        seen.append(body["metadata"]["name"])

    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", handler)
    api.scripts.append(([("MODIFIED", obj("b", 4))], None))

    await run_until(watch, api, watches=2)

    assert seen == ["b", "b"]
    assert api.watched_from[:2] == ["3", "4"]


async def test_stop_ends_a_watch_that_is_waiting_for_events() -> None:
    api = ScriptedApi([], version=1)
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", lambda *_: None)
    watch.start()
    await asyncio.wait_for(watch.listed.wait(), 1)
    await asyncio.wait_for(watch.stop(), 1)
    assert watch._task is None


class DribblingApi(ScriptedApi):
    """Its first watch passes on ``events`` one every ``gap`` seconds, then falls silent (as a
    half-open connection does: nothing arrives, nothing ends); every later watch is quiet."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]], gap: float) -> None:
        super().__init__([obj("a", 1)], version=10)
        self.events = events
        self.gap = gap

    async def watch(self, path: str, *, resource_version: str | None = None,
                    **_: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(resource_version)
        if len(self.watched_from) == 1:
            for event in self.events:
                await asyncio.sleep(self.gap)
                yield event
        if len(self.watched_from) >= 3:
            self.quiet.set()
        await asyncio.Event().wait()


async def test_a_watch_that_hears_nothing_for_its_idle_bound_is_reopened_where_it_was() -> None:
    api = DribblingApi([("MODIFIED", obj("a", 11)), ("BOOKMARK", obj("", 12))], gap=0.01)
    seen: list[tuple[str, str]] = []
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets",
                      lambda kind, body: seen.append((kind, body["metadata"]["name"])), idle_timeout=0.2)

    await run_until(watch, api, watches=3)

    assert api.watched_from[:3] == ["10", "12", "12"], "reopened from the last version heard (a bookmark's)"
    assert watch.silences >= 2
    assert api.lists == 1, "a silent watch is reopened, not listed again"
    assert seen == [("ADDED", "a"), ("MODIFIED", "a")]


async def test_a_watch_that_hears_more_often_than_its_bound_is_left_open() -> None:
    events = [("BOOKMARK" if n % 2 else "MODIFIED", obj("a", 11 + n)) for n in range(6)]
    api = DribblingApi(events, gap=0.3)  # 1.8 s in all, never 1 s without a word (margin for a loaded machine)
    watch = ListWatch(cast(KubeClient, api), "example.dev", "v1", "widgets", lambda kind, body: None,
                      idle_timeout=1.0)

    await run_until(watch, api, watches=3, timeout=15)

    assert api.watched_from[:2] == ["10", "16"], "the first watch lasted until its last event, then went silent"
    assert watch.silences >= 2


def test_the_idle_bound_is_90_s_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_IDLE_TIMEOUT", raising=False)
    assert idle_timeout_from_environment() == WATCH_IDLE_TIMEOUT_S == 90
    monkeypatch.setenv("TESSERA_IDLE_TIMEOUT", "12.5")
    assert idle_timeout_from_environment() == 12.5
    assert ListWatch(cast(KubeClient, None), "", "v1", "pods", lambda kind, body: None).idle_timeout == 12.5
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv("TESSERA_IDLE_TIMEOUT", bad)
        with pytest.raises(ValueError, match=f"TESSERA_IDLE_TIMEOUT='{bad}'.*above 0"):
            idle_timeout_from_environment()
