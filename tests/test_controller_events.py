"""What the Kopf handlers hand the Controller: each watch event updates the fleet view and
enqueues exactly the nodes it concerns (the handlers themselves only pass events on)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from tessera.controller import runtime
from tessera.controller.decide import NodeDecision
from tessera.controller.nics import NicPublisher
from tessera.controller.publisher import slice_stub
from tessera.controller.runtime import Controller
from tessera.kube.http import ApiError
from tessera.kube.objects import Api
from tessera.kube.outages import Outages
from tessera.models.layout import NodeLayoutSpec
from tests.controller_fleet import NODE, claim_body, layout_body, layout_of, node_body, policy_body
from tests.dra_gpus import gpu, mig_gpu


class RecordingController(Controller):
    """A Controller with no API server that records what it enqueues instead of reconciling."""

    def __init__(self) -> None:
        super().__init__(cast(Api, SimpleNamespace(client=SimpleNamespace(outages=Outages()))))
        self.enqueued: list[str] = []

    def enqueue(self, *nodes: str, bulk: bool = False) -> None:
        self.enqueued.extend(nodes)


def test_a_node_is_enqueued_when_it_appears_or_its_labels_change_and_forgotten_when_deleted() -> None:
    controller = RecordingController()

    controller.node_seen("ADDED", node_body(labels={"pool": "a"}))
    controller.node_seen("MODIFIED", node_body(labels={"pool": "a"}))
    assert controller.enqueued == [NODE], "the same labels again change nothing"

    controller.node_seen("MODIFIED", node_body(labels={"pool": "b"}))
    assert controller.fleet.nodes[NODE].labels == {"pool": "b"}
    controller.node_seen("DELETED", node_body(labels={"pool": "b"}))
    assert controller.enqueued == [NODE, NODE, NODE]
    assert NODE not in controller.fleet.nodes


def test_a_layout_event_records_or_clears_the_layout_and_enqueues_its_node() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    body = layout_body([gpu(0)])

    controller.layout_seen("ADDED", body)
    layout = controller.fleet.nodes[NODE].layout
    assert layout is not None
    assert layout.status is not None
    assert [g.uuid for g in layout.status.gpus] == [gpu(0).uuid]

    controller.layout_seen("DELETED", body)
    assert controller.fleet.nodes[NODE].layout is None
    assert controller.enqueued == [NODE, NODE, NODE]


def test_the_echo_of_a_layout_the_view_already_holds_enqueues_nothing() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    body = layout_body([gpu(0)])
    body["metadata"]["resourceVersion"] = "41"
    controller.fleet.set_layout(body)  # what writing the spec does with the API's answer
    controller.enqueued.clear()

    controller.layout_seen("MODIFIED", body)
    assert controller.enqueued == [], "the same version the view holds: our own write coming back"

    changed = {**body, "metadata": {**body["metadata"], "resourceVersion": "42"}}
    controller.layout_seen("MODIFIED", changed)
    controller.layout_seen("DELETED", changed)
    assert controller.enqueued == [NODE, NODE]


def test_a_claim_event_enqueues_every_node_whose_devices_it_holds_or_held() -> None:
    controller = RecordingController()
    claim = claim_body("c", [("node-b", "gpu-0"), ("node-a", "gpu-1")], pods=["p"])

    controller.claim_seen("ADDED", claim)
    assert controller.enqueued == ["node-a", "node-b"]
    assert "default/c" in controller.fleet.claims

    controller.claim_seen("MODIFIED", claim)
    assert controller.enqueued == ["node-a", "node-b"], "an unchanged allocation concerns no node"

    controller.claim_seen("DELETED", claim)
    assert controller.enqueued == ["node-a", "node-b", "node-a", "node-b"]
    assert controller.fleet.claims == {}


def _with_uid(body: dict[str, Any], uid: str) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": uid}}


def test_a_deleted_claim_never_comes_back_from_a_watch_that_runs_behind() -> None:
    """The ordered claim watch told the deletion first; Kopf's watch, behind it, then brings the
    claim's older events. They are old news: the devices are not held again."""
    controller = RecordingController()
    old = _with_uid(claim_body("c", ["gpu-0"], pods=["p"]), "uid-1")
    controller.claim_seen("ADDED", old)  # Kopf
    controller._claim_gone(old)  # the ordered watch
    assert controller.fleet.claims == {}

    controller.claim_seen("MODIFIED", old)  # Kopf, late
    assert controller.fleet.claims == {}, "a deleted claim was held again"
    assert controller.fleet.holders(NODE) == {}
    controller.claim_seen("DELETED", old)  # Kopf's own deletion changes nothing more
    assert controller.enqueued == [NODE, NODE]

    fleeting = _with_uid(claim_body("d", ["gpu-1"]), "uid-2")
    controller._claim_gone(fleeting)  # created and deleted before Kopf told of either
    controller.claim_seen("ADDED", fleeting)
    assert controller.fleet.claims == {}
    assert controller.enqueued == [NODE, NODE]


