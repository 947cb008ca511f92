"""The NIC device family on one node: prepare and unprepare a claim's bandwidth shares, with a
checkpoint of what was made, and the attach step that puts a share into its Pod.

Order of work, so that a crash at any point leaves something ``recover`` can finish:

- prepare: the shares are written ``Preparing`` (with their uplinks) *before* anything is made;
  then each uplink is set up and each share made; then they are written ``Prepared``. A failure
  removes what this claim made (``make_share`` is all-or-nothing per share) and forgets it.
- addresses: a share asks for a fixed one, or for the lowest free one of its policy's network
  (``spec.addresses``; free: held by no share in the checkpoint), chosen under the lock, so two
  claims never get one address; attach puts it on the share's interface (``net1``, …).
- unprepare: the shares are written ``Unpreparing``, removed, forgotten; an uplink left with no
  share is released before it leaves the checkpoint.
- recover (agent start): every share not ``Prepared`` is removed and forgotten, and a sweep
  removes from the recorded uplinks (and the host's ``tsn`` macvlans) anything no ``Prepared``
  share owns.

How the interface reaches the Pod: a CDI ``createRuntime`` hook. Prepare runs before the Pod's
sandbox exists; the runtime runs a CDI spec's createRuntime hooks after it has made the
container's namespaces (the Pod's network namespace, shared with the sandbox) and before the
container's process starts, in the runtime's (host) namespaces, with the container's state (its
``pid``) on stdin. So ``tessera nic-attach`` (``attach_from_runtime_state``) moves the prepared
macvlan into ``/proc/<pid>/ns/net`` before the first instruction of the container, and is a no-op
for the Pod's next containers. Chosen over an NRI plugin (a ttrpc protocol with no Python
implementation, and NRI must be enabled in every runtime's configuration) and a chained CNI
plugin (it would have to be added to every node's CNI configuration, and knows nothing of
claims). The CDI spec is what Tessera already writes per claim.
Not for: publishing (``tessera.dra.nics``) or the netlink work itself (``shaping``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from tessera.agent.nics.shaping import POD_INTERFACE, ShapingError, Share, UplinkShaper, free_class_minor
from tessera.dra.nics import NIC_DRIVER
from tessera.models.nics import NicStatus

CHECKPOINT_KIND = "TesseraNicCheckpoint"
CHECKPOINT_VERSION = 1
ATTACH_COMMAND = ("tessera", "nic-attach")


class ShareState(StrEnum):
    PREPARING = "Preparing"
    PREPARED = "Prepared"
    UNPREPARING = "Unpreparing"


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """What a claim's allocation asks of one NIC: the share's id and rate (``consumedCapacity``)."""

    share_id: str
    uplink: str
    rate_bps: int
    ceil_bps: int | None = None  # the policy's ceiling; None: the share's own rate
    address: str | None = None  # this address ("10.20.0.5/24"), or
    cidr: str | None = None  # the next free one of this network (the policy's spec.addresses), or none
    interface: str = POD_INTERFACE  # its name in the Pod (tessera.agent.nics.naming)


@dataclass(frozen=True, slots=True)
class NicCheckpoint:
    """The shares this node has made, by key, with their state; the uplinks set up for them."""

    shares: dict[str, tuple[Share, ShareState]]
    uplinks: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": CHECKPOINT_KIND,
            "version": CHECKPOINT_VERSION,
            "uplinks": sorted(self.uplinks),
            "shares": {
                key: {**asdict(share), "state": state.value} for key, (share, state) in sorted(self.shares.items())
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NicCheckpoint:
        if data.get("kind") != CHECKPOINT_KIND or data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"not a version {CHECKPOINT_VERSION} {CHECKPOINT_KIND}")
        shares = {}
        for key, entry in data.get("shares", {}).items():
            fields = {k: v for k, v in entry.items() if k != "state"}
            shares[key] = (Share(**fields), ShareState(entry["state"]))
        return cls(shares, frozenset(data.get("uplinks", ())))


def load_checkpoint(path: Path) -> NicCheckpoint:
    if not path.exists():
        return NicCheckpoint({}, frozenset())
    return NicCheckpoint.from_json(json.loads(path.read_text()))


def save_checkpoint(path: Path, checkpoint: NicCheckpoint) -> None:
    """Replace the file atomically (write a sibling, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(checkpoint.to_json(), out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class NicFamily:
    """Shares of this node's NICs (``tessera.agent.family.DeviceFamily``)."""

    driver = NIC_DRIVER

    def __init__(
        self, checkpoint: Path, shaper: UplinkShaper, discover: Callable[[], Sequence[NicStatus]] = lambda: ()
    ) -> None:
        self._path = checkpoint
        self._shaper = shaper
        self._discover = discover
        self._lock = threading.Lock()

    def discover(self) -> Sequence[NicStatus]:
        return self._discover()

    def shares(self, claim_uid: str | None = None) -> list[Share]:
        """The prepared shares (of one claim, or all)."""
        checkpoint = load_checkpoint(self._path)
        return [
            s
            for s, state in checkpoint.shares.values()
            if state is ShareState.PREPARED and (claim_uid is None or s.claim_uid == claim_uid)
        ]

    def prepare(self, claim_uid: str, shares: Sequence[ShareRequest]) -> list[Share]:
        """Make the claim's shares, all or nothing; a claim already prepared is answered as it is."""
        with self._lock:
            checkpoint = load_checkpoint(self._path)
            mine = [s for s, state in checkpoint.shares.values() if s.claim_uid == claim_uid]
            if mine and all(checkpoint.shares[s.key][1] is ShareState.PREPARED for s in mine):
                return sorted(mine, key=lambda s: s.key)
            made = self._plan(checkpoint, claim_uid, shares)
            entries = dict(checkpoint.shares)
            entries.update({s.key: (s, ShareState.PREPARING) for s in made})
            checkpoint = NicCheckpoint(entries, checkpoint.uplinks | {s.uplink for s in made})
            save_checkpoint(self._path, checkpoint)
            try:
                for share in made:
                    self._shaper.ensure_uplink(share.uplink)
                    self._shaper.make_share(share)
            except Exception:
                for share in made:
                    self._shaper.remove_share(share)
                self._forget(checkpoint, made)
                raise
            entries = dict(checkpoint.shares)
            entries.update({s.key: (s, ShareState.PREPARED) for s in made})
            save_checkpoint(self._path, NicCheckpoint(entries, checkpoint.uplinks))
            return made

    def _plan(self, checkpoint: NicCheckpoint, claim_uid: str, requests: Sequence[ShareRequest]) -> list[Share]:
        taken: dict[str, set[int]] = {}
        addresses = {s.address.split("/")[0] for s, _ in checkpoint.shares.values() if s.address}
        for share, _ in checkpoint.shares.values():
            taken.setdefault(share.uplink, set()).add(share.class_minor)
        made = []
        for request in requests:
            used = taken.setdefault(request.uplink, set())
            minor = free_class_minor(used)
            used.add(minor)
            ceiling = max(request.rate_bps, request.ceil_bps or 0)
            address = request.address
            if address is None and request.cidr is not None:
                address = free_address(request.cidr, addresses)
                addresses.add(address.split("/")[0])
            made.append(Share(claim_uid, request.share_id, request.uplink, request.rate_bps, ceiling, minor, address,
                              request.interface))
        return made

    def _forget(self, checkpoint: NicCheckpoint, gone: Sequence[Share]) -> None:
        """Drop ``gone`` from the checkpoint, releasing uplinks left with no share first."""
        keys = {s.key for s in gone}
        entries = {k: v for k, v in checkpoint.shares.items() if k not in keys}
        in_use = {s.uplink for s, _ in entries.values()}
        for uplink in sorted(checkpoint.uplinks - in_use):
            self._shaper.release_uplink(uplink)
        save_checkpoint(self._path, NicCheckpoint(entries, frozenset(checkpoint.uplinks & in_use)))

    def unprepare(self, claim_uid: str) -> None:
        """Remove the claim's shares; a claim with none is already unprepared."""
        with self._lock:
            checkpoint = load_checkpoint(self._path)
            mine = [s for s, _ in checkpoint.shares.values() if s.claim_uid == claim_uid]
            if not mine:
                return
            entries = dict(checkpoint.shares)
            entries.update({s.key: (s, ShareState.UNPREPARING) for s in mine})
            checkpoint = NicCheckpoint(entries, checkpoint.uplinks)
            save_checkpoint(self._path, checkpoint)
            for share in mine:
                self._shaper.remove_share(share)
            self._forget(checkpoint, mine)

    def recover(self) -> None:
        """Finish what a crash interrupted (see the module doc)."""
        with self._lock:
            checkpoint = load_checkpoint(self._path)
            unfinished = [s for s, state in checkpoint.shares.values() if state is not ShareState.PREPARED]
            for share in unfinished:
                self._shaper.remove_share(share)
            if unfinished:
                self._forget(checkpoint, unfinished)
                checkpoint = load_checkpoint(self._path)
            kept = [s for s, _ in checkpoint.shares.values()]
            self._shaper.sweep(checkpoint.uplinks, kept)
            in_use = {s.uplink for s in kept}
            if checkpoint.uplinks - in_use:
                save_checkpoint(self._path, NicCheckpoint(checkpoint.shares, frozenset(in_use)))

    def attach(self, claim_uid: str, pod_netns_path: str) -> None:
        """Put each of the claim's prepared shares into the Pod's network namespace."""
        shares = self.shares(claim_uid)
        if not shares:
            raise ShapingError(f"claim {claim_uid} has no prepared NIC share on this node")
        for share in shares:
            self._shaper.attach(share, pod_netns_path)


def free_address(cidr: str, taken: set[str]) -> str:
    """The lowest host address of ``cidr`` (as ``address/prefix``) not in ``taken``; the first host
    address is left out, for the network's gateway (the fabric's side)."""
    network = ipaddress.ip_network(cidr, strict=False)
    hosts = network.hosts()
    next(hosts, None)
    for host in hosts:
        if str(host) not in taken:
            return f"{host}/{network.prefixlen}"
    raise ShapingError(f"no free address left in {cidr} (spec.addresses of the NIC's policy): widen it")


def attach_from_runtime_state(family: NicFamily, claim_uid: str, state_json: str) -> None:
    """The createRuntime hook's work: the runtime's container state (OCI) names the process whose
    network namespace is the Pod's."""
    state = json.loads(state_json)
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        raise ShapingError("the runtime state on stdin has no pid: run this as a createRuntime hook")
    family.attach(claim_uid, f"/proc/{pid}/ns/net")


def attach_hook(
    claim_uid: str, checkpoint: Path, executable: str = "/usr/local/bin/tessera", agent_pid_file: Path | None = None
) -> dict[str, Any]:
    """The CDI ``containerEdits.hooks`` entry that runs the attach for a claim's shares.

    The runtime runs it on the node's host. Where the agent is a host process (or ``tessera`` is
    installed on the host) the hook runs ``executable`` directly. Where the agent runs in a
    container (the DaemonSet) nothing of Python is on the host: ``agent_pid_file`` (the agent's
    host pid, written at start; the DaemonSet has ``hostPID``) then lets the host's ``/bin/sh``
    enter the agent's mount namespace with util-linux ``nsenter`` and run the image's
    ``executable`` there, still in the host's network namespace and with the runtime's state on
    stdin. The pid file is read when the hook runs, so an agent restarted since prepare serves."""
    args = ["--checkpoint", str(checkpoint), "--claim", claim_uid]
    if agent_pid_file is None:
        return {"hookName": "createRuntime", "path": executable, "args": [*ATTACH_COMMAND, *args]}
    script = (
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin; "
        f'exec nsenter --target "$(cat {agent_pid_file})" --mount -- {executable} {ATTACH_COMMAND[1]} "$@"'
    )
    return {"hookName": "createRuntime", "path": "/bin/sh", "args": ["sh", "-c", script, "tessera-nic-attach", *args]}
