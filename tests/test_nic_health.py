"""A NIC's health follows its link: the kernel's link events (a real veth in a namespace of its
own) reach the agent between passes, the passes' inventory stays the backstop, and the NIC
plugin serves that health as the kubelet's health stream, with the GPU plugin's stream code."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tessera.agent.nics.family import NicFamily
from tessera.agent.nics.health import NicHealth
from tessera.agent.nics.linkwatch import LinkWatcher, link_event
from tessera.agent.nics.plugin import NicKubeletPlugin, NicPluginConfig
from tessera.agent.nics.shaping import UplinkShaper
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2 as pb
from tessera.agent.plugin.proto import dra_health_v1alpha1_pb2_grpc as pb_grpc
from tessera.models.nics import LinkState, NicStatus
from tests.nic_lab import UPLINK, Lab, network_lab
from tests.test_nic_plugin import _Claims, _enter_netns

NODE = "node-a"
DEVICE = f"nic-{UPLINK}"


@pytest.fixture
def lab() -> Iterator[Lab]:
    with network_lab() as made:
        yield made


def _until_seen(events: queue.Queue[tuple[str, LinkState]], wanted: tuple[str, LinkState]) -> None:
    """Events until ``wanted`` arrives (others on the way are fine: a veth says several things)."""
    while True:
        try:
            seen = events.get(timeout=10)
        except queue.Empty:
            raise AssertionError(f"no link event {wanted}") from None
        if seen == wanted:
            return


def test_link_events_say_down_up_and_gone_as_they_happen(lab: Lab) -> None:
    events: queue.Queue[tuple[str, LinkState]] = queue.Queue()
    watcher = LinkWatcher(lambda name, state: events.put((name, state)), netns=lab.host)
    watcher.start()
    try:
        lab.net.set_uplink(False)
        _until_seen(events, (UPLINK, LinkState.DOWN))
        lab.net.set_uplink(True)
        _until_seen(events, (UPLINK, LinkState.UP))
        made = lab.run(lab.host, "ip", "link", "add", "spare0", "type", "veth", "peer", "name", "spare1")
        assert made.returncode == 0, made.stderr
        lab.run(lab.host, "ip", "link", "del", "spare0")
        _until_seen(events, ("spare0", LinkState.ABSENT))
    finally:
        watcher.stop()
    assert watcher.error is None


def test_a_watcher_that_cannot_open_its_socket_says_why_at_start() -> None:
    watcher = LinkWatcher(lambda name, state: None, netns="tessera-no-such-namespace")
    with pytest.raises(RuntimeError, match="cannot watch link events"):
        watcher.start()
    watcher.stop()


def test_only_link_messages_are_link_events() -> None:
    assert link_event({"event": "RTM_NEWLINK", "ifname": "eth1", "IFLA_OPERSTATE": "LOWERLAYERDOWN"}) == (
        "eth1", LinkState.DOWN)
    assert link_event({"event": "RTM_NEWLINK", "ifname": "eth1", "IFLA_OPERSTATE": "UNKNOWN"}) == ("eth1", LinkState.UP)
    assert link_event({"event": "RTM_DELLINK", "ifname": "eth1"}) == ("eth1", LinkState.ABSENT)
    assert link_event({"event": "RTM_NEWROUTE", "ifname": "eth1"}) is None
    assert link_event(object()) is None


def test_a_link_event_changes_a_known_nics_health_and_the_next_pass_agrees() -> None:
    health = NicHealth()
    health.observe([NicStatus(interface=UPLINK), NicStatus(interface="eth2", link=LinkState.DOWN)])
    assert [(d.device, d.healthy) for d in health.device_health()] == [("nic-eth2", False), (DEVICE, True)]
    assert health.device_health()[0].message == "the link of eth2 is Down"
    assert not health.link_changed("veth-of-a-pod", LinkState.DOWN), "not a NIC the agent reports"
    assert not health.link_changed(UPLINK, LinkState.UP), "no change"
    assert health.link_changed(UPLINK, LinkState.ABSENT)
    assert health.links()[UPLINK] is LinkState.ABSENT
    health.observe([NicStatus(interface=UPLINK), NicStatus(interface="eth2")])  # the pass reads sysfs: both up
    assert all(d.healthy for d in health.device_health())


def test_the_watcher_marks_the_nic_unhealthy_before_any_pass(lab: Lab) -> None:
    health = NicHealth()
    inventory = health.observing(lambda: [NicStatus(interface=UPLINK)])
    inventory()
    passes: list[str] = []
    changed = threading.Event()

    def on_link(name: str, state: LinkState) -> None:
        if health.link_changed(name, state):
            passes.append(name)  # the agent: request_resync()
            changed.set()

    watcher = LinkWatcher(on_link, netns=lab.host)
    watcher.start()
    try:
        lab.net.set_uplink(False)
        assert changed.wait(10), "no link event changed the NIC's health"
    finally:
        watcher.stop()
    assert health.links()[UPLINK] is LinkState.DOWN
    assert [d.healthy for d in health.device_health()] == [False]
    assert set(passes) == {UPLINK}, "a pass is asked for the NIC, and for nothing else"


async def _message(stream: object) -> pb.NodeWatchResourcesResponse:
    message: pb.NodeWatchResourcesResponse = await asyncio.wait_for(stream.read(), 10)  # type: ignore[attr-defined]
    assert message is not grpc.aio.EOF
    return message


async def test_the_nic_plugin_serves_link_health_as_the_kubelets_health_stream(lab: Lab, tmp_path: Path) -> None:
    config = NicPluginConfig(NODE, tmp_path / "registry", tmp_path / "plugins" / "nic.tessera.dev", tmp_path / "cdi",
                             health_refresh_s=30)  # fmt: skip
    health = NicHealth()
    health.observe([NicStatus(interface=UPLINK)])
    executor = ThreadPoolExecutor(1, initializer=_enter_netns, initargs=(f"/run/netns/{lab.host}",))
    plugin = NicKubeletPlugin(config, NicFamily(config.checkpoint, UplinkShaper()), _Claims({}),
                              lambda: [NicStatus(interface=UPLINK)], executor, health=health)  # fmt: skip
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{config.dra_socket}") as channel:
            stream = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
            first = await _message(stream)
            assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
                (NODE, DEVICE, pb.HEALTHY)]
            assert first.devices[0].health_check_timeout_seconds == 90
            health.link_changed(UPLINK, LinkState.DOWN)  # heard at once, not at the 30 s refresh
            [device] = (await _message(stream)).devices
            assert (device.health, device.message) == (pb.UNHEALTHY, f"the link of {UPLINK} is Down")
            health.link_changed(UPLINK, LinkState.UP)
            assert [d.health for d in (await _message(stream)).devices] == [pb.HEALTHY]
            await plugin.stop()  # an open stream ends with the plugin
            assert await asyncio.wait_for(stream.read(), 10) is grpc.aio.EOF
    finally:
        await plugin.stop()
        executor.shutdown()
