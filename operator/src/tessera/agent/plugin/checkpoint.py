"""What the kubelet plugin has prepared, kept on disk so a restarted agent knows it.

The checkpoint is one JSON file, replaced atomically after every change::

    {"kind": "TesseraPluginCheckpoint", "version": 1, "checksum": "sha256:<hex>",
     "data": {"node": "...", "claims": {"<claimUID>": {...}}}}

The checksum covers ``data`` in canonical form (sorted keys, no spaces), so a file that was
edited by hand, truncated or bit-flipped is refused rather than trusted. A claim is written
``Preparing`` before any hardware change and ``Prepared`` once its CDI spec exists, so after a
crash the plugin knows which dynamic MIG placements it may have made.
Not for: deciding anything; this module only stores values.
"""

from __future__ import annotations

import hashlib
import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tessera.agent.plugin.files import write_atomically

CHECKPOINT_KIND = "TesseraPluginCheckpoint"
CHECKPOINT_VERSION = 1


class CheckpointError(Exception):
    """The checkpoint file cannot be used; the message says why and what to do."""


class CheckpointCorruptError(CheckpointError):
    """The file is not a checkpoint, or its checksum does not match its content."""


class CheckpointVersionError(CheckpointError):
    """The file was written by a Tessera agent with a newer checkpoint format."""


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClaimState(StrEnum):
    PREPARING = "Preparing"  # hardware may be half-changed: dynamic instances may exist
    PREPARED = "Prepared"  # the CDI spec is written; the answer is final
    UNPREPARING = "Unpreparing"  # the CDI spec is gone; an instance could not be destroyed yet


class DynamicInstance(_Value):
    """A DynamicMIG instance made for a claim: where it goes, and what it is once made."""

    gpu_uuid: str
    profile: str
    start: int = Field(ge=0)
    gpu_instance_id: int | None = None  # None until created
    uuid: str | None = None  # "MIG-…"; None until created


class PreparedDevice(_Value):
    """One allocated device of a claim and what preparing it made visible."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    cdi_device_id: str
    gpu_uuid: str
    device_uuid: str = ""  # "GPU-…" or "MIG-…"; "" for a dynamic instance not made yet
    dynamic: DynamicInstance | None = None
    admin_access: bool = False  # visible to the claim, but not held: others may use and change it


class PreparedClaim(_Value):
    uid: str
    namespace: str = ""
    name: str = ""
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()
    recovered: bool = Field(default=False, description="rebuilt from CDI specs after a bad checkpoint")

    @property
    def device_uuids(self) -> frozenset[str]:
        """The devices the claim holds (admin-access devices are looked at, not held)."""
        return frozenset(d.device_uuid for d in self.devices if d.device_uuid and not d.admin_access)

    def cdi_device_ids(self) -> list[str]:
        return [d.cdi_device_id for d in self.devices]


class CheckpointData(_Value):
    node: str
    claims: dict[str, PreparedClaim] = Field(default_factory=dict)
    boot_id: str | None = None  # the node's boot it was written in (tessera.agent.plugin.boot)


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def checksum(data: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()


def encode_checkpoint(data: CheckpointData) -> bytes:
    body = data.model_dump(mode="json")
    document = {"kind": CHECKPOINT_KIND, "version": CHECKPOINT_VERSION, "checksum": checksum(body), "data": body}
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def decode_checkpoint(raw: bytes, source: str = "checkpoint") -> CheckpointData:
    """Parse and verify a checkpoint; raises CheckpointCorruptError or CheckpointVersionError."""
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise CheckpointCorruptError(f"{source} is not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("kind") != CHECKPOINT_KIND:
        raise CheckpointCorruptError(f"{source} is not a {CHECKPOINT_KIND}")
    version = document.get("version")
    if version != CHECKPOINT_VERSION:
        if isinstance(version, int) and version > CHECKPOINT_VERSION:
            raise CheckpointVersionError(
                f"{source} has format version {version}, newer than this agent's "
                f"{CHECKPOINT_VERSION}: run the newer agent, or drain the node's GPU pods and "
                "remove the file"
            )
        raise CheckpointCorruptError(f"{source} has an unknown format version {version!r}")
    body = document.get("data")
    if document.get("checksum") != checksum(body):
        raise CheckpointCorruptError(f"{source} does not match its checksum")
    try:
        return CheckpointData.model_validate(body)
    except ValidationError as error:
        raise CheckpointCorruptError(f"{source} has an invalid body: {error}") from None


def load_checkpoint(path: Path) -> CheckpointData | None:
    """The checkpoint at ``path``; None when there is none yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_checkpoint(raw, source=str(path))


def save_checkpoint(path: Path, data: CheckpointData) -> None:
    write_atomically(path, encode_checkpoint(data), mode=0o600)


def quarantine(path: Path) -> Path:
    """Move a bad checkpoint aside (kept for a person to read); returns where it went."""
    target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    path.replace(target)
    return target
