"""The fabric the demo, the NIC tests and bench_nic share (tessera.localcluster.fabric): made and
removed whole, a flow per sender measured at once, and a Pod's namespace found by its MAC."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tessera.localcluster.fabric import Fabric, FabricError, netns_holding
from tests.nic_lab import FABRIC_ADDRESS, UPLINK, Lab, network_lab


@pytest.fixture
def lab() -> Iterator[Lab]:
    with network_lab() as made:
        yield made


def test_a_plain_macvlan_in_a_pod_reaches_the_receivers_and_its_namespace_is_found_by_its_mac(lab: Lab) -> None:
    pod = lab.pod()
    lab.net.plain_macvlan(pod, "plain0", "10.98.0.30/24")
    assert lab.links(pod) == {"lo", "net1"}
    [rate] = lab.net.measure([pod], seconds=1, omit=0)
    assert rate > 0, "the flow crossed the uplink to the fabric's receiver"
    mac = lab.run(pod, "cat", "/sys/class/net/net1/address").stdout.strip()
    holder = subprocess.Popen(["ip", "netns", "exec", pod, "sleep", "30"])
    try:
        found = netns_holding(mac)
        assert os.stat(found).st_ino == os.stat(f"/run/netns/{pod}").st_ino
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(FabricError, match="no network namespace holds an interface with MAC 02:00:00:00:00:01"):
        netns_holding("02:00:00:00:00:01")


def test_making_a_fabric_again_replaces_what_a_failed_run_left_and_remove_leaves_nothing(lab: Lab) -> None:
    again = Fabric(UPLINK, "fabric0", lab.fabric, f"{FABRIC_ADDRESS}/24", host_netns=lab.host)
    again.make()  # same names as the lab's: the leftovers go first
    assert UPLINK in lab.links(lab.host)
    again.remove()
    assert UPLINK not in lab.links(lab.host)
    assert lab.fabric not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    again.remove()  # nothing left to remove: no error


def test_a_fabric_that_cannot_be_made_says_which_command_failed() -> None:
    broken = Fabric("x" * 20, "far0", "tessera-fabric-test-broken", "10.99.0.1/24")
    with pytest.raises(FabricError, match=r"ip link add x{20}"):
        broken.make()
    assert "tessera-fabric-test-broken" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                              text=True).stdout, "nothing half made is left"
