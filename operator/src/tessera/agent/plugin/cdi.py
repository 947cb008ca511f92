"""CDI (Container Device Interface) specs for prepared claims: one JSON file per claim.

The kubelet hands the container runtime the CDI device IDs a prepare returned
(``k8s.gpu.tessera.dev/claim=<claimUID>-<device>``); the runtime finds them in the spec
files of the CDI folder and applies their container edits (environment, device nodes,
mounts). One file per claim, named ``k8s.gpu.tessera.dev-claim_<claimUID>.json`` like
NVIDIA's driver does, so unpreparing a claim is removing one file.
``cdiVersion`` is the lowest version whose features the spec uses (as the CDI library
computes it), so older runtimes accept what they can.
Not for: deciding what a device needs (``tessera.agent.plugin.prepare``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.agent.plugin.files import remove_durably, write_atomically

CDI_VENDOR = "k8s.gpu.tessera.dev"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
DEFAULT_CDI_DIR = Path("/var/run/cdi")

_SPEC_FILE_RE = re.compile(re.escape(f"{CDI_VENDOR}-{CDI_CLASS}_") + r"(?P<uid>[0-9A-Za-z-]+)\.json")
BIND_OPTIONS = ("rw", "nosuid", "nodev", "bind")


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = BIND_OPTIONS

    def to_cdi(self) -> dict[str, Any]:
        return {"hostPath": self.host_path, "containerPath": self.container_path, "options": list(self.options)}


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What the runtime changes in a container that gets the device."""

    env: tuple[str, ...] = ()  # "NAME=value"
    device_nodes: tuple[str, ...] = ()  # paths; the runtime reads type and numbers from the host
    mounts: tuple[Mount, ...] = ()
    # The host folder that stands for /dev (simulated GPUs keep their device nodes in one);
    # None: the nodes are the host's own /dev/... files.
    dev_root: str | None = None

    def device_node(self, path: str) -> dict[str, str]:
        if self.dev_root is None or not path.startswith("/dev/"):
            return {"path": path}
        return {"path": path, "hostPath": f"{self.dev_root.rstrip('/')}/{path.removeprefix('/dev/')}"}

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [self.device_node(p) for p in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        return out


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: str  # "<claimUID>-<device>"
    edits: ContainerEdits = field(default_factory=ContainerEdits)


def cdi_device_name(claim_uid: str, device: str) -> str:
    """The CDI name of one allocated device of a claim: unique on the node."""
    return f"{claim_uid}-{device}"


def qualified_device_id(name: str) -> str:
    """The fully qualified CDI device ID a prepare returns: ``<vendor>/<class>=<name>``."""
    return f"{CDI_KIND}={name}"


def spec_file_name(claim_uid: str) -> str:
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


def claim_uid_of_spec_file(file_name: str) -> str | None:
    """The claim UID a spec file of ours is for; None for anyone else's file."""
    match = _SPEC_FILE_RE.fullmatch(file_name)
    return match["uid"] if match else None


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` that allows what ``spec`` uses (the rules of the CDI
    library's ``MinimumRequiredVersion``, for the fields Tessera writes)."""
    devices = spec.get("devices", [])
    all_edits = [d.get("containerEdits", {}) for d in devices] + [spec.get("containerEdits", {})]
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        return "0.6.0"
    vendor, _, klass = str(spec.get("kind", "")).partition("/")
    if vendor and "." in klass:
        return "0.6.0"
    if any(d["name"][:1] and not d["name"][0].isalpha() for d in devices):
        return "0.5.0"  # a device name that starts with a digit (claim UIDs often do)
    if any(n.get("hostPath") for e in all_edits for n in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(m.get("type") for e in all_edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def claim_spec(devices: Sequence[CdiDevice], common: ContainerEdits = ContainerEdits()) -> dict[str, Any]:
    """The CDI spec of one claim: its devices sorted by name, plus edits every one of them
    needs (applied once however many of the claim's devices a container gets)."""
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": CDI_KIND,
        "devices": [
            {"name": d.name, "containerEdits": d.edits.to_cdi()} for d in sorted(devices, key=lambda d: d.name)
        ],
    }
    if common.to_cdi():
        spec["containerEdits"] = common.to_cdi()
    spec["cdiVersion"] = minimum_cdi_version(spec)
    return spec


def encode_spec(spec: Mapping[str, Any]) -> bytes:
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()


def write_claim_spec(cdi_dir: Path, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """Write (or replace) the claim's spec file atomically; returns its path. The folder is made
    when missing: /var/run/cdi is on tmpfs, and after a reboot nothing may have made it yet.

    Atomically, but not durably (no fsync of the file or the folder): a spec is regenerated,
    never the record of anything. Only a crash of the machine loses unsynced data, not a crash
    of the agent; after one, /var/run/cdi (tmpfs) is empty anyway and the restarted plugin
    forgets the earlier boot's claims (``boot``); where the folder is on a disk, the
    checkpoint — synced before the kubelet's answer — still says the claim is prepared, and the
    next prepare finds its spec missing or not naming its devices and writes it again
    (``prepare.ClaimPreparer._spec_intact``). The sync cost milliseconds on every prepare."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / spec_file_name(claim_uid)
    write_atomically(path, encode_spec(spec), durable=False)
    return path


def read_claim_spec(cdi_dir: Path, claim_uid: str) -> dict[str, Any] | None:
    """The claim's spec as on disk; None when it is missing or not a spec of ours (a truncated
    or empty file, as a machine crash can leave an unsynced one)."""
    try:
        spec = json.loads((cdi_dir / spec_file_name(claim_uid)).read_bytes())
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) and spec.get("kind") == CDI_KIND else None


def remove_claim_spec(cdi_dir: Path, claim_uid: str) -> bool:
    """Remove the claim's spec file; False when there was none."""
    return remove_durably(cdi_dir / spec_file_name(claim_uid))


def read_claim_specs(cdi_dir: Path) -> dict[str, dict[str, Any]]:
    """Every spec file of ours in ``cdi_dir`` by claim UID; unreadable files are skipped."""
    out: dict[str, dict[str, Any]] = {}
    if not cdi_dir.is_dir():
        return out
    for path in sorted(cdi_dir.iterdir()):
        uid = claim_uid_of_spec_file(path.name)
        if uid is None:
            continue
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(spec, dict) and spec.get("kind") == CDI_KIND:
            out[uid] = spec
    return out


def spec_device_names(spec: Mapping[str, Any], claim_uid: str) -> list[str]:
    """The published device names a claim's spec holds (the CDI names minus the UID)."""
    prefix = f"{claim_uid}-"
    names: Iterable[str] = (str(d.get("name", "")) for d in spec.get("devices", []))
    return [n.removeprefix(prefix) for n in names if n.startswith(prefix)]
