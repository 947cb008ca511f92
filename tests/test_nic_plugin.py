"""The NIC family's kubelet plugin (tessera.agent.nics.plugin): which shares a claim holds, the
CDI spec that attaches them, and NodePrepare/NodeUnprepare over the real DRA unix socket with
the shares made in a namespace lab (a veth standing in for the uplink)."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.agent.nics.family import NicFamily
from tessera.agent.nics.plugin import (
    CDI_KIND,
    NicKubeletPlugin,
    NicPluginConfig,
    cdi_spec_path,
    device_ceilings,
    device_cidrs,
    share_requests,
)
from tessera.agent.nics.report import clear_attach_failure, record_attach_failure
from tessera.agent.nics.shaping import UplinkShaper
from tessera.agent.plugin.claims import ClaimError, ClaimRef
from tessera.agent.plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc, pluginregistration_v1_pb2
from tessera.agent.plugin.proto import pluginregistration_v1_pb2_grpc as registration_grpc
from tessera.models.nics import NicStatus
from tests.nic_lab import UPLINK, Lab, network_lab

NODE = "node-a"
NICS = [NicStatus(interface=UPLINK, speed_mbps=40_000)]


def _claim(uid: str = "uid-1", *results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": "c", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def _result(**extra: Any) -> dict[str, Any]:
    return {
        "request": "nic", "driver": "nic.tessera.dev", "pool": NODE, "device": f"nic-{UPLINK}",
        "shareID": "7f0c6f1e-0000-4000-8000-000000000001", "consumedCapacity": {"bandwidth": "1953125Ki"}, **extra,
    }  # fmt: skip


REF = ClaimRef("ns", "c", "uid-1")


def test_the_ceiling_comes_from_the_devices_published_attribute() -> None:
    published = [
        {"spec": {"driver": "nic.tessera.dev", "devices": [
            {"name": f"nic-{UPLINK}", "attributes": {"shareCeilingBps": {"int": 10**10}}},
            {"name": "nic-other", "attributes": {}},
        ]}},
        {"spec": {"driver": "gpu.tessera.dev", "devices": [
            {"name": "gpu-0", "attributes": {"shareCeilingBps": {"int": 1}}}]}},
    ]  # fmt: skip
    ceilings = device_ceilings(published)
    assert ceilings == {f"nic-{UPLINK}": 10**10}
    [share] = share_requests(_claim("uid-1", _result()), REF, NODE, NICS, ceilings)
    assert share.share.ceil_bps == 10**10


def test_the_address_network_comes_from_the_devices_published_attribute() -> None:
    published = [
        {"spec": {"driver": "nic.tessera.dev", "devices": [
            {"name": f"nic-{UPLINK}", "attributes": {"shareAddressCIDR": {"string": "10.20.0.0/24"}}},
            {"name": "nic-other", "attributes": {}},
        ]}},
        {"spec": {"driver": "gpu.tessera.dev", "devices": [
            {"name": "gpu-0", "attributes": {"shareAddressCIDR": {"string": "10.0.0.0/8"}}}]}},
    ]  # fmt: skip
    cidrs = device_cidrs(published)
    assert cidrs == {f"nic-{UPLINK}": "10.20.0.0/24"}
    [share] = share_requests(_claim("uid-1", _result()), REF, NODE, NICS, {}, cidrs)
    assert (share.share.cidr, share.share.address) == ("10.20.0.0/24", None), "the family picks the address"


def test_a_claims_share_takes_its_rate_from_consumed_capacity_and_its_id_from_share_id() -> None:
    [share] = share_requests(_claim("uid-1", _result()), REF, NODE, NICS)
    assert (share.request, share.device) == ("nic", f"nic-{UPLINK}")
    assert share.share.uplink == UPLINK
    assert share.share.rate_bps == 2 * 10**9  # the scheduler's own way of writing 2G
    assert share.share.share_id == "7f0c6f1e-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (_claim("other-uid", _result()), "deleted and created again"),
        ({"metadata": {"uid": "uid-1"}}, "not allocated"),
        (_claim("uid-1", {**_result(), "driver": "gpu.tessera.dev"}), "no device of driver nic.tessera.dev"),
        (_claim("uid-1", _result(pool="node-b")), "holds a NIC of node node-b"),
        (_claim("uid-1", _result(device="nic-eth9")), "no NIC nic-eth9"),
        (_claim("uid-1", _result(consumedCapacity={})), "books no bandwidth"),
    ],
)
def test_a_claim_that_holds_no_share_here_is_refused_with_the_reason(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        share_requests(claim, REF, NODE, NICS)


def _named(claim: dict[str, Any], parameters: dict[str, Any], requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": "FromClaim", "opaque": {"driver": "nic.tessera.dev", "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    claim["status"]["allocation"]["devices"]["config"] = [entry]
    return claim


NAMED = {"apiVersion": "nic.tessera.dev/v1alpha1", "kind": "NicShareConfig", "interfaceName": "storage0"}


def test_a_claims_shares_are_net1_net2_in_result_order_unless_its_config_names_one() -> None:
    two = _claim("uid-1", _result(request="a"), _result(request="b", shareID="7f0c6f1e-0000-4000-8000-000000000002"))
    assert [s.share.interface for s in share_requests(two, REF, NODE, NICS)] == ["net1", "net2"]
    assert [s.share.interface for s in share_requests(two, REF, NODE, NICS, first_auto=3)] == ["net3", "net4"]
    named = _named(two, NAMED, ["a"])
    assert [s.share.interface for s in share_requests(named, REF, NODE, NICS)] == ["storage0", "net1"]


def test_a_share_config_that_cannot_be_used_refuses_the_claim_with_the_reason() -> None:
    claim = _named(_claim("uid-1", _result()), {**NAMED, "interfaceName": "net7"})
    with pytest.raises(ClaimError, match=r"ResourceClaim ns/c: NicShareConfig\.interfaceName 'net7': names net<N>"):
        share_requests(claim, REF, NODE, NICS)


class _Slices:
    async def node_slices(self, node: str) -> list[dict[str, Any]]:
        assert node == NODE
        return [{"spec": {"driver": "nic.tessera.dev", "devices": [
            {"name": f"nic-{UPLINK}", "attributes": {"shareCeilingBps": {"int": 10 * 10**9}}}]}}]  # fmt: skip


class _Claims:
    def __init__(self, claims: dict[str, dict[str, Any]]) -> None:
        self.claims = claims

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get(name)


@pytest.fixture
def lab() -> Iterator[Lab]:
    with network_lab() as made:
        yield made


async def test_prepare_and_unprepare_over_the_dra_socket_make_and_remove_the_share(lab: Lab, tmp_path: Path) -> None:
    config = NicPluginConfig(NODE, tmp_path / "registry", tmp_path / "plugins" / "nic.tessera.dev", tmp_path / "cdi")
    # The plugin's netlink work runs in a thread that lives in the namespace playing the host, with
    # netns=None as on a node: pyroute2's NetNS forks, and a fork beside gRPC's threads may crash.
    family = NicFamily(config.checkpoint, UplinkShaper())
    executor = ThreadPoolExecutor(1, initializer=_enter_netns, initargs=(f"/run/netns/{lab.host}",))
    claims = _Claims({"good": _claim("uid-good", _result()), "bad": _claim("uid-bad", _result(device="nic-eth9"))})
    status = _Status()
    plugin = NicKubeletPlugin(config, family, claims, lambda: NICS, executor, slices=_Slices(), status=status,
                              failure_poll_seconds=0.05)
    before = await asyncio.to_thread(lab.tc_state)  # pyroute2 runs a loop of its own: not on this one
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{config.registration_socket}") as channel:
            info = await registration_grpc.RegistrationStub(channel).GetInfo(pluginregistration_v1_pb2.InfoRequest())
        assert (info.name, info.endpoint) == ("nic.tessera.dev", str(config.dra_socket))
        async with grpc.aio.insecure_channel(f"unix://{config.dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[
                dra_v1_pb2.Claim(namespace="ns", name="good", uid="uid-good"),
                dra_v1_pb2.Claim(namespace="ns", name="bad", uid="uid-bad"),
            ])  # fmt: skip
            answer = await stub.NodePrepareResources(request)
            good, bad = answer.claims["uid-good"], answer.claims["uid-bad"]
            assert "no NIC nic-eth9" in bad.error
            assert good.error == ""
            [device] = good.devices
            share_id = "7f0c6f1e-0000-4000-8000-000000000001"
            assert device.share_id == share_id
            assert list(device.cdi_device_ids) == [f"{CDI_KIND}=uid-good-nic-{UPLINK}-{share_id}"]
            spec = json.loads(cdi_spec_path(config.cdi_dir, "uid-good").read_text())
            [hook] = spec["devices"][0]["containerEdits"]["hooks"]
            assert hook["hookName"] == "createRuntime"
            assert hook["args"][-2:] == ["--claim", "uid-good"]
            assert "rate 2Gbit ceil 10Gbit" in lab.run(lab.host, "tc", "class", "show", "dev", UPLINK).stdout
            assert [s.claim_uid for s in family.shares()] == ["uid-good"]
            [entry] = status.last("uid-good")
            assert (entry["driver"], entry["device"]) == ("nic.tessera.dev", f"nic-{UPLINK}")
            assert entry["shareID"] == share_id
            assert entry["conditions"][0]["status"] == "True"
            assert entry["data"]["mac"] == family.shares()[0].mac
            assert "uid-bad" not in status.writes, "a claim not prepared has nothing to report"

            # The attach hook's failure report becomes the claim's condition, and its success undoes it.
            record_attach_failure(config.checkpoint, "uid-good", "cannot move into /proc/9/ns/net")
            await _until(lambda: status.last("uid-good")[0]["conditions"][0]["reason"] == "AttachFailed")
            assert status.last("uid-good")[0]["conditions"][0]["message"] == "cannot move into /proc/9/ns/net"
            clear_attach_failure(config.checkpoint, "uid-good")
            await _until(lambda: status.last("uid-good")[0]["conditions"][0]["reason"] == "Prepared")

            unprepare = dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace="ns", name="good", uid="uid-good")]
            )
            assert (await stub.NodeUnprepareResources(unprepare)).claims["uid-good"].error == ""
        assert not cdi_spec_path(config.cdi_dir, "uid-good").exists()
        assert await asyncio.to_thread(lab.tc_state) == before
        assert family.shares() == []
        assert status.last("uid-good") == [], "unprepare clears the claim's NIC entries"
    finally:
        await plugin.stop()
        executor.shutdown()
    assert not config.dra_socket.exists()


class _Status:
    """Records the claim device status the plugin writes, per claim UID."""

    def __init__(self) -> None:
        self.writes: dict[str, list[list[dict[str, Any]]]] = {}

    async def write_device_status(self, ref: ClaimRef, devices: Sequence[dict[str, Any]]) -> None:
        self.writes.setdefault(ref.uid, []).append(list(devices))

    def last(self, uid: str) -> list[dict[str, Any]]:
        return self.writes[uid][-1]


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.02)


def _enter_netns(path: str) -> None:
    """Move the calling thread (only it) into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


