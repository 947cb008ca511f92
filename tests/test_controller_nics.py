"""The operator's NIC room, its pure parts: what each NetworkSharingPolicy's status says."""

from __future__ import annotations

from tessera.controller.nics import PolicyCounts, policy_statuses, status_body
from tessera.dra.nics import choose_shared_nics
from tessera.models.conditions import Condition
from tessera.models.network import NetworkSharingPolicy
from tessera.models.nics import NicStatus


def _policy(name: str, interfaces: list[str], priority: int = 0) -> NetworkSharingPolicy:
    return NetworkSharingPolicy.from_kube(
        {"metadata": {"name": name}, "spec": {"interfaces": interfaces, "priority": priority}}
    )


NICS = [NicStatus(interface="eth0", speed_mbps=40_000), NicStatus(interface="eth1", speed_mbps=40_000)]


def test_counts_are_per_policy_and_problems_are_named_by_node() -> None:
    wide = _policy("wide", ["eth0", "eth1", "eth7"])
    narrow = _policy("narrow", ["eth0"], priority=9)
    policies = {"wide": wide, "narrow": narrow}
    per_node = {node: choose_shared_nics(policies.values(), {}, NICS) for node in ("n1", "n2")}
    counts = policy_statuses(policies, per_node)
    assert counts["narrow"] == PolicyCounts(nodes=2, nics=2, problems=())
    assert counts["wide"] == PolicyCounts(
        nodes=2, nics=2, problems=("n1: no interface 'eth7' on this node", "n2: no interface 'eth7' on this node")
    )


def test_a_policy_with_problems_is_degraded_and_not_ready_and_ready_again_when_fixed() -> None:
    bad = status_body(PolicyCounts(1, 1, ("n1: no interface 'eth7' on this node",)), 3, [])
    by_type = {c["type"]: c for c in bad["conditions"]}
    assert by_type["Degraded"]["status"] == "True"
    assert by_type["Degraded"]["reason"] == "InterfaceProblem"
    assert by_type["Ready"]["status"] == "False"
    assert bad["missing"] == ["n1: no interface 'eth7' on this node"]
    assert bad["observedGeneration"] == 3
    previous = [Condition.from_kube(c) for c in bad["conditions"]]
    good = status_body(PolicyCounts(1, 2, ()), 4, previous)
    by_type = {c["type"]: c for c in good["conditions"]}
    assert (by_type["Ready"]["status"], by_type["Ready"]["message"]) == ("True", "2 NICs shared on 1 nodes")
    assert by_type["Degraded"]["status"] == "False"
    assert good["missing"] == []
