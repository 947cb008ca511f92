"""The operator's in-memory view: what a ResourceClaim holds of ours, which nodes a watch
event touches, and how Nodes, NodeLayouts and policies arrive in any order."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import DRIVER_NAME
from tessera.controller.state import ClaimHold, Fleet, Holds, claim_hold
from tests.controller_fleet import NODE, claim_body, layout_body, node_body, policy_body
from tests.dra_gpus import gpu, mig_gpu

# -- claim_hold --------------------------------------------------------------------------


def test_claim_hold_reads_our_devices_and_the_pods_it_is_reserved_for() -> None:
    body = claim_body(
        "train",
        ["gpu-0", ("node-2", "gpu-1-mig-3g-40gb-0")],
        namespace="ml",
        pods=["worker-b", "worker-a"],
    )
    body["status"]["reservedFor"].append({"resource": "jobs", "apiGroup": "batch", "name": "a-job", "uid": "j"})

    hold = claim_hold(body)

    assert hold == ClaimHold(
        namespace="ml",
        name="train",
        devices=frozenset({(NODE, "gpu-0"), ("node-2", "gpu-1-mig-3g-40gb-0")}),
        pods=(("ml", "worker-a"), ("ml", "worker-b")),  # sorted; only Pods, in the claim's namespace
    )
    assert hold.key == "ml/train"


def test_claim_hold_ignores_devices_of_other_drivers() -> None:
    body = claim_body("mixed", ["gpu-0"])
    body["status"]["allocation"]["devices"]["results"].append(
        {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth-0"}
    )

    hold = claim_hold(body)

    assert hold is not None
    assert hold.devices == frozenset({(NODE, "gpu-0")})


def test_claim_hold_is_none_for_a_claim_holding_only_other_drivers_devices() -> None:
    assert claim_hold(claim_body("other", ["gpu-0"], driver="gpu.nvidia.com", pods=["p"])) is None


@pytest.mark.parametrize(
    "status",
    [
        None,
        {},
        {"allocation": None},
        {"allocation": {"devices": {"results": []}}},
        {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]},
    ],
    ids=["no-status", "empty-status", "null-allocation", "no-results", "reserved-but-unallocated"],
)
def test_claim_hold_is_none_for_an_unallocated_claim(status: dict[str, object] | None) -> None:
    body = {"metadata": {"name": "pending", "namespace": "default"}, "spec": {}, "status": status}

    assert claim_hold(body) is None


def test_claim_hold_skips_a_result_without_a_device() -> None:
    body = claim_body("odd", ["gpu-0"])
    body["status"]["allocation"]["devices"]["results"].append({"request": "gpu", "driver": DRIVER_NAME, "pool": NODE})

    hold = claim_hold(body)

    assert hold is not None
    assert hold.devices == frozenset({(NODE, "gpu-0")})


def test_an_admin_access_result_holds_nothing() -> None:
    body = claim_body("monitor", ["gpu-0", "gpu-1"], pods=["dcgm"])
    body["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True

    hold = claim_hold(body)

    assert hold is not None
    assert hold.devices == frozenset({(NODE, "gpu-1")}), "only the result without admin access holds its device"
    for result in body["status"]["allocation"]["devices"]["results"]:
        result["adminAccess"] = True
    assert claim_hold(body) is None


# -- set_claim / remove_claim ---------------------------------------------------------------


def test_set_claim_returns_the_node_of_a_new_allocation() -> None:
    fleet = Fleet()

    assert fleet.set_claim(claim_body("c", ["gpu-0"])) == {NODE}
    assert set(fleet.claims) == {"default/c"}


def test_set_claim_returns_nothing_when_the_hold_is_unchanged() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", ["gpu-0"], pods=["p"]))

    assert fleet.set_claim(claim_body("c", ["gpu-0"], pods=["p"])) == set()


def test_set_claim_returns_the_node_when_the_reserved_pods_change() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", ["gpu-0"], pods=["p"]))

    assert fleet.set_claim(claim_body("c", ["gpu-0"], pods=["p", "q"])) == {NODE}
    assert fleet.claims["default/c"].pods == (("default", "p"), ("default", "q"))


def test_set_claim_returns_both_nodes_when_an_allocation_moves() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", [(NODE, "gpu-0")]))

    assert fleet.set_claim(claim_body("c", [("node-2", "gpu-0")])) == {NODE, "node-2"}


def test_set_claim_returns_the_old_node_when_the_allocation_goes() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", ["gpu-0"]))

    assert fleet.set_claim(claim_body("c")) == {NODE}
    assert fleet.claims == {}


def test_set_claim_ignores_claims_that_never_held_our_devices() -> None:
    fleet = Fleet()

    assert fleet.set_claim(claim_body("c")) == set()
    assert fleet.set_claim(claim_body("c", ["gpu-0"], driver="gpu.nvidia.com")) == set()
    assert fleet.claims == {}


def test_claims_of_the_same_name_in_two_namespaces_are_kept_apart() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", ["gpu-0"], namespace="a"))
    fleet.set_claim(claim_body("c", ["gpu-1"], namespace="b"))

    assert fleet.remove_claim("a", "c") == {NODE}
    assert set(fleet.claims) == {"b/c"}


def test_remove_claim_returns_the_nodes_it_held_devices_on() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("c", [(NODE, "gpu-0"), ("node-2", "gpu-3")]))

    assert fleet.remove_claim("default", "c") == {NODE, "node-2"}
    assert fleet.remove_claim("default", "c") == set()


def test_holders_lists_the_claims_on_each_device_of_one_node() -> None:
    fleet = Fleet()
    fleet.set_claim(claim_body("a", ["gpu-0", ("node-2", "gpu-1")]))
    fleet.set_claim(claim_body("b", ["gpu-0", "gpu-1"]))

    holders = fleet.holders(NODE)

    assert {device: sorted(h.key for h in holds) for device, holds in holders.items()} == {
        "gpu-0": ["default/a", "default/b"],
        "gpu-1": ["default/b"],
    }
    assert fleet.holders("node-3") == {}


def _brute_holders(holds: list[ClaimHold], node: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for hold in holds:
        for pool, device in hold.devices:
            if pool == node:
                out[device].add(hold.key)
    return dict(out)


POOLS = ("node-a", "node-b", "node-c")
STEP = st.tuples(
    st.sampled_from(["set", "remove"]),
    st.sampled_from(["c1", "c2", "c3", "c4"]),
    st.lists(st.tuples(st.sampled_from(POOLS), st.sampled_from(["gpu-0", "gpu-1"])), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(STEP, max_size=25), fresh=st.lists(STEP, max_size=5))
def test_holders_by_the_pool_index_equal_a_scan_of_every_claim(
    steps: list[tuple[str, str, list[tuple[str, str]]]], fresh: list[tuple[str, str, list[tuple[str, str]]]]
) -> None:
    """Claims allocated, moved, released and deleted in any order: each node's holders (the
    watch's view, indexed by pool, and a fresh list's ``Holds``) are what a scan of every claim
    finds, and a fleet built from a dict of claims indexes them too; so is each node's count of
    devices held (the fleet metrics')."""
    fleet = Fleet()
    for verb, name, devices in steps:
        if verb == "set":
            fleet.set_claim(claim_body(name, devices))
        else:
            fleet.remove_claim("default", name)
    read = Holds(h for _, name, devices in fresh if (h := claim_hold(claim_body(f"fresh-{name}", devices))))
    copy = Fleet(claims=dict(fleet.claims))
    for node in POOLS:
        want = _brute_holders([*fleet.claims.values(), *read], node)
        for view in (fleet, copy):
            got = {device: {h.key for h in holds} for device, holds in view.holders(node, read).items()}
            assert got == want
        assert {device: {h.key for h in holds} for device, holds in fleet.holders(node, list(read)).items()} == want
        held = {device for hold in fleet.claims.values() for pool, device in hold.devices if pool == node}
        assert fleet.devices_held(node) == copy.devices_held(node) == len(held)


# -- Nodes, NodeLayouts, policies ---------------------------------------------------------------


def test_set_node_says_whether_the_labels_changed() -> None:
    fleet = Fleet()

    assert fleet.set_node(node_body(labels={"pool": "a"})) is True  # a new node
    assert fleet.set_node(node_body(labels={"pool": "a"})) is False
    assert fleet.set_node(node_body(labels={"pool": "b"})) is True
    assert fleet.nodes[NODE].labels == {"pool": "b"}


def test_set_node_keeps_the_uid_up_to_date() -> None:
    fleet = Fleet()
    fleet.set_node(node_body(uid="first"))

    assert fleet.set_node(node_body(uid="second")) is False
    assert fleet.nodes[NODE].uid == "second"


def test_a_layout_seen_before_its_node_is_attached_when_the_node_arrives() -> None:
    fleet = Fleet()
    fleet.set_layout(layout_body([gpu(0)]))

    assert fleet.gpu_nodes() == []
    fleet.set_node(node_body())

    layout = fleet.nodes[NODE].layout
    assert layout is not None
    assert layout.status is not None
    assert [g.uuid for g in layout.status.gpus] == [gpu(0).uuid]
    assert fleet.layouts == {}


def test_an_unreadable_layout_before_its_node_replaces_the_one_seen_before() -> None:
    fleet = Fleet()
    fleet.set_layout(layout_body([gpu(0)]))
    broken = layout_body([gpu(0)])
    broken["spec"] = {"gpus": [{"uuid": "GPU-x", "strategy": "Sideways"}]}

    fleet.set_layout(broken)
    fleet.set_node(node_body())

    assert fleet.nodes[NODE].layout is None  # not the stale layout from before


def test_an_unreadable_layout_is_recorded_with_what_was_wrong() -> None:
    fleet = Fleet()
    fleet.set_node(node_body())
    broken = layout_body([gpu(0)])
    broken["spec"] = {"gpus": [{"uuid": "GPU-x", "strategy": "Sideways"}]}

    assert fleet.set_layout(broken) == NODE

    view = fleet.nodes[NODE]
    assert view.layout is None
    assert view.layout_error is not None
    assert "spec.gpus.0.strategy" in view.layout_error

    fleet.set_layout(layout_body([gpu(0)]))
    assert view.layout is not None
    assert view.layout_error is None


def test_an_unreadable_layout_keeps_the_last_one_that_could_be_read() -> None:
    fleet = Fleet()
    fleet.set_node(node_body())
    fleet.set_layout(layout_body([gpu(0)]))
    good = fleet.nodes[NODE].layout
    broken = layout_body([gpu(0)])
    broken["status"] = {"gpus": "not a list"}

    fleet.set_layout(broken)

    view = fleet.nodes[NODE]
    assert view.layout is good, "never 'no layout', which would unpublish the node's devices"
    assert view.layout_error is not None


def test_removing_a_layout_forgets_it_and_its_error() -> None:
    fleet = Fleet()
    fleet.set_node(node_body())
    broken = layout_body([gpu(0)])
    broken["status"] = {"gpus": "not a list"}
    fleet.set_layout(broken)

    fleet.remove_layout(NODE)

    assert fleet.nodes[NODE].layout is None
    assert fleet.nodes[NODE].layout_error is None


def test_gpu_nodes_are_the_nodes_with_a_layout_sorted_by_name() -> None:
    fleet = Fleet()
    for name in ("node-c", "node-a", "node-b"):
        fleet.set_node(node_body(name))
    for name in ("node-c", "node-a"):
        fleet.set_layout(layout_body([gpu(0)], node=name))

    assert [v.name for v in fleet.gpu_nodes()] == ["node-a", "node-c"]


def test_remove_node_forgets_that_node_only() -> None:
    fleet = Fleet()
    for name in (NODE, "node-2"):
        fleet.set_node(node_body(name))

    fleet.remove_node(NODE)

    assert set(fleet.nodes) == {"node-2"}


def test_an_invalid_policy_is_recorded_as_an_error_until_it_is_fixed() -> None:
    fleet = Fleet()
    fleet.set_policy(policy_body("p", strategy="MIG"))  # MIG without spec.mig

    assert "p" not in fleet.policies
    assert "strategy MIG needs spec.mig" in fleet.policy_errors["p"]
    assert "p" in fleet.policy_bodies  # kept, so its status can still be written

    fleet.set_policy(policy_body("p", generation=2, strategy="MIG", mig={"preset": "all-1g"}))

    assert fleet.policies["p"].metadata.generation == 2
    assert fleet.policy_errors == {}


def test_a_policy_that_becomes_invalid_no_longer_applies() -> None:
    fleet = Fleet()
    fleet.set_policy(policy_body("p", strategy="TimeSlicing"))
    fleet.set_policy(policy_body("p", generation=2, strategy="TimeSlicing", mig={"preset": "all-1g"}))

    assert "p" not in fleet.policies
    assert "p" in fleet.policy_errors


def test_remove_policy_forgets_it_entirely() -> None:
    fleet = Fleet()
    fleet.set_policy(policy_body("p", strategy="MIG"))
    fleet.set_policy(policy_body("q"))

    fleet.remove_policy("p")
    fleet.remove_policy("q")

    assert (fleet.policies, fleet.policy_bodies, fleet.policy_errors) == ({}, {}, {})


def test_a_node_recorded_after_its_layout_keeps_labels_for_matching() -> None:
    fleet = Fleet()
    fleet.set_layout(layout_body([mig_gpu(0)]))
    fleet.set_node(node_body(labels={"tessera.dev/pool": "mig"}))

    assert fleet.nodes[NODE].labels == {"tessera.dev/pool": "mig"}
    assert [v.name for v in fleet.gpu_nodes()] == [NODE]


def test_set_policy_says_whether_what_the_policy_asks_for_changed() -> None:
    fleet = Fleet()
    body = policy_body("p", strategy="MPS")
    assert fleet.set_policy(body) is True, "a new policy"
    assert fleet.set_policy(body) is False, "the same policy again (a resume after a restart)"
    relabelled = {**body, "metadata": {**body["metadata"], "labels": {"team": "a"}}}
    assert fleet.set_policy(relabelled) is False, "metadata alone asks for nothing new"
    assert fleet.set_policy(policy_body("p", strategy="TimeSlicing")) is True