async def test_two_claims_of_one_pod_prepared_together_become_its_net1_and_net2(lab: Lab, tmp_path: Path) -> None:
    """The kubelet prepares a Pod's claims of one driver in one call: their shares are numbered
    across it, and both attach into the one Pod under those names."""
    config = NicPluginConfig(NODE, tmp_path / "registry", tmp_path / "plugins" / "nic.tessera.dev", tmp_path / "cdi")
    family = NicFamily(config.checkpoint, UplinkShaper())
    executor = ThreadPoolExecutor(1, initializer=_enter_netns, initargs=(f"/run/netns/{lab.host}",))
    second = "7f0c6f1e-0000-4000-8000-000000000002"
    claims = _Claims({"one": _claim("uid-one", _result()),
                      "two": _named(_claim("uid-two", _result(request="a", shareID=second),
                                           _result(request="b", shareID=second[:-1] + "3")), NAMED, ["b"])})
    status = _Status()
    plugin = NicKubeletPlugin(config, family, claims, lambda: NICS, executor, slices=_Slices(), status=status)
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{config.dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            answer = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[
                dra_v1_pb2.Claim(namespace="ns", name="one", uid="uid-one"),
                dra_v1_pb2.Claim(namespace="ns", name="two", uid="uid-two"),
            ]))  # fmt: skip
            assert [answer.claims[u].error for u in ("uid-one", "uid-two")] == ["", ""]
            named = {e["networkData"]["interfaceName"] for uid in ("uid-one", "uid-two") for e in status.last(uid)}
            assert named == {"net1", "net2", "storage0"}
            assert [e["networkData"]["interfaceName"] for e in status.last("uid-one")] == ["net1"]
            # Asked again (a kubelet restarted), the claims keep the names they got.
            again = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[
                dra_v1_pb2.Claim(namespace="ns", name="two", uid="uid-two")]))  # fmt: skip
            assert again.claims["uid-two"].error == ""
            assert sorted(e["networkData"]["interfaceName"] for e in status.last("uid-two")) == ["net2", "storage0"]
    finally:
        await plugin.stop()
        executor.shutdown()
    # The attach hook's part, as the runtime runs it (outside gRPC's process: pyroute2 forks).
    await asyncio.to_thread(_attach_both_into_one_pod, lab, config.checkpoint)


def _attach_both_into_one_pod(lab: Lab, checkpoint: Path) -> None:
    hook = NicFamily(checkpoint, UplinkShaper(lab.host))
    pod = lab.pod()
    hook.attach("uid-one", f"/run/netns/{pod}")
    hook.attach("uid-two", f"/run/netns/{pod}")
    assert lab.links(pod) == {"lo", "net1", "net2", "storage0"}
    for share in hook.shares():
        assert share.mac in lab.run(pod, "ip", "link", "show", share.interface).stdout, share
