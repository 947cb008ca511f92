"""Shares of an uplink made, enforced and removed in real network namespaces on this machine
(tessera.agent.nics): a namespace plays the host, a veth stands in for the uplink, traffic goes
only to a receiver in a namespace on its far side. Faults are injected at every step, seeded so
that a failure replays."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroute2 import NetNS

from tessera.agent.nics.family import (
    NicCheckpoint,
    NicFamily,
    ShareRequest,
    ShareState,
    attach_from_runtime_state,
    attach_hook,
    load_checkpoint,
    save_checkpoint,
)
from tessera.agent.nics.report import attach_failures
from tessera.agent.nics.shaping import POD_INTERFACE, ShapingError, Share, UplinkShaper, host_link_name, ifb_name
from tests.nic_lab import FABRIC_ADDRESS, UPLINK, Lab, network_lab

GBIT = 10**9
PREPARE_STEPS = ("uplink-htb", "ifb", "ingress", "macvlan", "egress-class", "ingress-class", "egress-filter",
                 "ingress-filter")  # fmt: skip
ATTACH_STEPS = ("move", "rename", "address", "up")


class InjectedFaultError(OSError):
    """The kernel said no."""


class AgentCrash(BaseException):
    """The agent died here: nothing of its own cleanup runs."""


class Faults:
    """Raises ``error`` at the ``nth`` time ``step`` is reached (a seeded choice in the tests)."""

    def __init__(self) -> None:
        self.step: str | None = None
        self.nth = 1
        self.error: type[BaseException] = InjectedFaultError
        self.seen: dict[str, int] = {}

    def arm(self, step: str, nth: int = 1, error: type[BaseException] = InjectedFaultError) -> None:
        self.step, self.nth, self.error, self.seen = step, nth, error, {}

    def __call__(self, step: str) -> None:
        self.seen[step] = self.seen.get(step, 0) + 1
        if step == self.step and self.seen[step] == self.nth:
            self.step = None
            raise self.error(f"injected at {step}")


@pytest.fixture
def lab() -> Iterator[Lab]:
    with network_lab() as made:
        yield made


def _family(lab: Lab, tmp_path: Path, faults: Faults | None = None) -> NicFamily:
    return NicFamily(tmp_path / "nic-checkpoint.json", UplinkShaper(lab.host, fault=faults))


def _state(lab: Lab) -> tuple[str, frozenset[str]]:
    return lab.tc_state(), frozenset(lab.links(lab.host))


def _pod_process(lab: Lab, pod: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ip", "netns", "exec", pod, "sleep", "60"])


def _udp_echo(lab: Lab, pod: str, address: str) -> None:
    """20 datagrams from the Pod's net1 to the fabric and back."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", lab.fabric, "python3", "-c",
         "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
         f"s.bind(('{FABRIC_ADDRESS}',5001))\nfor _ in range(20):\n d,a=s.recvfrom(4096);s.sendto(d,a)"]
    )  # fmt: skip
    client = (
        "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        f"s.bind(('{address.split('/')[0]}',0));s.settimeout(1)\nn=0\nt=time.time()+15\n"
        "while n<20 and time.time()<t:\n"
        f" s.sendto(b'x'*1000,('{FABRIC_ADDRESS}',5001))\n"
        " try:\n  s.recv(4096);n+=1\n except OSError: pass\nprint(n)"
    )
    done = lab.run(pod, "python3", "-c", client)
    server.kill()
    server.wait()
    assert done.stdout.strip() == "20", done.stderr


def _sent_bytes(lab: Lab, device: str, minor: int) -> int:
    shown = lab.run(lab.host, "tc", "-s", "class", "show", "dev", device, "classid", f"1:{minor:x}").stdout
    words = shown.split()
    return int(words[words.index("Sent") + 1])


