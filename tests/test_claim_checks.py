"""The operator answers agents' claim checks (tessera.controller.claimchecks) and the agent takes
only the answer to its own ask (tessera.agent.claimview, asking): without a server. The race
against the real apiserver is tests/integration/test_agent_claimguard.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tessera import DRIVER_NAME
from tessera.agent.claimguard import allocated_devices_on_node
from tessera.agent.claimview import ClaimView, FenceError, fence_claim_name
from tessera.controller.claimchecks import ClaimChecks
from tessera.kube.claims import ANSWER_ANNOTATION, ASK_ANNOTATION, NODE_ANNOTATION
from tessera.kube.http import ApiError, KubeClient
from tessera.localcluster.cluster import wait_for
from tessera.models.claimcheck import AnswerError, ClaimCheckAnswer
from tests.controller_fleet import claim_body

NS = "tessera-system"


def fence(node: str, ask: str | None, answer: str | None = None, namespace: str = NS) -> dict[str, Any]:
    annotations = {NODE_ANNOTATION: node}
    if ask is not None:
        annotations[ASK_ANNOTATION] = ask
    if answer is not None:
        annotations[ANSWER_ANNOTATION] = answer
    return {"metadata": {"namespace": namespace, "name": fence_claim_name(node), "annotations": annotations}}


def test_an_answer_round_trips_names_only_held_devices_and_reads_as_claims() -> None:
    answer = ClaimCheckAnswer.of("b-3", "node-a", [("ml/a", ["gpu-1", "gpu-0"]), ("ml/none", [])])
    assert answer.claims == {"ml/a": ("gpu-0", "gpu-1")}, "a claim holding nothing here is left out"
    assert ClaimCheckAnswer.decode(answer.encode()) == answer
    held = allocated_devices_on_node(answer.as_claims(DRIVER_NAME), DRIVER_NAME, "node-a")
    assert [(c.claim, c.device) for c in held] == [("ml/a", "gpu-0"), ("ml/a", "gpu-1")]
    for bad in ("", "[]", '{"token": "t", "node": "n"}', '{"token": "t", "node": "n", "claims": {"a": "gpu-0"}}'):
        with pytest.raises(AnswerError, match="not a claim check answer"):
            ClaimCheckAnswer.decode(bad)


class Answers:
    """The operator's writes of answers, as they reach the apiserver."""

    def __init__(self, fail: int = 0, status: int = 500, delay: float = 0.0) -> None:
        self.sent: list[tuple[str, ClaimCheckAnswer]] = []
        self.fail = fail
        self.status = status
        self.delay = delay

    async def __call__(self, namespace: str, name: str, answer: str) -> None:
        await asyncio.sleep(self.delay)
        if self.fail:
            self.fail -= 1
            raise ApiError(self.status, "Failure", "refused")
        self.sent.append((name, ClaimCheckAnswer.decode(answer)))


def checks_with(answers: Answers, leading: asyncio.Event) -> ClaimChecks:
    return ClaimChecks(cast(KubeClient, object()), answers, NS, leading, retry_after=0.01)


