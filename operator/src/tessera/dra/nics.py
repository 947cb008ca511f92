"""Shared NICs as DRA devices: which NICs of a node the NetworkSharingPolicies sell, the device
each becomes, and the node's NIC slice. Pure: values in, values out.

Driver ``nic.tessera.dev``, not ``gpu.tessera.dev`` with a type attribute. The kubelet hands a
claim's devices to the plugin registered under the device's driver name, and a pool (its
generation, its slice count) belongs to one driver: a NIC that goes down rewrites the NIC
pool's one slice and never bumps the GPU pool, a NIC plugin that is slow to prepare never holds
up a GPU's, and a DeviceClass or CEL selector that tests ``device.driver`` sees GPUs and NICs as
the different things they are. ``matchAttribute`` across the two works all the same: it
compares the standard, fully qualified ``resource.kubernetes.io/pcieRoot`` of each, whatever the
driver.

| device          | ``nic-<interface>``, ``allowMultipleAllocations: true``                         |
| --------------- | ------------------------------------------------------------------------------ |
| capacity        | ``bandwidth``: bits per second sold; ``requestPolicy`` default = share.default, |
|                 | ``validRange`` min = share.min, step = share.step, max = the largest           |
|                 | ``min + n*step`` within the rate                                               |
| attributes      | ``type`` (``nic``), ``interface``, ``speedMbps``, ``numaNode``, ``mac``,         |
|                 | ``policy``, ``shareCeilingBps`` (the policy's ceiling, if any); standard        |
|                 | ``resource.kubernetes.io/pcieRoot`` and ``pciBusID``                            |
| taint           | ``nic.tessera.dev/link`` = ``Down`` / ``Absent``, NoSchedule, while the uplink   |
|                 | is not up                                                                       |

The apiserver then refuses a request above ``max`` or below ``min``, and rounds an off-step
request up to the next step (KEP-5075), so no bad share reaches prepare.
Not for: discovering NICs (``tessera.agent.nics``) or writing slices (the controller).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import RESOURCE_API_VERSION
from tessera.dra.slices import MANAGED_BY, MANAGED_BY_LABEL, NodeRef, slice_name
from tessera.models.attributes import PCIE_ROOT_ATTRIBUTE
from tessera.models.network import NetworkSharingPolicy, NetworkSharingPolicySpec
from tessera.models.nics import LinkState, NicStatus

NIC_DRIVER = "nic.tessera.dev"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
BANDWIDTH_CAPACITY = "bandwidth"
CEILING_ATTRIBUTE = "shareCeilingBps"
ADDRESSES_ATTRIBUTE = "shareAddressCIDR"  # spec.addresses.cidr: each share's net1 gets an address from it
TYPE_NIC = "nic"
LINK_TAINT_KEY = f"{NIC_DRIVER}/link"
NIC_SLICE_SUFFIX = "tessera-nics"
SHARED_NIC_CLASS = "shared-nic.tessera.dev"

Device = dict[str, Any]

_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
_NOT_IN_NAME = re.compile(r"[^a-z0-9-]+")


def format_rate(bits_per_second: int) -> str:
    """The canonical decimal quantity of a rate, as the apiserver writes it back:
    ``40_000_000_000`` → ``40G``, ``2_500_000_000`` → ``2500M``."""
    if bits_per_second == 0:
        return "0"
    for suffix, unit in _DECIMAL:
        if bits_per_second % unit == 0:
            return f"{bits_per_second // unit}{suffix}"
    return str(bits_per_second)


def nic_device_name(interface: str) -> str:
    """``nic-<interface>`` as a DNS label: ``ens1f0np0`` → ``nic-ens1f0np0``, ``eth0.100`` → ``nic-eth0-100``."""
    return "nic-" + _NOT_IN_NAME.sub("-", interface.lower()).strip("-")


@dataclass(frozen=True, slots=True)
class SharedNic:
    """A NIC a policy sells, with the rate it sells (None: nobody knows it)."""

    nic: NicStatus
    policy: str
    spec: NetworkSharingPolicySpec

    @property
    def rate_bps(self) -> int | None:
        if self.spec.line_rate_bps is not None:
            return self.spec.line_rate_bps
        if self.nic.speed_mbps:
            return self.nic.speed_mbps * 10**6
        return None


@dataclass(frozen=True, slots=True)
class NodeNics:
    """What the policies make of one node's NICs: the ones sold, and why others are not."""

    shared: tuple[SharedNic, ...]
    problems: tuple[str, ...]  # "<policy>: <what is wrong>", for the policy's Degraded condition