def test_a_share_is_attached_as_net1_shaped_both_ways_and_unprepare_leaves_nothing(lab: Lab, tmp_path: Path) -> None:
    baseline = _state(lab)
    family = _family(lab, tmp_path)
    [share] = family.prepare("claim-a", [ShareRequest("s0", UPLINK, 2 * GBIT, address="10.98.0.2/24")])
    assert share.rate_bps == share.ceil_bps == 2 * GBIT
    shown = lab.run(lab.host, "tc", "class", "show", "dev", UPLINK).stdout
    assert f"class htb 1:{share.class_minor:x} root" in shown
    assert "rate 2Gbit ceil 2Gbit" in shown
    assert "rate 2Gbit ceil 2Gbit" in lab.run(lab.host, "tc", "class", "show", "dev", ifb_name(UPLINK)).stdout

    pod = lab.pod()
    process = _pod_process(lab, pod)
    try:
        attach_from_runtime_state(family, "claim-a", json.dumps({"ociVersion": "1.2.0", "pid": process.pid}))
        attach_from_runtime_state(family, "claim-a", json.dumps({"pid": process.pid}))  # the Pod's next container
    finally:
        process.kill()
        process.wait()
    assert lab.links(pod) == {"lo", POD_INTERFACE}
    assert share.mac in lab.run(pod, "ip", "link", "show", POD_INTERFACE).stdout
    assert share.host_link not in lab.links(lab.host)

    _udp_echo(lab, pod, "10.98.0.2/24")
    assert _sent_bytes(lab, UPLINK, share.class_minor) >= 20 * 1000, "egress is classified into the share"
    assert _sent_bytes(lab, ifb_name(UPLINK), share.class_minor) >= 20 * 1000, "ingress is classified too"

    family.unprepare("claim-a")
    family.unprepare("claim-a")  # again: nothing to do
    assert _state(lab) == baseline
    assert load_checkpoint(tmp_path / "nic-checkpoint.json").shares == {}


def test_a_container_in_the_hosts_network_namespace_is_refused_and_the_share_stays_as_prepared(
    lab: Lab, tmp_path: Path
) -> None:
    family = _family(lab, tmp_path)
    family.prepare("claim-h", [ShareRequest("s0", UPLINK, 2 * GBIT)])
    prepared = _state(lab)
    host_process = _pod_process(lab, lab.host)  # a hostNetwork Pod's container shares the host's namespace
    try:
        for _ in range(500):  # until `ip netns exec` has entered the namespace
            if os.stat(f"/proc/{host_process.pid}/ns/net").st_ino == os.stat(f"/run/netns/{lab.host}").st_ino:
                break
            time.sleep(0.01)
        with pytest.raises(ShapingError, match="host's network namespace"):
            attach_from_runtime_state(family, "claim-h", json.dumps({"pid": host_process.pid}))
    finally:
        host_process.kill()
        host_process.wait()
    assert _state(lab) == prepared, "nothing renamed, moved or brought up"
    assert POD_INTERFACE not in lab.links(lab.host)
    family.unprepare("claim-h")


def test_shares_of_one_uplink_get_classes_of_their_own_and_prepare_is_idempotent(lab: Lab, tmp_path: Path) -> None:
    family = _family(lab, tmp_path)
    first = family.prepare("claim-a", [ShareRequest("s0", UPLINK, 2 * GBIT, ceil_bps=10 * GBIT)])
    second = family.prepare("claim-b", [ShareRequest("s0", UPLINK, 5 * GBIT)])
    assert family.prepare("claim-a", [ShareRequest("s0", UPLINK, 2 * GBIT, ceil_bps=10 * GBIT)]) == first
    assert first[0].class_minor != second[0].class_minor
    shown = lab.run(lab.host, "tc", "class", "show", "dev", UPLINK).stdout
    assert "rate 2Gbit ceil 10Gbit" in shown
    assert "rate 5Gbit ceil 5Gbit" in shown
    family.unprepare("claim-a")
    assert first[0].host_link not in lab.links(lab.host)
    assert second[0].host_link in lab.links(lab.host)
    assert f"1:{second[0].class_minor:x}" in lab.run(lab.host, "tc", "class", "show", "dev", UPLINK).stdout