async def test_an_ask_is_answered_with_the_claims_the_watch_passed_on_before_it() -> None:
    """The answer is what the ordered watch holds when the ask comes by: claims before it are
    in, a claim after it is not, a deallocated or deleted one is gone; each node gets its own
    devices; a standby answers only once it leads; an answered ask is not answered again."""
    leading, answers = asyncio.Event(), Answers()
    checks = checks_with(answers, leading)
    running = asyncio.create_task(checks.run())
    try:
        checks.seen("ADDED", claim_body("a", [("node-a", "gpu-0"), ("node-b", "gpu-1")]))
        checks.seen("ADDED", claim_body("b", [("node-b", "gpu-2")]))
        checks.seen("ADDED", claim_body("gone", [("node-a", "gpu-5")]))
        checks.seen("MODIFIED", claim_body("gone"))  # deallocated
        checks.seen("ADDED", claim_body("deleted", [("node-b", "gpu-7")]))
        checks.seen("DELETED", claim_body("deleted", [("node-b", "gpu-7")]))
        checks.seen("ADDED", fence("node-x", "x-1", namespace="elsewhere"))  # not the install's namespace
        checks.seen("MODIFIED", fence("node-a", "a-1"))
        checks.seen("MODIFIED", fence("node-b", "b-7"))
        checks.seen("ADDED", claim_body("later", [("node-a", "gpu-3")]))  # after the asks: not in their answers
        checks.seen("MODIFIED", fence("node-c", "c-1", answer=ClaimCheckAnswer.of("c-1", "node-c", ()).encode()))
        await asyncio.sleep(0.05)
        assert answers.sent == [], "a standby answers nothing"

        leading.set()
        await wait_for(lambda: len(answers.sent) == 2, timeout=5, interval=0.005)
        by_node = {a.node: a for _, a in answers.sent}
        assert by_node["node-a"] == ClaimCheckAnswer("a-1", "node-a", {"default/a": ("gpu-0",)})
        assert by_node["node-b"] == ClaimCheckAnswer("b-7", "node-b",
                                                     {"default/a": ("gpu-1",), "default/b": ("gpu-2",)})
        assert sorted(name for name, _ in answers.sent) == [fence_claim_name("node-a"), fence_claim_name("node-b")]

        checks.seen("MODIFIED", fence("node-a", "a-1", answer=by_node["node-a"].encode()))  # the answer's echo
        await asyncio.sleep(0.05)
        assert len(answers.sent) == 2, "an answered ask is not answered again"
        checks.seen("MODIFIED", fence("node-a", "a-2", answer=by_node["node-a"].encode()))
        await wait_for(lambda: len(answers.sent) == 3, timeout=5, interval=0.005)
        assert answers.sent[-1][1] == ClaimCheckAnswer("a-2", "node-a", {"default/a": ("gpu-0",),
                                                                          "default/later": ("gpu-3",)})
        assert checks.answered == 3
    finally:
        running.cancel()


async def test_an_ask_seen_while_the_watch_passes_a_list_on_is_answered_once_the_list_is_in() -> None:
    leading, answers = asyncio.Event(), Answers()
    leading.set()
    checks = checks_with(answers, leading)
    running = asyncio.create_task(checks.run())
    try:
        checks.watch.relisting = True  # a list, page by page: the ask came on an early page
        checks.seen("ADDED", fence("node-a", "a-1"))
        checks.seen("ADDED", claim_body("on-a-later-page", [("node-a", "gpu-0")]))
        await asyncio.sleep(0.05)
        assert answers.sent == [], "no answer from half a list"
        checks.watch.relisting = False
        checks.listed()
        await wait_for(lambda: answers.sent, timeout=5, interval=0.005)
        assert answers.sent[0][1].claims == {"default/on-a-later-page": ("gpu-0",)}
    finally:
        running.cancel()


async def test_failed_answers_are_written_again_one_for_a_deleted_fence_is_dropped_and_the_latest_lands_last() -> None:
    leading = asyncio.Event()
    leading.set()
    answers = Answers(fail=2)
    checks = checks_with(answers, leading)
    running = asyncio.create_task(checks.run())
    try:
        checks.seen("MODIFIED", fence("node-a", "a-1"))
        await wait_for(lambda: answers.sent, timeout=5, interval=0.005)
        assert answers.sent == [(fence_claim_name("node-a"), ClaimCheckAnswer("a-1", "node-a", {}))]

        gone = Answers(fail=1, status=404)
        checks._answer = gone
        checks.seen("MODIFIED", fence("node-b", "b-1"))
        await wait_for(lambda: not checks._open, timeout=5, interval=0.005)
        await asyncio.sleep(0.05)
        assert gone.sent == [], "a fence claim deleted meanwhile is not answered again"
        assert checks.answered == 1

        slow = Answers(delay=0.05)
        checks._answer = slow
        checks.seen("MODIFIED", fence("node-c", "c-1"))
        await asyncio.sleep(0.01)  # c-1's answer is being written
        checks.seen("MODIFIED", fence("node-c", "c-2"))
        await wait_for(lambda: len(slow.sent) == 2, timeout=5, interval=0.005)
        assert [a.token for _, a in slow.sent] == ["c-1", "c-2"], "the later ask's answer is written last"
    finally:
        running.cancel()


