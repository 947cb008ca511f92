"""NIC discovery: from a sysfs tree (tessera.agent.nics.sysfs) and from the node's simulation
spec (tessera.agent.nics.simulated), beside the simulated GPUs on the same PCIe roots."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from tessera.agent.backends.pci import sysfs_bus_id
from tessera.agent.backends.simstate import board_slot, parse_simulate_spec
from tessera.agent.nics.simulated import simulated_nics
from tessera.agent.nics.spec import is_nic_item, nic_items
from tessera.agent.nics.sysfs import discover_nics, read_nic
from tessera.cli.agent import add_arguments, make_nic_inventory
from tessera.dra.nics import choose_shared_nics, nic_device
from tessera.models.network import NetworkSharingPolicy
from tessera.models.nics import LinkState


def _interface(sysfs: Path, name: str, device: str | None, **files: str) -> None:
    folder = sysfs / "devices" / ("virtual/net" if device is None else device) / "net" / name
    if device is None:
        folder = sysfs / "devices" / "virtual" / "net" / name
    folder.mkdir(parents=True)
    for key, value in files.items():
        (folder / key).write_text(value + "\n")
    (sysfs / "class" / "net").mkdir(parents=True, exist_ok=True)
    os.symlink(folder, sysfs / "class" / "net" / name)
    if device is not None:
        os.symlink(sysfs / "devices" / device, folder / "device")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    pci = root / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    (root / "bus" / "pci" / "drivers" / "mlx5_core").mkdir(parents=True)
    os.symlink(root / "bus" / "pci" / "drivers" / "mlx5_core", pci / "driver")
    _interface(root, "ens1f0np0", "pci0000:3a/0000:3a:00.0/0000:3b:00.0",
               address="b8:3f:d2:00:00:01", speed="100000", operstate="up")  # fmt: skip
    virtio = root / "devices" / "pci0000:00" / "0000:00:03.0" / "virtio2"
    virtio.mkdir(parents=True)
    (root / "devices" / "pci0000:00" / "0000:00:03.0" / "numa_node").write_text("-1\n")
    _interface(root, "eth0", "pci0000:00/0000:00:03.0/virtio2", address="52:54:00:00:00:01", speed="-1",
               operstate="down")  # fmt: skip
    _interface(root, "veth-up", None, address="02:00:00:00:00:09", operstate="up")
    _interface(root, "lo", None, address="00:00:00:00:00:00", operstate="unknown")
    return root


def test_a_pci_nic_is_read_with_its_bus_id_root_numa_node_speed_and_driver(sysfs: Path) -> None:
    nic = read_nic(sysfs, "ens1f0np0")
    assert nic is not None
    assert (nic.pci_bus_id, nic.pcie_root, nic.numa_node) == ("0000:3b:00.0", "pci0000:3a", 1)
    assert (nic.speed_mbps, nic.mac, nic.driver, nic.link) == (100_000, "b8:3f:d2:00:00:01", "mlx5_core", LinkState.UP)


def test_a_virtio_nic_takes_the_pci_function_above_it_and_says_what_it_cannot_tell(sysfs: Path) -> None:
    nic = read_nic(sysfs, "eth0")
    assert nic is not None
    assert (nic.pci_bus_id, nic.pcie_root) == ("0000:00:03.0", "pci0000:00")
    assert nic.numa_node is None
    assert nic.speed_mbps is None
    assert nic.link is LinkState.DOWN


def test_discovery_lists_physical_nics_and_named_virtual_ones_never_lo(sysfs: Path) -> None:
    assert [n.interface for n in discover_nics(sysfs)] == ["ens1f0np0", "eth0"]
    found = discover_nics(sysfs, named=["veth-up", "gone0"])
    assert [n.interface for n in found] == ["ens1f0np0", "eth0", "gone0", "veth-up"]
    assert found[2].link is LinkState.ABSENT
    assert found[3].pci_bus_id is None


def test_the_simulation_spec_names_nics_beside_gpus() -> None:
    assert is_nic_item("4xNIC-400G")
    assert is_nic_item("nic-40G")
    assert not is_nic_item("4xH100-80GB")
    assert nic_items("8xH100-80GB,2xNIC-40G,NIC-100G") == [40_000, 40_000, 100_000]
    assert len(parse_simulate_spec("8xH100-80GB,4xNIC-400G")) == 8, "the GPU parser skips NIC items"


def test_simulated_nics_sit_one_per_pcie_root_on_the_gpus_numa_nodes() -> None:
    nics = simulated_nics("node-a", "8xH100-80GB,4xNIC-400G", gpu_count=8)
    gpus = [board_slot(i, 8) for i in range(8)]
    assert [n.pcie_root for n in nics] == sorted({g.pcie_root for g in gpus})
    for nic in nics:
        numa = {g.numa_node for g in gpus if g.pcie_root == nic.pcie_root}
        assert numa == {nic.numa_node}
    assert len({n.pci_bus_id for n in nics} | {sysfs_bus_id(g.pci_bus_id) for g in gpus}) == 12, "no shared bus id"
    assert nics == simulated_nics("node-a", "8xH100-80GB,4xNIC-400G", gpu_count=8), "seeded by the node"
    assert nics[0].mac != simulated_nics("node-b", "4xNIC-400G", gpu_count=8)[0].mac


def test_an_uplink_that_goes_down_or_away_taints_its_device_and_the_taint_clears_when_it_is_back(
    sysfs: Path,
) -> None:
    policy = NetworkSharingPolicy.from_kube({"metadata": {"name": "p"}, "spec": {"interfaces": ["ens1f0np0"]}})
    operstate = sysfs / "class" / "net" / "ens1f0np0" / "operstate"

    def taints() -> list[dict[str, str]]:
        [shared] = choose_shared_nics([policy], {}, discover_nics(sysfs, named=["ens1f0np0"])).shared
        return list(nic_device(shared).get("taints", []))

    assert taints() == []
    operstate.write_text("down\n")
    assert taints() == [{"key": "nic.tessera.dev/link", "value": "Down", "effect": "NoSchedule"}]
    operstate.write_text("up\n")
    assert taints() == []
    link = sysfs / "class" / "net" / "ens1f0np0"
    target = link.readlink()
    last_known = {n.interface: n for n in discover_nics(sysfs)}
    link.unlink()  # the NIC is gone (driver unbound, card pulled)
    [gone] = [n for n in discover_nics(sysfs, last_known=last_known) if n.interface == "ens1f0np0"]
    assert (gone.link, gone.speed_mbps, gone.pcie_root) == (LinkState.ABSENT, 100_000, "pci0000:3a")
    [shared] = choose_shared_nics([policy], {}, [gone]).shared
    assert nic_device(shared)["taints"] == [{"key": "nic.tessera.dev/link", "value": "Absent", "effect": "NoSchedule"}]
    link.symlink_to(target)
    assert taints() == []


def _agent_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--node-name", "n1", *argv])


def test_simulated_gpus_beside_a_named_real_interface_report_that_interface_from_sysfs() -> None:
    """A real node of the tests: simulated GPUs, and a veth standing in for its NIC."""
    assert make_nic_inventory(_agent_args("--simulate", "1xH100-80GB")) is None, "no NIC named: no NIC family"
    simulated = make_nic_inventory(_agent_args("--simulate", "1xH100-80GB,NIC-100G", "--nic-interfaces", "x0"))
    assert simulated is not None
    assert [n.interface for n in simulated()] == ["simnic0"], "the spec's NICs win over named ones"
    named = make_nic_inventory(_agent_args("--simulate", "1xH100-80GB", "--nic-interfaces", "tessera-none0"))
    assert named is not None
    [absent] = [n for n in named() if n.interface == "tessera-none0"]
    assert absent.link is LinkState.ABSENT