@pytest.mark.parametrize("seed", range(12))
def test_a_fault_at_any_step_of_prepare_leaves_nothing_of_the_claim(lab: Lab, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    faults = Faults()
    family = _family(lab, tmp_path, faults)
    if rng.random() < 0.5:  # sometimes another claim already holds the uplink
        family.prepare("other", [ShareRequest("s0", UPLINK, GBIT)])
        steps = PREPARE_STEPS[3:]
    else:
        steps = PREPARE_STEPS
    before = _state(lab)
    before_checkpoint = load_checkpoint(tmp_path / "nic-checkpoint.json")
    step = rng.choice(steps)
    faults.arm(step, nth=rng.randint(1, 2) if step in PREPARE_STEPS[3:] else 1)
    requests = [ShareRequest("s0", UPLINK, 2 * GBIT), ShareRequest("s1", UPLINK, 3 * GBIT)]
    try:
        family.prepare("claim-x", requests)
    except (ShapingError, InjectedFaultError):
        assert _state(lab) == before, f"seed {seed}: fault at {step} left pieces behind"
        assert load_checkpoint(tmp_path / "nic-checkpoint.json") == before_checkpoint
    else:
        assert faults.seen.get(step, 0) < faults.nth, f"seed {seed}: the fault at {step} did not fire"
        family.unprepare("claim-x")
        assert _state(lab) == before


@pytest.mark.parametrize("seed", range(12))
def test_a_crash_at_any_step_is_finished_by_recover(lab: Lab, tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    faults = Faults()
    family = _family(lab, tmp_path, faults)
    family.prepare("keep", [ShareRequest("s0", UPLINK, GBIT)])
    kept = _state(lab)
    crash_in_unprepare = rng.random() < 0.3
    if crash_in_unprepare:
        family.prepare("claim-x", [ShareRequest("s0", UPLINK, 2 * GBIT)])
        with pytest.raises(AgentCrash):
            _crash_during_unprepare(family, "claim-x")
    else:
        faults.arm(rng.choice(PREPARE_STEPS[3:]), nth=1, error=AgentCrash)
        with pytest.raises(AgentCrash):
            family.prepare("claim-x", [ShareRequest("s0", UPLINK, 2 * GBIT)])
    restarted = _family(lab, tmp_path)
    restarted.recover()
    assert _state(lab) == kept, f"seed {seed}: recover left the crash's pieces"
    assert [s.claim_uid for s in restarted.shares()] == ["keep"]
    restarted.unprepare("keep")
    assert lab.links(lab.host) == {"lo", UPLINK}


def _crash_during_unprepare(family: NicFamily, claim_uid: str) -> None:
    """Unprepare that dies after writing Unpreparing and removing half of the pieces."""
    shaper: UplinkShaper = family._shaper
    checkpoint = load_checkpoint(family._path)
    [share] = [s for s, _ in checkpoint.shares.values() if s.claim_uid == claim_uid]
    entries = dict(checkpoint.shares)
    entries[share.key] = (share, ShareState.UNPREPARING)
    save_checkpoint(family._path, NicCheckpoint(entries, checkpoint.uplinks))
    shaper._tc(["filter", "del", "dev", UPLINK, "parent", "1:", "prio", str(share.class_minor)])
    raise AgentCrash("died halfway through unprepare")


@pytest.mark.parametrize("step", ATTACH_STEPS)
def test_a_failed_attach_leaves_the_pod_untouched_and_the_share_ready_for_the_retry(
    lab: Lab, tmp_path: Path, step: str
) -> None:
    faults = Faults()
    family = _family(lab, tmp_path, faults)
    [share] = family.prepare("claim-a", [ShareRequest("s0", UPLINK, GBIT, address="10.98.0.3/24")])
    pod = lab.pod()
    faults.arm(step)
    with pytest.raises(ShapingError):
        family.attach("claim-a", f"/run/netns/{pod}")
    assert lab.links(pod) == {"lo"}
    assert share.host_link in lab.links(lab.host)
    family.attach("claim-a", f"/run/netns/{pod}")
    assert lab.links(pod) == {"lo", POD_INTERFACE}


def test_recover_sweeps_share_pieces_that_no_checkpoint_owns(lab: Lab, tmp_path: Path) -> None:
    baseline = _state(lab)
    family = _family(lab, tmp_path)
    family.prepare("claim-a", [ShareRequest("s0", UPLINK, GBIT)])
    stray = Share("lost", "s9", UPLINK, GBIT, GBIT, 0x99)
    UplinkShaper(lab.host).make_share(stray)  # made by an agent whose checkpoint was lost
    assert host_link_name("lost", "s9") in lab.links(lab.host)
    family.recover()
    assert host_link_name("lost", "s9") not in lab.links(lab.host)
    assert "1:99" not in lab.run(lab.host, "tc", "class", "show", "dev", UPLINK).stdout
    assert [s.claim_uid for s in family.shares()] == ["claim-a"]
    family.unprepare("claim-a")
    assert _state(lab) == baseline


def test_the_cdi_hook_runs_the_attach_at_create_runtime() -> None:
    hook = attach_hook("uid-1", Path("/var/lib/tessera/nic-checkpoint.json"))
    assert hook == {
        "hookName": "createRuntime",
        "path": "/usr/local/bin/tessera",
        "args": ["tessera", "nic-attach", "--checkpoint", "/var/lib/tessera/nic-checkpoint.json", "--claim", "uid-1"],
    }


def test_attach_refuses_a_runtime_state_without_a_pid(tmp_path: Path) -> None:
    family = NicFamily(tmp_path / "cp.json", UplinkShaper("unused"))
    with pytest.raises(ShapingError, match="no pid"):
        attach_from_runtime_state(family, "uid", "{}")


def test_the_tessera_nic_attach_command_attaches_from_the_runtime_state_on_stdin(lab: Lab, tmp_path: Path) -> None:
    checkpoint = tmp_path / "nic-checkpoint.json"
    family = NicFamily(checkpoint, UplinkShaper(lab.host))
    family.prepare("claim-hook", [ShareRequest("s0", UPLINK, GBIT)])
    pod = lab.pod()
    process = _pod_process(lab, pod)
    command = [str(Path(sys.executable).parent / "tessera"), "nic-attach", "--checkpoint", str(checkpoint),
               "--host-netns", lab.host]  # fmt: skip
    try:
        done = subprocess.run([*command, "--claim", "claim-hook"], input=json.dumps({"pid": process.pid}),
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert lab.links(pod) == {"lo", POD_INTERFACE}
        refused = subprocess.run([*command, "--claim", "no-such-claim"], input=json.dumps({"pid": process.pid}),
                                 capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert refused.returncode == 1
        assert "claim no-such-claim has no prepared NIC share" in refused.stderr
        # The reason is left for the agent to report on the claim; a later attach that works clears it.
        reason = refused.stderr.strip().removeprefix("tessera nic-attach: ")
        assert attach_failures(checkpoint) == {"no-such-claim": reason}
        family.prepare("no-such-claim", [ShareRequest("s0", UPLINK, GBIT)])
        other = _pod_process(lab, lab.pod())
        try:
            again = subprocess.run([*command, "--claim", "no-such-claim"], input=json.dumps({"pid": other.pid}),
                                   capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        finally:
            other.kill()
            other.wait()
        assert again.returncode == 0, again.stderr
        assert attach_failures(checkpoint) == {}
        family.unprepare("no-such-claim")
    finally:
        process.kill()
        process.wait()


def test_the_sweep_leaves_links_that_only_look_like_ours(lab: Lab, tmp_path: Path) -> None:
    with NetNS(lab.host) as ip:
        ip.link("add", ifname="tsn4", kind="veth", peer={"ifname": "tsn5"})  # another tool's names
    _family(lab, tmp_path).recover()
    assert {"tsn4", "tsn5"} <= lab.links(lab.host)


def test_in_a_container_the_hook_enters_the_agents_mount_namespace_by_the_pid_it_wrote(tmp_path: Path) -> None:
    pid_file = tmp_path / "agent.pid"
    hook = attach_hook("uid-1", Path("/cp.json"), "/usr/local/bin/tessera", agent_pid_file=pid_file)
    assert hook["hookName"] == "createRuntime"
    assert hook["path"] == "/bin/sh"
    # Run the hook's script as the runtime would, with nsenter replaced by a stand-in that shows its argv.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsenter").write_text('#!/bin/sh\necho "$@"\n')
    (bin_dir / "nsenter").chmod(0o755)
    pid_file.write_text("4242\n")
    script = hook["args"][2].replace("PATH=", f"PATH={bin_dir}:", 1)
    done = subprocess.run(["/bin/sh", "-c", script, *hook["args"][3:]], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "--target", "4242", "--mount", "--", "/usr/local/bin/tessera", "nic-attach",
        "--checkpoint", "/cp.json", "--claim", "uid-1",
    ]  # fmt: skip


def test_shares_take_the_lowest_free_address_of_their_network_and_give_it_back(lab: Lab, tmp_path: Path) -> None:
    family = _family(lab, tmp_path)
    [a] = family.prepare("claim-a", [ShareRequest("s0", UPLINK, GBIT, cidr="10.98.0.0/24")])
    [b] = family.prepare("claim-b", [ShareRequest("s0", UPLINK, GBIT, cidr="10.98.0.0/24")])
    assert (a.address, b.address) == ("10.98.0.2/24", "10.98.0.3/24"), "the first host address is the gateway's"
    family.unprepare("claim-a")
    [c] = family.prepare("claim-c", [ShareRequest("s0", UPLINK, GBIT, cidr="10.98.0.0/24")])
    assert c.address == "10.98.0.2/24"
    family.unprepare("claim-b")
    family.unprepare("claim-c")


def test_a_network_with_no_free_address_refuses_the_claim_and_makes_nothing(lab: Lab, tmp_path: Path) -> None:
    family = _family(lab, tmp_path)
    baseline = _state(lab)
    [only] = family.prepare("claim-a", [ShareRequest("s0", UPLINK, GBIT, cidr="10.98.0.0/30")])
    assert only.address == "10.98.0.2/30"
    with_one = _state(lab)
    with pytest.raises(ShapingError, match=r"no free address left in 10\.98\.0\.0/30"):
        family.prepare("claim-b", [ShareRequest("s0", UPLINK, GBIT, cidr="10.98.0.0/30")])
    assert _state(lab) == with_one
    assert [s.claim_uid for s in family.shares()] == ["claim-a"]
    family.unprepare("claim-a")
    assert _state(lab) == baseline


def test_a_share_whose_name_the_pod_has_already_is_refused_and_stays_as_prepared(lab: Lab, tmp_path: Path) -> None:
    """Two claims of one Pod prepared apart (one was shared with a Pod running before) may both be
    net1: the second attach says how to name them and leaves its share ready for a retry."""
    family = _family(lab, tmp_path)
    [first] = family.prepare("claim-a", [ShareRequest("s0", UPLINK, GBIT)])
    [second] = family.prepare("claim-b", [ShareRequest("s0", UPLINK, GBIT)])
    assert first.interface == second.interface == POD_INTERFACE
    pod = lab.pod()
    family.attach("claim-a", f"/run/netns/{pod}")
    with pytest.raises(ShapingError, match="has an interface named net1 already; name the shares with"):
        family.attach("claim-b", f"/run/netns/{pod}")
    assert lab.links(pod) == {"lo", POD_INTERFACE}
    assert first.mac in lab.run(pod, "ip", "link", "show", POD_INTERFACE).stdout, "the first share is untouched"
    assert second.host_link in lab.links(lab.host), "the second is as prepared"
    other = lab.pod()
    family.attach("claim-b", f"/run/netns/{other}")
    assert lab.links(other) == {"lo", POD_INTERFACE}


def test_a_checkpoint_written_before_shares_had_names_reads_them_as_net1(tmp_path: Path) -> None:
    path = tmp_path / "nic-checkpoint.json"
    share = {"claim_uid": "c", "share_id": "s", "uplink": UPLINK, "rate_bps": GBIT, "ceil_bps": GBIT,
             "class_minor": 16, "address": None, "state": "Prepared"}  # fmt: skip
    path.write_text(json.dumps({"kind": "TesseraNicCheckpoint", "version": 1, "uplinks": [UPLINK],
                                "shares": {"c/s": share}}))  # fmt: skip
    [(read, _)] = load_checkpoint(path).shares.values()
    assert read.interface == POD_INTERFACE