class FenceApi:
    """A fake API for one agent's ClaimView: records asks; ``answer`` is how the operator replies."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.view: ClaimView | None = None
        self.reply: Any = None  # (token) -> the fence claim event the view is fed, or None

    async def patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        token = body["metadata"]["annotations"][ASK_ANNOTATION]
        assert body["metadata"]["annotations"][NODE_ANNOTATION] == "node-a"
        self.asked.append(token)
        if self.reply is not None and self.view is not None:
            event = self.reply(token)
            if event is not None:
                asyncio.get_running_loop().call_later(0.01, self.view.feed, "MODIFIED", event)
        return {}


async def test_the_agent_takes_only_the_answer_to_its_own_latest_ask() -> None:
    api = FenceApi()
    view = ClaimView(cast(KubeClient, api), driver=DRIVER_NAME, node="node-a", fence_namespace=NS,
                     timeout_s=0.3, own_watch=False)
    api.view = view
    with pytest.raises(FenceError, match="no pass has chosen"):
        await view.fresh()
    await view.use(asking=True)
    view.feed("MODIFIED", claim_body("mine", [("node-a", "gpu-0")]))  # a shared watch's event
    assert view.held() == [], "an agent that asks reads the operator's answer, not a watch"

    def answer(token: str, node: str = "node-a", claims: dict[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
        text = ClaimCheckAnswer(token, node, claims if claims is not None else {"ml/a": ("gpu-3",)}).encode()
        return fence("node-a", token, answer=text)

    api.reply = answer
    held = await view.fresh()
    assert [(c.claim, c.device) for c in allocated_devices_on_node(held, DRIVER_NAME, "node-a")] == [("ml/a", "gpu-3")]
    assert view.asks == 1
    assert view.claim_copy("ml", "a") is None, "an agent that asks keeps no copies: the plugin reads the claim"

    for wrong in (lambda t: answer(t, node="node-b"),  # another node's
                  lambda t: answer("0123456789ab-" + t.partition("-")[2]),  # an earlier agent's on this node
                  lambda t: answer(t.partition("-")[0] + "-1")):  # the earlier ask's, again
        api.reply = wrong
        with pytest.raises(FenceError, match="the operator did not answer"):
            await view.fresh()
    api.reply = None
    with pytest.raises(FenceError, match=r"is the Tessera operator running, and leading\?"):
        await view.fresh()
    assert len(api.asked) == 5
    assert len(set(api.asked)) == 5, "a new token for every ask"


def test_every_claim_deletion_the_watch_passes_on_is_told_and_the_claims_it_keeps_stubs_of() -> None:
    """``gone`` hears each claim deletion the ordered watch passes on (those a relist finds too:
    Kopf's watch says nothing of those), not a fence claim's; the watch keeps a stub (what a
    relist needs to find a deletion) of every claim the operator's view holds: holding a
    device, or waiting for one of Tessera's classes."""
    told: list[str] = []
    checks = ClaimChecks(cast(KubeClient, object()), Answers(), NS, asyncio.Event(),
                         gone=lambda body: told.append(body["metadata"]["name"]))
    held, pending = claim_body("held", [("node-a", "gpu-0")]), claim_body("pending")
    pending["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}}
    other = claim_body("other")
    other["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "someone-else"}}]}}

    assert checks._stub(held) is not None
    assert checks._stub(pending) is not None
    assert checks._stub(other) is None, "not in the operator's view: nothing to forget"
    assert checks._stub(fence("node-a", "a-1")) is not None

    checks.seen("DELETED", held)
    checks.seen("DELETED", pending)
    checks.seen("DELETED", fence("node-a", "a-1"))
    checks.seen("MODIFIED", other)
    assert told == ["held", "pending"]