def test_the_deletion_of_an_older_claim_leaves_the_newer_claim_of_that_name_holding() -> None:
    controller = RecordingController()
    old = _with_uid(claim_body("c", ["gpu-0"]), "uid-old")
    new = _with_uid(claim_body("c", ["gpu-1"]), "uid-new")
    controller.claim_seen("ADDED", old)
    controller.claim_seen("DELETED", old)  # Kopf: deleted, then created again under the name
    controller.claim_seen("ADDED", new)
    controller._claim_gone(old)  # the ordered watch tells the old deletion late
    held = controller.fleet.claims["default/c"]
    assert held.uid == "uid-new"
    assert controller.fleet.holders(NODE).keys() == {"gpu-1"}

    controller.claim_seen("DELETED", new)
    assert controller.fleet.claims == {}


def test_deleted_claims_are_remembered_for_a_while_not_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    controller = RecordingController()
    now = [1000.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: now[0])
    for i in range(300):
        controller._claim_gone(_with_uid(claim_body(f"c{i}"), f"uid-{i}"))
        now[0] += 1.0
    assert len(controller._deleted_claims) == 300
    now[0] += runtime.DELETED_CLAIM_MEMORY_S
    controller._claim_gone(_with_uid(claim_body("last"), "uid-last"))
    controller._claim_gone(_with_uid(claim_body("last"), "uid-last"))  # told twice: remembered once
    now[0] += 1.0
    for i in range(10):
        controller._claim_gone(_with_uid(claim_body(f"more{i}"), f"uid-more-{i}"))
    assert set(controller._deleted_claims) == {"uid-last"} | {f"uid-more-{i}" for i in range(10)}
    assert list(controller._deleted_claims.values()) == sorted(controller._deleted_claims.values())

    controller.claim_seen("ADDED", _with_uid(claim_body("c0", ["gpu-0"]), "uid-0"))
    assert "default/c0" in controller.fleet.claims, "a uid forgotten is taken at its word"


def test_a_policy_change_decides_every_node_again_and_an_unchanged_one_does_not() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    controller.enqueued.clear()

    controller.policy_seen(policy_body("shared", strategy="TimeSlicing", timeSlicing={"replicas": 4}))
    assert controller.policy_epoch == 1
    assert controller.enqueued == [NODE]

    controller.policy_seen(policy_body("shared", strategy="TimeSlicing", timeSlicing={"replicas": 4}))
    assert controller.policy_epoch == 1, "a resumed policy asking for the same is no change"

    controller.policy_deleted("shared")
    assert "shared" not in controller.fleet.policies
    assert controller.policy_epoch == 2
    assert controller.enqueued == [NODE, NODE]


def test_a_slice_deletion_found_by_a_relist_still_names_its_node() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    body = slice_body(NODE)
    controller.slice_seen("ADDED", body)
    assert list(controller.publisher.slices[NODE]) == [f"{NODE}-tessera-gpus"]

    controller.slice_seen("DELETED", slice_stub(body))  # all a relist keeps of a slice that went

    assert controller.publisher.slices[NODE] == {}
    assert controller.enqueued == [NODE, NODE, NODE]


