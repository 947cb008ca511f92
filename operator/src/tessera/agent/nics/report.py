"""What a claim's NIC shares say in the claim's ``status.devices``, and the attach failures the
runtime's hook leaves for the agent to report there.

The attach hook (``tessera nic-attach``) runs in the runtime with no API credentials. When it
fails it writes one small file per claim (``<checkpoint folder>/attach-failures/<claim UID>.json``,
the reason) and removes it when a later attach of that claim works; the NIC plugin reads that
folder and turns it into the claim's device condition ``Ready=False, reason AttachFailed`` (or
back to ``Ready=True``). The runtime's own error reaches the Pod's events as well; the claim is
where a user of the claim looks for its devices.
Pure parts (``share_status_entries``) take values; the file helpers are the I/O.
Not for: making or attaching shares (``tessera.agent.nics.family``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.agent.nics.shaping import Share
from tessera.dra.nics import NIC_DRIVER

FAILURES_FOLDER = "attach-failures"
_UID = re.compile(r"[0-9A-Za-z-]{1,64}")


def failures_folder(checkpoint: Path) -> Path:
    return checkpoint.parent / FAILURES_FOLDER


def record_attach_failure(checkpoint: Path, claim_uid: str, reason: str) -> None:
    """Leave the reason for the agent (atomically; a claim UID that is not one is refused)."""
    if not _UID.fullmatch(claim_uid):
        raise ValueError(f"not a claim UID: {claim_uid!r}")
    folder = failures_folder(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".")
    with os.fdopen(fd, "w") as out:
        json.dump({"reason": reason[:1024]}, out)
    os.replace(tmp, folder / f"{claim_uid}.json")


def clear_attach_failure(checkpoint: Path, claim_uid: str) -> None:
    if _UID.fullmatch(claim_uid):
        with contextlib.suppress(FileNotFoundError):
            (failures_folder(checkpoint) / f"{claim_uid}.json").unlink()


def attach_failures(checkpoint: Path) -> dict[str, str]:
    """Claim UID -> the reason of its last failed attach."""
    out: dict[str, str] = {}
    folder = failures_folder(checkpoint)
    if not folder.is_dir():
        return out
    for path in folder.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            out[path.stem] = str(json.loads(path.read_text()).get("reason", ""))
    return out


def share_status_entries(
    pool: str, devices: Sequence[tuple[str, Share]], now: str, attach_failure: str | None = None
) -> list[dict[str, Any]]:
    """The claim's ``status.devices`` entries for its shares (``devices``: device name and share):
    ``Ready=True`` (prepared; attached under its interface name when the Pod starts) or ``Ready=False,
    AttachFailed`` with the hook's reason, and ``data`` naming the interface, MAC, uplink and rates."""
    entries = []
    for device, share in devices:
        if attach_failure is None:
            condition = {"type": "Ready", "status": "True", "reason": "Prepared",
                         "message": f"{share.rate_bps} bit/s of {share.uplink}, {share.interface} in the Pod"}
        else:
            condition = {"type": "Ready", "status": "False", "reason": "AttachFailed",
                         "message": attach_failure[:1024]}
        entries.append({
            "driver": NIC_DRIVER, "pool": pool, "device": device, "shareID": share.share_id,
            "conditions": [{**condition, "lastTransitionTime": now}],
            "data": {"interface": share.interface, "mac": share.mac, "uplink": share.uplink,
                     "rateBps": share.rate_bps, "ceilBps": share.ceil_bps,
                     **({"address": share.address} if share.address else {})},
            # DRA's own place for a network device: what the Pod's interface is called and has.
            "networkData": {"interfaceName": share.interface, "hardwareAddress": share.mac,
                            **({"ips": [share.address]} if share.address else {})},
        })  # fmt: skip
    return entries
