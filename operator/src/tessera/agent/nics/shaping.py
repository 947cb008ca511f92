"""Shares of an uplink, made and enforced in the host's network namespace.

Per shared uplink (made once, kept while it has shares):

- an HTB qdisc ``1:`` at the uplink's root: a share's egress (a macvlan transmits through its
  parent's queue) is classified by the share's source MAC into its class;
- an ``ingress`` qdisc on the uplink whose one filter redirects everything to an ifb
  (``tsi<hash>``), with an HTB ``1:`` at the ifb's root: a share's ingress is classified by
  destination MAC into its class there. Redirected frames return to the uplink's receive path
  afterwards, so the macvlan still gets them.

Per share: a macvlan of the uplink (bridge mode, ``tsn<hash>``, its MAC derived from the
claim and share), made down in the host namespace at prepare; HTB class ``1:<minor>`` with
``rate`` = the share and ``ceil`` = the policy's ceiling (or the share) on both the uplink and
the ifb; two u32 filters (priority ``<minor>``). At attach the macvlan moves into the Pod's
network namespace under the share's interface name (``net1``, ``net2``, … or the claim's own:
``tessera.agent.nics.naming``) and comes up. Every qdisc, class and filter stays in the host
namespace, where the Pod cannot reach it. Unclassified traffic (the host's own) is not shaped.

pyroute2 (pinned) speaks netlink for links, qdiscs and classes. The two MAC filters go through
iproute2's ``tc``: a MAC sits before the network header, at negative u32 offsets, which
pyroute2 0.9.7's u32 key encoder cannot write (it packs offsets 0-255 only), and the kernels
this runs on need not carry the flower or basic classifiers (this machine's has u32, bpf, htb,
ingress and mirred only).

Every step of making a share can fail (a seeded ``fault`` hook stands in for the kernel in
tests); ``make_share`` then removes what it made before raising, and ``remove_share`` /
``sweep`` remove a share's pieces idempotently, whatever subset exists.
Not for: deciding which shares exist (``tessera.agent.nics.family``) or publishing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from pyroute2 import IPRoute, NetlinkError, NetNS, protocols

HOST_LINK_PREFIX = "tsn"
IFB_PREFIX = "tsi"
POD_INTERFACE = "net1"
FIRST_CLASS_MINOR = 0x10
LAST_CLASS_MINOR = 0xFFFE
ROOT_HANDLE = 0x10000  # 1:
INGRESS_HANDLE = 0xFFFF0000  # ffff:
_REDIRECT_PRIO = 1
_MIN_BURST = 64 * 1024  # bytes: GSO segments on veth and virtio are up to 64 KiB

Fault = Callable[[str], None]
# Exactly the names host_link_name makes: a sweep never touches another tool's "tsn..." link.
_OUR_HOST_LINK = re.compile(HOST_LINK_PREFIX + r"[0-9a-f]{11}")


class ShapingError(Exception):
    """A share could not be made or attached; what was made of it has been removed."""


@dataclass(frozen=True, slots=True)
class Share:
    """One share of an uplink: everything needed to make it, find it, and remove it."""

    claim_uid: str
    share_id: str
    uplink: str
    rate_bps: int
    ceil_bps: int
    class_minor: int
    address: str | None = None  # "10.20.0.5/24", or None for L2 use
    interface: str = POD_INTERFACE  # its name in the Pod (tessera.agent.nics.naming)

    @property
    def key(self) -> str:
        return share_key(self.claim_uid, self.share_id)

    @property
    def mac(self) -> str:
        return share_mac(self.claim_uid, self.share_id)

    @property
    def host_link(self) -> str:
        return host_link_name(self.claim_uid, self.share_id)


def share_key(claim_uid: str, share_id: str) -> str:
    return f"{claim_uid}/{share_id}"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def share_mac(claim_uid: str, share_id: str) -> str:
    """A locally administered unicast MAC, the same for the same share every time."""
    digest = _digest(f"mac/{share_key(claim_uid, share_id)}")
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def host_link_name(claim_uid: str, share_id: str) -> str:
    """``tsn`` + 11 hex digits: within Linux's 15 characters, and ours by its prefix."""
    return HOST_LINK_PREFIX + _digest(share_key(claim_uid, share_id)).hex()[:11]


def ifb_name(uplink: str) -> str:
    return IFB_PREFIX + _digest(f"ifb/{uplink}").hex()[:11]


def free_class_minor(taken: Collection[int]) -> int:
    """The lowest class minor no share of the uplink holds."""
    for minor in range(FIRST_CLASS_MINOR, LAST_CLASS_MINOR + 1):
        if minor not in taken:
            return minor
    raise ShapingError("no free HTB class left on this uplink")