def test_a_slice_of_a_node_the_operator_does_not_know_is_kept_but_enqueues_nothing() -> None:
    controller = RecordingController()
    controller.slice_seen("ADDED", slice_body("node-unknown"))
    assert controller.enqueued == []
    assert list(controller.publisher.slices) == ["node-unknown"], "kept: at start, it is an orphan to delete"


def test_the_echo_of_a_slice_the_controller_wrote_enqueues_nothing() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    body = slice_body(NODE)
    controller.slice_seen("ADDED", body)
    controller.slice_seen("MODIFIED", body)
    assert controller.enqueued == [NODE, NODE], "the same resourceVersion again is no change"


def slice_body(pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-tessera-gpus", "uid": "u1", "resourceVersion": "5"},
        "spec": {"driver": "gpu.tessera.dev", "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }


async def test_the_answer_to_a_spec_write_never_replaces_a_newer_layout_the_watch_brought_meanwhile() -> None:
    """The agent can apply our spec and report its new status before our write's answer is
    handled; the view must keep that status, not go back to the one the answer carries."""
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    before = layout_body([gpu(0)], [layout_of(gpu(0))])
    before["metadata"]["resourceVersion"] = "10"
    controller.layout_seen("MODIFIED", before)
    decided_on = controller.fleet.nodes[NODE].layout
    assert decided_on is not None
    wanted = NodeLayoutSpec(gpus=[layout_of(mig_gpu(0))])
    answer = layout_body([gpu(0)], wanted.gpus, generation=2)  # our spec, the status as it was
    answer["metadata"]["resourceVersion"] = "11"
    applied = layout_body([mig_gpu(0)], wanted.gpus, generation=2, observed_generation=2)  # the agent's report
    applied["metadata"]["resourceVersion"] = "12"

    async def patch_node_layout_spec(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        controller.layout_seen("MODIFIED", answer)  # the watch, in order, is faster than our answer
        controller.layout_seen("MODIFIED", applied)
        return answer

    controller.api = cast(Api, SimpleNamespace(patch_node_layout_spec=patch_node_layout_spec))
    decision = cast(NodeDecision, SimpleNamespace(spec=wanted))

    controller.enqueued.clear()
    assert await controller._write_spec(NODE, decided_on, decision) == 2
    layout = controller.fleet.nodes[NODE].layout
    assert layout is not None
    assert layout.metadata.resource_version == "12", "the newer report stays"
    assert layout.status is not None
    assert layout.status.gpus[0].mig_instances
    assert controller.enqueued == [NODE], "the agent's report is someone else's change: once, when we are answered"


async def test_the_echo_of_our_spec_write_that_overtakes_the_answer_enqueues_nothing() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    before = layout_body([gpu(0)], [layout_of(gpu(0))])
    before["metadata"]["resourceVersion"] = "10"
    controller.layout_seen("MODIFIED", before)
    decided_on = controller.fleet.nodes[NODE].layout
    assert decided_on is not None
    wanted = NodeLayoutSpec(gpus=[layout_of(mig_gpu(0))])
    answer = layout_body([gpu(0)], wanted.gpus, generation=2)
    answer["metadata"]["resourceVersion"] = "11"

    async def patch_node_layout_spec(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        controller.layout_seen("MODIFIED", answer)  # our echo, before our answer
        return answer

    controller.api = cast(Api, SimpleNamespace(patch_node_layout_spec=patch_node_layout_spec))
    controller.enqueued.clear()
    assert await controller._write_spec(NODE, decided_on, cast(NodeDecision, SimpleNamespace(spec=wanted))) == 2
    assert controller.enqueued == []
    layout = controller.fleet.nodes[NODE].layout
    assert layout is not None
    assert layout.metadata.resource_version == "11"
    controller.layout_seen("MODIFIED", answer)
    assert controller.enqueued == [], "and when it comes again (a relist), the view holds it already"


async def test_a_list_at_start_is_tried_again_until_the_apiserver_answers(monkeypatch: Any) -> None:
    """An operator started while the apiserver is away waits for it (short backoff) instead of
    failing its start, which Kopf would retry only a minute later."""
    from tessera.controller import runtime

    monkeypatch.setattr(runtime, "retry_delay", lambda attempt: 0.0)
    answers: list[Any] = [ConnectionRefusedError("apiserver away"), OSError("still away"), [policy_body("p")]]

    async def list_all(*resource: str) -> list[dict[str, Any]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return cast(list[dict[str, Any]], answer)

    controller = RecordingController()
    controller.api = cast(Api, SimpleNamespace(list_all=list_all))
    assert await controller._list_until_answered(("tessera.dev", "v1alpha1", "sharingpolicies")) == [policy_body("p")]
    assert answers == []


async def test_a_spec_write_that_fails_still_hands_on_what_the_watch_brought_meanwhile() -> None:
    controller = RecordingController()
    controller.node_seen("ADDED", node_body())
    before = layout_body([gpu(0)], [layout_of(gpu(0))])
    before["metadata"]["resourceVersion"] = "10"
    controller.layout_seen("MODIFIED", before)
    decided_on = controller.fleet.nodes[NODE].layout
    assert decided_on is not None
    reported = layout_body([gpu(0)], [layout_of(gpu(0))], observed_generation=1)
    reported["metadata"]["resourceVersion"] = "11"

    async def patch_node_layout_spec(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        controller.layout_seen("MODIFIED", reported)  # the agent's status, while we write
        raise ApiError(500, "InternalError", "etcd away")

    controller.api = cast(Api, SimpleNamespace(patch_node_layout_spec=patch_node_layout_spec))
    controller.enqueued.clear()
    wanted = NodeLayoutSpec(gpus=[layout_of(mig_gpu(0))])
    with pytest.raises(ApiError):
        await controller._write_spec(NODE, decided_on, cast(NodeDecision, SimpleNamespace(spec=wanted)))
    assert controller.enqueued == [NODE]


def test_a_room_that_shares_the_watches_gets_every_node_and_layout_event_the_controller_gets() -> None:
    """The NIC room reads Nodes and NodeLayouts from the GPU room's watches (one watch, one
    decode of the cluster's largest objects): every event reaches it, deletions included, and
    what it makes of them is what its own watches would have made."""
    controller = RecordingController()
    nics = NicPublisher(cast(Api, SimpleNamespace(client=None)))
    controller.share_watches(nics.node_seen, nics.layout_seen)
    reported = [{"interface": "eth1", "pciBusId": "0000:3b:00.0", "speedMbps": 40000, "pcieRoot": "pci0000:3a"}]

    controller.node_seen("ADDED", node_body(labels={"pool": "a"}))
    body = layout_body([gpu(0)])
    body["status"]["nics"] = reported
    controller.layout_seen("ADDED", body)

    assert NODE in nics.nodes
    assert nics.nodes[NODE].labels == {"pool": "a"}
    assert [n.interface for n in nics.nics[NODE]] == ["eth1"]
    assert controller.fleet.nodes[NODE].layout is not None, "the controller's own view is fed as before"

    controller.layout_seen("DELETED", body)
    assert nics.nics[NODE] == []
    controller.node_seen("DELETED", node_body())
    assert NODE not in nics.nodes


def test_a_room_that_fails_on_a_shared_event_does_not_keep_it_from_the_controller() -> None:
    controller = RecordingController()

    def failing(kind: str, body: Any) -> None:
        raise KeyError("status")

    controller.share_watches(failing, failing)
    controller.node_seen("ADDED", node_body())
    controller.layout_seen("ADDED", layout_body([gpu(0)]))

    assert controller.fleet.nodes[NODE].layout is not None
    assert controller.enqueued == [NODE, NODE]
