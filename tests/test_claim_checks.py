"""The operator answers agents' claim checks (tessera.controller.claimchecks) and the agent takes
only the answer to its own ask (tessera.agent.claimview, asking): without a server. The race
against the real apiserver is tests/integration/test_agent_claimguard.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from tessera import DRIVER_NAME
from tessera.agent.claimguard import allocated_devices_on_node
from tessera.agent.claimview import ClaimView, FenceError, fence_claim_name
from tessera.controller.claimchecks import ClaimChecks
from tessera.controller.freshclaims import FreshClaims
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

    def __init__(self, fail: int = 0, status: int = 500) -> None:
        self.sent: list[tuple[str, ClaimCheckAnswer]] = []
        self.fail = fail
        self.status = status

    async def __call__(self, namespace: str, name: str, answer: str) -> None:
        if self.fail:
            self.fail -= 1
            raise ApiError(self.status, "Failure", "refused")
        self.sent.append((name, ClaimCheckAnswer.decode(answer)))


async def test_asks_are_answered_from_one_list_started_after_they_arrived_with_each_nodes_own_claims() -> None:
    lists: list[float] = []

    async def listing() -> list[dict[str, Any]]:
        lists.append(time.monotonic())
        return [claim_body("a", [("node-a", "gpu-0"), ("node-b", "gpu-1")]), claim_body("b", [("node-b", "gpu-2")])]

    leading, answers = asyncio.Event(), Answers()
    checks = ClaimChecks(FreshClaims(listing), answers, NS, leading, retry_after=0.01)
    running = asyncio.create_task(checks.run())
    try:
        checks.seen("ADDED", fence("node-x", "t-1", namespace="elsewhere"))  # not the install's namespace
        checks.seen("ADDED", {"metadata": {"namespace": NS, "name": "unrelated"}})
        arrived = time.monotonic()
        checks.seen("MODIFIED", fence("node-a", "a-1"))
        checks.seen("MODIFIED", fence("node-b", "b-7"))
        checks.seen("MODIFIED", fence("node-c", "c-1", answer=ClaimCheckAnswer.of("c-1", "node-c", ()).encode()))
        await asyncio.sleep(0.05)
        assert answers.sent == [], "a standby answers nothing"

        leading.set()
        await wait_for(lambda: len(answers.sent) == 2, timeout=5, interval=0.005)
        assert len(lists) == 1, "one list for the asks that arrived together"
        assert lists[0] >= arrived, "started after the asks arrived"
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
        assert answers.sent[-1][1].token == "a-2"
        assert len(lists) == 2, "a later ask gets a list started after it"
    finally:
        running.cancel()


async def test_an_answer_that_fails_is_sent_again_and_one_for_a_deleted_fence_is_dropped() -> None:
    async def listing() -> list[dict[str, Any]]:
        return []

    leading = asyncio.Event()
    leading.set()
    answers = Answers(fail=2)
    checks = ClaimChecks(FreshClaims(listing), answers, NS, leading, retry_after=0.01)
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
    view.feed("MODIFIED", claim_body("mine", [("node-a", "gpu-0")]))  # a shared watch's event: not kept
    assert view.held() == []

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