def burst_bytes(rate_bps: int) -> int:
    """HTB burst: a millisecond at the rate, never below one 64 KiB segment."""
    return max(_MIN_BURST, rate_bps // 8 // 200)


def _mac_words(mac: str) -> tuple[int, int]:
    raw = bytes.fromhex(mac.replace(":", ""))
    return int.from_bytes(raw[:4], "big"), int.from_bytes(raw[4:], "big")


def egress_filter_args(uplink: str, share: Share) -> list[str]:
    """``tc`` arguments: frames leaving the uplink with the share's source MAC go to its class.
    u32 offsets count from the network header: the source MAC is at -8 .. -3."""
    high, low = _mac_words(share.mac)
    return [
        "filter", "add", "dev", uplink, "parent", "1:", "protocol", "all", "prio", str(share.class_minor),
        "u32", "match", "u32", f"0x{high:08x}", "0xffffffff", "at", "-8",
        "match", "u16", f"0x{low:04x}", "0xffff", "at", "-4", "flowid", f"1:{share.class_minor:x}",
    ]  # fmt: skip


def ingress_filter_args(ifb: str, share: Share) -> list[str]:
    """``tc`` arguments: frames for the share's MAC (destination at -14 .. -9) go to its class on the ifb."""
    raw = bytes.fromhex(share.mac.replace(":", ""))
    high, low = int.from_bytes(raw[:2], "big"), int.from_bytes(raw[2:], "big")
    return [
        "filter", "add", "dev", ifb, "parent", "1:", "protocol", "all", "prio", str(share.class_minor),
        "u32", "match", "u16", f"0x{high:04x}", "0xffff", "at", "-14",
        "match", "u32", f"0x{low:08x}", "0xffffffff", "at", "-12", "flowid", f"1:{share.class_minor:x}",
    ]  # fmt: skip


class UplinkShaper:
    """Makes and removes shares in one network namespace: the host's (``netns=None``) or, in
    tests, a named namespace that plays the host."""

    def __init__(self, netns: str | None = None, fault: Fault | None = None) -> None:
        self._netns = netns
        self._fault = fault

    @contextlib.contextmanager
    def _ip(self) -> Iterator[IPRoute]:
        ip = NetNS(self._netns) if self._netns else IPRoute()
        try:
            yield ip
        finally:
            ip.close()

    def _step(self, name: str) -> None:
        if self._fault is not None:
            self._fault(name)

    def _tc(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        prefix = ["ip", "netns", "exec", self._netns] if self._netns else []
        done = subprocess.run([*prefix, "tc", *args], capture_output=True, text=True, timeout=30, check=False)
        if check and done.returncode != 0:
            raise ShapingError(f"tc {' '.join(args)}: {done.stderr.strip()}")
        return done

    @staticmethod
    def _index(ip: IPRoute, name: str) -> int | None:
        found = ip.link_lookup(ifname=name)
        return int(found[0]) if found else None

    # ---- the uplink ------------------------------------------------------------------------

    def ensure_uplink(self, uplink: str) -> None:
        """HTB on the uplink, the ingress redirect and the ifb with its HTB; kept if present."""
        with self._ip() as ip:
            index = self._index(ip, uplink)
            if index is None:
                raise ShapingError(f"uplink {uplink!r} does not exist")
            if not self._has_qdisc(ip, index, ROOT_HANDLE, "htb"):
                self._step("uplink-htb")
                ip.tc("replace", "htb", index, ROOT_HANDLE, default=0)
            ifb = ifb_name(uplink)
            ifb_index = self._index(ip, ifb)
            if ifb_index is None:
                self._step("ifb")
                ip.link("add", ifname=ifb, kind="ifb")
                ifb_index = self._index(ip, ifb)
                assert ifb_index is not None
            ip.link("set", index=ifb_index, state="up")
            if not self._has_qdisc(ip, ifb_index, ROOT_HANDLE, "htb"):
                ip.tc("replace", "htb", ifb_index, ROOT_HANDLE, default=0)
            if not self._has_qdisc(ip, index, INGRESS_HANDLE, "ingress"):
                self._step("ingress")
                ip.tc("add", "ingress", index, INGRESS_HANDLE)
                ip.tc(
                    "add-filter", "u32", index, parent=INGRESS_HANDLE, prio=_REDIRECT_PRIO,
                    protocol=protocols.ETH_P_ALL, keys=["0x0/0x0+0"], target=ROOT_HANDLE,
                    action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb_index},
                )  # fmt: skip

    @staticmethod
    def _has_qdisc(ip: IPRoute, index: int, handle: int, kind: str) -> bool:
        return any(q["handle"] == handle and q.get_attr("TCA_KIND") == kind for q in ip.get_qdiscs(index=index))

    def release_uplink(self, uplink: str) -> None:
        """Remove the uplink's HTB, ingress redirect and ifb (when no share is left)."""
        with self._ip() as ip:
            index = self._index(ip, uplink)
            if index is not None:
                for kind, handle in (("htb", ROOT_HANDLE), ("ingress", INGRESS_HANDLE)):
                    if self._has_qdisc(ip, index, handle, kind):
                        with contextlib.suppress(NetlinkError):
                            ip.tc("del", kind, index, handle)
            ifb = self._index(ip, ifb_name(uplink))
            if ifb is not None:
                with contextlib.suppress(NetlinkError):
                    ip.link("del", index=ifb)

    # ---- one share -------------------------------------------------------------------------

    def make_share(self, share: Share) -> None:
        """The share's macvlan (down, in this namespace), classes and filters; all or nothing."""
        try:
            self._make_share(share)
        except Exception as error:
            self.remove_share(share)
            if isinstance(error, ShapingError):
                raise
            raise ShapingError(f"share {share.key} on {share.uplink}: {error}") from error

    def _make_share(self, share: Share) -> None:
        ifb = ifb_name(share.uplink)
        with self._ip() as ip:
            uplink = self._index(ip, share.uplink)
            ifb_index = self._index(ip, ifb)
            if uplink is None or ifb_index is None:
                raise ShapingError(f"uplink {share.uplink!r} is not set up for shares")
            self._step("macvlan")
            ip.link(
                "add", ifname=share.host_link, kind="macvlan", link=uplink, macvlan_mode="bridge",
                address=share.mac,
            )  # fmt: skip
            burst = burst_bytes(max(share.rate_bps, share.ceil_bps))
            for step, index in (("egress-class", uplink), ("ingress-class", ifb_index)):
                self._step(step)
                ip.tc(
                    "add-class", "htb", index, ROOT_HANDLE | share.class_minor, parent=ROOT_HANDLE,
                    rate=f"{share.rate_bps}bit", ceil=f"{share.ceil_bps}bit", burst=burst, cburst=burst,
                )  # fmt: skip
        self._step("egress-filter")
        self._tc(egress_filter_args(share.uplink, share))
        self._step("ingress-filter")
        self._tc(ingress_filter_args(ifb, share))

    def remove_share(self, share: Share) -> None:
        """Remove whatever of the share exists here: filters, classes, its macvlan."""
        self.remove_pieces(share.uplink, share.class_minor, share.host_link)

    def remove_pieces(self, uplink: str, class_minor: int, host_link: str | None) -> None:
        """Filters and classes first (a class with a filter pointing at it cannot go), then the
        macvlan; each only if it is there."""
        ifb = ifb_name(uplink)
        for device in (uplink, ifb):
            self._tc(["filter", "del", "dev", device, "parent", "1:", "prio", str(class_minor)], check=False)
            self._tc(["class", "del", "dev", device, "classid", f"1:{class_minor:x}"], check=False)
        if host_link:
            with self._ip() as ip:
                link = self._index(ip, host_link)
                if link is not None:
                    with contextlib.suppress(NetlinkError):
                        ip.link("del", index=link)

    def attach(self, share: Share, pod_netns_path: str) -> None:
        """Move the share's macvlan into the Pod's namespace as ``share.interface``, addressed and up.
        Already there: nothing to do. On failure the macvlan is back in this namespace, down,
        as prepare left it, so that the runtime's retry can attach it again."""
        if _same_namespace(pod_netns_path, self._netns_path()):
            # A hostNetwork Pod: "moving" the macvlan would leave it in the host as net1, unshaped
            # by nothing the Pod cannot undo. Refused; the share stays as prepared.
            raise ShapingError(
                f"share {share.key}: the container runs in the host's network namespace (hostNetwork: true?); "
                "a NIC share needs a Pod network namespace of its own"
            )
        with self._ip() as ip:
            index = self._index(ip, share.host_link)
            if index is None:
                if self._attached(share, pod_netns_path):
                    return
                raise ShapingError(f"share {share.key}: its interface {share.host_link} is not prepared")
            self._refuse_taken_name(share, pod_netns_path)
            try:
                fd = os.open(pod_netns_path, os.O_RDONLY)
                try:
                    self._step("move")
                    ip.link("set", index=index, net_ns_fd=fd)
                finally:
                    os.close(fd)
            except (OSError, NetlinkError) as error:  # not moved: still here, as prepared
                raise ShapingError(f"share {share.key}: cannot move into {pod_netns_path}: {error}") from error
        try:
            with _in_netns(pod_netns_path) as pod:
                moved = self._index(pod, share.host_link)
                if moved is None:
                    raise ShapingError(f"share {share.key}: {share.host_link} vanished while moving")
                self._step("rename")
                pod.link("set", index=moved, ifname=share.interface)
                if share.address:
                    self._step("address")
                    host, prefix = share.address.split("/")
                    pod.addr("add", index=moved, address=host, prefixlen=int(prefix))
                self._step("up")
                pod.link("set", index=moved, state="up")
        except Exception as error:
            self._undo_attach(share, pod_netns_path)
            raise ShapingError(f"share {share.key}: attach to {pod_netns_path} failed: {error}") from error

    @staticmethod
    def _refuse_taken_name(share: Share, pod_netns_path: str) -> None:
        """Another interface of the Pod has the share's name already (a claim of this Pod that
        was prepared on its own, with the same ``net<N>``): refused before anything moves."""
        try:
            with _in_netns(pod_netns_path) as pod:
                taken = bool(pod.link_lookup(ifname=share.interface))
        except (OSError, NetlinkError) as error:
            raise ShapingError(f"share {share.key}: cannot read {pod_netns_path}: {error}") from error
        if taken:
            raise ShapingError(
                f"share {share.key}: the Pod has an interface named {share.interface} already; name the shares "
                "with a NicShareConfig interfaceName in the claims' opaque config (nic.tessera.dev)"
            )

    def _netns_path(self) -> str:
        return f"/run/netns/{self._netns}" if self._netns else "/proc/self/ns/net"

    def _attached(self, share: Share, pod_netns_path: str) -> bool:
        try:
            with _in_netns(pod_netns_path) as pod:
                return any(
                    link.get_attr("IFLA_ADDRESS") == share.mac for link in pod.get_links()
                )
        except (OSError, NetlinkError):
            return False

    def _undo_attach(self, share: Share, pod_netns_path: str) -> None:
        """Delete the half-set-up interface in the Pod, then make it afresh here, down."""
        with contextlib.suppress(OSError, NetlinkError), _in_netns(pod_netns_path) as pod:
            for link in pod.get_links():
                if link.get_attr("IFLA_ADDRESS") == share.mac:
                    pod.link("del", index=link["index"])
        with self._ip() as ip:
            uplink = self._index(ip, share.uplink)
            if uplink is not None and self._index(ip, share.host_link) is None:
                ip.link(
                    "add", ifname=share.host_link, kind="macvlan", link=uplink, macvlan_mode="bridge",
                    address=share.mac,
                )  # fmt: skip

    # ---- what is there ---------------------------------------------------------------------

    def class_minors(self, uplink: str) -> set[int]:
        """The share classes on the uplink (the root's children), by minor."""
        with self._ip() as ip:
            index = self._index(ip, uplink)
            if index is None:
                return set()
            return {
                c["handle"] & 0xFFFF
                for c in ip.get_classes(index=index)
                if c["handle"] >> 16 == 1 and c["handle"] & 0xFFFF >= FIRST_CLASS_MINOR
            }

    def host_links(self) -> set[str]:
        """Our share macvlans still in this namespace (by the exact shape of their names)."""
        with self._ip() as ip:
            names = (link.get_attr("IFLA_IFNAME") for link in ip.get_links())
            return {n for n in names if n and _OUR_HOST_LINK.fullmatch(n)}

    def filter_prios(self, device: str) -> set[int]:
        shown = self._tc(["filter", "show", "dev", device, "parent", "1:"], check=False).stdout
        prios = set()
        for line in shown.splitlines():
            words = line.split()
            if "pref" in words:
                prios.add(int(words[words.index("pref") + 1]))
        return prios

    def sweep(self, uplinks: Collection[str], keep: Collection[Share]) -> None:
        """Remove every share piece on ``uplinks`` (and every ``tsn`` macvlan here) that no
        share in ``keep`` owns; release an uplink left with no share."""
        kept_links = {s.host_link for s in keep}
        for link in self.host_links() - kept_links:
            with self._ip() as ip:
                index = self._index(ip, link)
                if index is not None:
                    with contextlib.suppress(NetlinkError):
                        ip.link("del", index=index)
        for uplink in uplinks:
            kept = {s.class_minor for s in keep if s.uplink == uplink}
            found = self.class_minors(uplink) | self.class_minors(ifb_name(uplink))
            prios = self.filter_prios(uplink) | self.filter_prios(ifb_name(uplink))
            found |= {p for p in prios if p >= FIRST_CLASS_MINOR}
            for minor in found - kept:
                self.remove_pieces(uplink, minor, None)
            if not kept:
                self.release_uplink(uplink)


def _same_namespace(path: str, other: str) -> bool:
    """Whether two namespace files name one namespace (same device and inode)."""
    try:
        a, b = os.stat(path), os.stat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def _in_netns(path: str) -> Iterator[IPRoute]:
    """A netlink socket inside the namespace at ``path`` (``/proc/<pid>/ns/net`` or ``/run/netns/<name>``)."""
    ip = NetNS(path)
    try:
        yield ip
    finally:
        ip.close()
