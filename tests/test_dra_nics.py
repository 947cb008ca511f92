"""Shared NICs as DRA devices (tessera.dra.nics): which NICs the policies sell, and the device,
capacity and slice each becomes."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.dra.nics import (
    LINK_TAINT_KEY,
    NIC_DRIVER,
    SharedNic,
    bandwidth_capacity,
    choose_shared_nics,
    format_rate,
    nic_device,
    nic_device_name,
    nic_slice,
)
from tessera.dra.slices import NodeRef
from tessera.models.network import NetworkSharingPolicy
from tessera.models.nics import LinkState, NicStatus

UPLINK = NicStatus(
    interface="ens1f0np0",
    mac="02:00:00:00:00:01",
    pci_bus_id="0000:1a:00.0",
    pcie_root="pci0000:10",
    numa_node=0,
    speed_mbps=40_000,
    driver="mlx5_core",
)


def _policy(name: str = "uplinks", priority: int = 0, **spec: Any) -> NetworkSharingPolicy:
    body = {"interfaces": [UPLINK.interface], "share": {"default": "2G", "min": "1G", "step": "1G"}, **spec}
    return NetworkSharingPolicy.from_kube({"metadata": {"name": name}, "spec": {"priority": priority, **body}})


@pytest.mark.parametrize(
    ("bps", "text"),
    [(40 * 10**9, "40G"), (2_500_000_000, "2500M"), (10**12, "1T"), (1234, "1234"), (0, "0")],
)
def test_rates_are_written_as_the_apiserver_writes_them_back(bps: int, text: str) -> None:
    assert format_rate(bps) == text


def test_a_shared_nic_is_one_multi_allocatable_device_with_bandwidth_and_standard_pci_attributes() -> None:
    [shared] = choose_shared_nics([_policy()], {}, [UPLINK]).shared
    device = nic_device(shared)
    assert device["name"] == "nic-ens1f0np0"
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "bandwidth": {
            "value": "40G",
            "requestPolicy": {"default": "2G", "validRange": {"min": "1G", "max": "40G", "step": "1G"}},
        }
    }
    attrs = device["attributes"]
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:10"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:1a:00.0"}
    assert attrs["interface"] == {"string": "ens1f0np0"}
    assert attrs["speedMbps"] == {"int": 40_000}
    assert attrs["numaNode"] == {"int": 0}
    assert attrs["type"] == {"string": "nic"}
    assert "taints" not in device


def test_the_valid_range_ends_at_the_last_whole_step_within_the_rate() -> None:
    policy = _policy(lineRate="10G", share={"default": "4500M", "min": "1500M", "step": "3G"})
    capacity = bandwidth_capacity(10 * 10**9, policy.spec)
    assert capacity["requestPolicy"]["validRange"] == {"min": "1500M", "max": "7500M", "step": "3G"}
    assert capacity["requestPolicy"]["default"] == "4500M"


def test_the_default_never_exceeds_what_the_nic_can_sell() -> None:
    policy = _policy(lineRate="3G", share={"default": "5G", "min": "1G", "step": "1G"})
    assert bandwidth_capacity(3 * 10**9, policy.spec)["requestPolicy"]["default"] == "3G"


def test_line_rate_in_the_policy_overrides_the_reported_speed() -> None:
    [shared] = choose_shared_nics([_policy(lineRate="25G")], {}, [UPLINK]).shared
    assert shared.rate_bps == 25 * 10**9
    assert nic_device(shared)["capacity"]["bandwidth"]["value"] == "25G"


def test_the_higher_priority_policy_wins_a_nic_then_the_name() -> None:
    low, high = _policy("a-low", priority=1), _policy("z-high", priority=5, lineRate="10G")
    [shared] = choose_shared_nics([low, high], {}, [UPLINK]).shared
    assert shared.policy == "z-high"
    tie_a, tie_b = _policy("b", lineRate="10G"), _policy("a", lineRate="20G")
    [shared] = choose_shared_nics([tie_a, tie_b], {}, [UPLINK]).shared
    assert shared.policy == "a"


def test_policies_select_nodes_by_label() -> None:
    policy = _policy(nodeSelector={"matchLabels": {"pool": "training"}})
    assert choose_shared_nics([policy], {"pool": "inference"}, [UPLINK]).shared == ()
    assert len(choose_shared_nics([policy], {"pool": "training"}, [UPLINK]).shared) == 1


def test_a_missing_interface_or_unknown_speed_is_a_problem_named_for_the_policy_not_a_crash() -> None:
    veth = NicStatus(interface="veth-up", speed_mbps=None)
    policy = _policy(interfaces=["eth9", "veth-up"])
    chosen = choose_shared_nics([policy], {}, [veth])
    assert chosen.shared == ()
    assert chosen.problems == (
        "uplinks: no interface 'eth9' on this node",
        "uplinks: veth-up does not report its speed; set spec.lineRate",
    )
    assert len(choose_shared_nics([_policy(interfaces=["veth-up"], lineRate="10G")], {}, [veth]).shared) == 1


@pytest.mark.parametrize("link", [LinkState.DOWN, LinkState.ABSENT])
def test_an_uplink_that_is_not_up_taints_its_device_no_schedule(link: LinkState) -> None:
    shared = SharedNic(UPLINK.model_copy(update={"link": link}), "uplinks", _policy().spec)
    assert nic_device(shared)["taints"] == [{"key": LINK_TAINT_KEY, "value": link.value, "effect": "NoSchedule"}]


def test_interface_names_become_dns_labels() -> None:
    assert nic_device_name("eth0.100") == "nic-eth0-100"
    assert nic_device_name("Ens_1") == "nic-ens-1"


def test_the_nic_slice_is_one_pool_of_its_own_driver_owned_by_the_node() -> None:
    other = UPLINK.model_copy(update={"interface": "eth0", "pcie_root": "pci0000:30"})
    shared = choose_shared_nics([_policy(interfaces=["ens1f0np0", "eth0"])], {}, [UPLINK, other]).shared
    resource_slice = nic_slice(NodeRef("node-a", "uid-1"), shared)
    spec = resource_slice["spec"]
    assert spec["driver"] == NIC_DRIVER
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["nic-ens1f0np0", "nic-eth0"]
    assert resource_slice["metadata"]["name"] == "node-a-tessera-nics"
    assert resource_slice["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_the_policys_ceiling_is_published_for_the_plugin_capped_at_the_rate() -> None:
    borrowing = _policy(share={"default": "2G", "min": "1G", "ceiling": "10G"})
    [shared] = choose_shared_nics([borrowing], {}, [UPLINK]).shared
    assert nic_device(shared)["attributes"]["shareCeilingBps"] == {"int": 10 * 10**9}
    [capped] = choose_shared_nics(
        [_policy(lineRate="5G", share={"default": "2G", "min": "1G", "ceiling": "10G"})], {}, [UPLINK]
    ).shared
    assert nic_device(capped)["attributes"]["shareCeilingBps"] == {"int": 5 * 10**9}
    [plain] = choose_shared_nics([_policy()], {}, [UPLINK]).shared
    assert "shareCeilingBps" not in nic_device(plain)["attributes"]


def test_the_policys_address_network_is_published_for_the_plugin() -> None:
    [addressed] = choose_shared_nics([_policy(addresses={"cidr": "10.20.0.0/24"})], {}, [UPLINK]).shared
    assert nic_device(addressed)["attributes"]["shareAddressCIDR"] == {"string": "10.20.0.0/24"}
    [plain] = choose_shared_nics([_policy()], {}, [UPLINK]).shared
    assert "shareAddressCIDR" not in nic_device(plain)["attributes"], "no addresses: L2 use"
