"""The plugin's checkpoint: a round trip keeps every value; a damaged, foreign or newer file is
refused with a reason, never half-trusted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.agent.plugin.access import in_use_device_uuids, in_use_gpu_uuids
from tessera.agent.plugin.checkpoint import (
    CheckpointCorruptError,
    CheckpointData,
    CheckpointVersionError,
    ClaimState,
    DynamicInstance,
    PreparedClaim,
    PreparedDevice,
    checksum,
    decode_checkpoint,
    encode_checkpoint,
    load_checkpoint,
    quarantine,
    save_checkpoint,
)


def sample() -> CheckpointData:
    dyn = PreparedDevice(
        request="gpu", pool="node-a", device="gpu-2-dyn-3g-40gb-4", share_id=None,
        cdi_device_id="k8s.gpu.tessera.dev/claim=u1-gpu-2-dyn-3g-40gb-4", gpu_uuid="GPU-2", device_uuid="MIG-9",
        dynamic=DynamicInstance(gpu_uuid="GPU-2", profile="3g.40gb", start=4, gpu_instance_id=2, uuid="MIG-9"),
    )
    share = PreparedDevice(
        request="mps/small", pool="node-a", device="gpu-1", share_id="s-1",
        cdi_device_id="k8s.gpu.tessera.dev/claim=u2-gpu-1", gpu_uuid="GPU-1", device_uuid="GPU-1",
    )
    planned = PreparedDevice(
        request="gpu", pool="node-a", device="gpu-2-dyn-1g-10gb-0", cdi_device_id="", gpu_uuid="GPU-2",
        dynamic=DynamicInstance(gpu_uuid="GPU-2", profile="1g.10gb", start=0),
    )
    return CheckpointData(node="node-a", claims={
        "u1": PreparedClaim(uid="u1", namespace="a", name="c1", state=ClaimState.PREPARED, devices=(dyn,)),
        "u2": PreparedClaim(uid="u2", namespace="a", name="c2", state=ClaimState.PREPARED, devices=(share,)),
        "u3": PreparedClaim(uid="u3", namespace="a", name="c3", state=ClaimState.PREPARING, devices=(planned,)),
    })


def test_round_trip_keeps_every_value(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path, sample())
    assert load_checkpoint(path) == sample()
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_the_file_says_what_it_is_and_carries_a_checksum() -> None:
    document = json.loads(encode_checkpoint(sample()))
    assert document["kind"] == "TesseraPluginCheckpoint"
    assert document["version"] == 1
    assert document["checksum"].startswith("sha256:")


def test_no_file_means_nothing_was_prepared(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path / "missing.json") is None


def test_in_use_lists_devices_and_their_gpus_of_every_claim_even_half_prepared() -> None:
    claims = sample().claims.values()
    assert in_use_device_uuids(claims) == {"MIG-9", "GPU-1"}
    assert in_use_gpu_uuids(claims) == {"GPU-1", "GPU-2"}


def _tampered(edit: str) -> bytes:
    document = json.loads(encode_checkpoint(sample()))
    if edit == "value":
        document["data"]["claims"]["u1"]["state"] = "Preparing"
    elif edit == "claim-removed":
        del document["data"]["claims"]["u2"]
    elif edit == "kind":
        document["kind"] = "SomethingElse"
    elif edit == "body-invalid":
        document["data"]["claims"]["u1"]["devices"][0]["dynamic"]["start"] = -1
        document["checksum"] = checksum(document["data"])  # a valid checksum over an invalid body
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_tampered("value"), "does not match its checksum"),
        (_tampered("claim-removed"), "does not match its checksum"),
        (_tampered("kind"), "is not a TesseraPluginCheckpoint"),
        (_tampered("body-invalid"), "has an invalid body"),
        (encode_checkpoint(sample())[:-40], "is not JSON"),
        (b"", "is not JSON"),
        (b'{"kind": "TesseraPluginCheckpoint", "version": "1"}', "unknown format version"),
    ],
    ids=["edited-value", "claim-removed", "foreign-kind", "invalid-body", "truncated", "empty", "bad-version"],
)
def test_damaged_checkpoints_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(CheckpointCorruptError, match=message):
        decode_checkpoint(raw)


def test_a_checkpoint_from_a_newer_agent_is_refused_with_what_to_do() -> None:
    document = json.loads(encode_checkpoint(sample()))
    document["version"] = 2
    with pytest.raises(CheckpointVersionError, match="run the newer agent"):
        decode_checkpoint(json.dumps(document).encode())


def test_quarantine_keeps_the_bad_file_for_a_person_to_read(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(b"garbage")
    moved = quarantine(path)
    assert not path.exists()
    assert moved.read_bytes() == b"garbage"
    assert moved.name.startswith("checkpoint.json.corrupt-")
