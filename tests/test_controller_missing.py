"""Claims on missing devices (tessera.controller.missing): one Warning per claim and device,
told again only after it was found and lost again; the gauge counts across nodes."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from tessera.controller.decide import MissingDevice
from tessera.controller.missing import MissingDevices, missing_device_event
from tessera.controller.state import ClaimHold


def missing(node: str, claim: str, device: str) -> MissingDevice:
    hold = ClaimHold(namespace="ns", name=claim, devices=frozenset(), pods=(("ns", "pod-1"),), uid=f"uid-{claim}")
    return MissingDevice(node=node, device=device, claim=hold, gpu_index=0, policy=None)


async def test_each_claim_and_device_is_told_once_and_again_after_it_came_back_and_went() -> None:
    told: list[tuple[str, str]] = []

    async def post(each: MissingDevice) -> None:
        told.append((each.claim.key, each.device))

    rooms = MissingDevices(post)
    a, b = missing("n1", "a", "gpu-0"), missing("n1", "b", "gpu-1")
    await rooms.tell("n1", (a,))
    await rooms.tell("n1", (a, b))
    await rooms.tell("n1", (a, b))
    assert told == [("ns/a", "gpu-0"), ("ns/b", "gpu-1")]

    await rooms.tell("n1", (b,))  # a's device is back
    await rooms.tell("n1", (a, b))  # and lost again
    assert told[-1] == ("ns/a", "gpu-0")
    assert len(told) == 3


async def test_a_warning_whose_post_failed_is_posted_on_the_next_pass_and_the_others_still_go() -> None:
    posted: list[tuple[str, str]] = []
    failing = {("ns/a", "gpu-0")}

    async def post(each: MissingDevice) -> None:
        if (each.claim.key, each.device) in failing:
            raise ConnectionError("apiserver went away")
        posted.append((each.claim.key, each.device))

    rooms = MissingDevices(post)
    a, b = missing("n1", "a", "gpu-0"), missing("n1", "b", "gpu-1")
    with pytest.raises(ConnectionError):  # the node goes back on the queue
        await rooms.tell("n1", (a, b))
    assert posted == [("ns/b", "gpu-1")]  # b was not held back by a's failure

    failing.clear()
    await rooms.tell("n1", (a, b))  # the next pass: a is told now, b not again
    assert posted == [("ns/b", "gpu-1"), ("ns/a", "gpu-0")]
    await rooms.tell("n1", (a, b))
    assert len(posted) == 2


async def test_the_gauge_counts_every_nodes_missing_devices_and_drops_a_forgotten_node() -> None:
    async def post(each: MissingDevice) -> None:
        return None

    rooms = MissingDevices(post)
    await rooms.tell("n1", (missing("n1", "a", "gpu-0"), missing("n1", "b", "gpu-1")))
    await rooms.tell("n2", (missing("n2", "c", "gpu-0"),))
    assert rooms.total == 3
    assert REGISTRY.get_sample_value("tessera_operator_claims_on_missing_devices") == 3

    rooms.forget("n1")
    assert rooms.total == 1
    assert REGISTRY.get_sample_value("tessera_operator_claims_on_missing_devices") == 1


def test_the_event_names_the_claim_and_says_what_to_do() -> None:
    claim, type_, reason, message = missing_device_event(missing("n1", "a", "gpu-3"))
    assert claim["metadata"] == {"name": "a", "namespace": "ns", "uid": "uid-a"}
    assert (type_, reason) == ("Warning", "AllocatedDeviceMissing")
    assert "gpu-3 on n1" in message
    assert "delete" in message