def choose_shared_nics(
    policies: Iterable[NetworkSharingPolicy], node_labels: dict[str, str], nics: Sequence[NicStatus]
) -> NodeNics:
    """Each NIC of the node goes to the highest-priority policy that names it (ties: the name);
    an interface a matching policy names but the node lacks, or whose rate nobody knows, is a
    problem, not an error."""
    by_interface = {n.interface: n for n in nics}
    ranked = sorted(
        (p for p in policies if p.spec.node_selector.matches(node_labels)),
        key=lambda p: (-p.spec.priority, p.name),
    )
    taken: dict[str, SharedNic] = {}
    problems: list[str] = []
    for policy in ranked:
        for interface in policy.spec.interfaces:
            nic = by_interface.get(interface)
            if nic is None:
                problems.append(f"{policy.name}: no interface {interface!r} on this node")
                continue
            if interface in taken:
                continue
            shared = SharedNic(nic, policy.name, policy.spec)
            if shared.rate_bps is None:
                problems.append(f"{policy.name}: {interface} does not report its speed; set spec.lineRate")
                continue
            if shared.rate_bps < policy.spec.share.min_bps:
                problems.append(f"{policy.name}: {interface} sells {format_rate(shared.rate_bps)}, less than one share")
                continue
            taken[interface] = shared
    return NodeNics(tuple(taken[i] for i in sorted(taken)), tuple(problems))


def bandwidth_capacity(rate_bps: int, spec: NetworkSharingPolicySpec) -> dict[str, Any]:
    """``bandwidth`` with the share's request policy fitted into ``rate_bps``."""
    share = spec.share
    low, step = share.min_bps, share.step_bps
    high = low + (rate_bps - low) // step * step
    default = min(share.default_bps, high)
    return {
        "value": format_rate(rate_bps),
        "requestPolicy": {
            "default": format_rate(default),
            "validRange": {"min": format_rate(low), "max": format_rate(high), "step": format_rate(step)},
        },
    }


def nic_device(shared: SharedNic) -> Device:
    """The one device a shared NIC is published as (see the module doc)."""
    nic = shared.nic
    rate = shared.rate_bps
    if rate is None:
        raise ValueError(f"{nic.interface}: no rate to sell")
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": TYPE_NIC},
        "interface": {"string": nic.interface},
        "policy": {"string": shared.policy},
    }
    if nic.speed_mbps:
        attributes["speedMbps"] = {"int": nic.speed_mbps}
    if nic.numa_node is not None:
        attributes["numaNode"] = {"int": nic.numa_node}
    if nic.mac:
        attributes["mac"] = {"string": nic.mac}
    if nic.pcie_root:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": nic.pcie_root}
    if nic.pci_bus_id:
        attributes[PCI_BUS_ID_ATTRIBUTE] = {"string": nic.pci_bus_id}
    ceiling = shared.spec.share.ceiling_bps
    if ceiling is not None:  # what a share may borrow up to; the kubelet plugin reads it back
        attributes[CEILING_ATTRIBUTE] = {"int": min(ceiling, rate)}
    if shared.spec.addresses is not None:  # the kubelet plugin reads it back and hands out addresses
        attributes[ADDRESSES_ATTRIBUTE] = {"string": shared.spec.addresses.cidr}
    device: Device = {
        "name": nic_device_name(nic.interface),
        "allowMultipleAllocations": True,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {BANDWIDTH_CAPACITY: bandwidth_capacity(rate, shared.spec)},
    }
    if nic.link is not LinkState.UP:
        device["taints"] = [{"key": LINK_TAINT_KEY, "value": nic.link.value, "effect": "NoSchedule"}]
    return device


def nic_slice(node: NodeRef, shared: Iterable[SharedNic], generation: int = 1) -> dict[str, Any]:
    """The node's one NIC slice (a node has far fewer than 64 NICs), devices sorted by name."""
    devices = sorted((nic_device(s) for s in shared), key=lambda d: str(d["name"]))
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node.name, NIC_SLICE_SUFFIX),
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
            ],
        },
        "spec": {
            "devices": devices,
            "driver": NIC_DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": generation, "resourceSliceCount": 1},
        },
    }


def shared_nic_class() -> dict[str, Any]:
    """The DeviceClass for a share of a NIC."""
    cel = f'device.driver == "{NIC_DRIVER}" && device.attributes["{NIC_DRIVER}"].type == "{TYPE_NIC}"'
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": SHARED_NIC_CLASS, "labels": {"app.kubernetes.io/part-of": "tessera"}},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }
