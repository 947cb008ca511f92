"""A network fabric that stands in for a node's NIC and what lies beyond it, for the demo, the
shared-NIC tests and ``benchmarks/bench_nic.py``: a veth pair whose near end is the "uplink"
Tessera shares (in the host's network namespace, where real nodes live, or in a named namespace
that plays the host), and whose far end sits in a namespace of its own with one address, where
iperf3 receivers run. Nothing sent into it leaves these namespaces.

``Fabric.measure`` runs one iperf3 flow per sender (each a network namespace, named or a
``/proc/<pid>/ns/net`` path) at the same time and returns the rate each reached;
``netns_holding`` finds the namespace that holds an interface of a given MAC (a Pod's ``net1``).
Everything goes through iproute2 and util-linux (``ip``, ``nsenter``): this layer does not speak
netlink itself. Not for: making or shaping shares (``tessera.agent.nics``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

FIRST_PORT = 5301


class FabricError(Exception):
    """The fabric could not be made, or a measurement failed; says which command and why."""


def _run(argv: Sequence[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise FabricError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def netns_path(netns: str) -> str:
    """A namespace's file: a path as given, a name as ``ip netns`` keeps it."""
    return netns if netns.startswith("/") else f"/run/netns/{netns}"


@dataclass(frozen=True, slots=True)
class Fabric:
    """The uplink veth (``uplink``) and its far end (``far_end``, in ``netns``, addressed
    ``gateway``, e.g. ``10.97.0.1/24``); ``host_netns``: the named namespace that plays the host,
    None for the host's own."""

    uplink: str
    far_end: str
    netns: str
    gateway: str
    host_netns: str | None = None

    @property
    def address(self) -> str:
        """The receivers' address."""
        return self.gateway.split("/")[0]

    def _ip(self, *argv: str) -> list[str]:
        return ["ip", *(["-n", self.host_netns] if self.host_netns else []), *argv]

    def make(self) -> None:
        """The veth pair, both ends up, the far end addressed; leftovers of a run with the same
        names are removed first. The host's namespace must exist already when one is named."""
        self.remove()
        _run(["ip", "netns", "add", self.netns])
        try:
            _run(self._ip("link", "add", self.uplink, "type", "veth", "peer", "name", self.far_end,
                          "netns", self.netns))  # fmt: skip
            _run(["ip", "-n", self.netns, "addr", "add", self.gateway, "dev", self.far_end])
            for argv in (["ip", "-n", self.netns, "link", "set", self.far_end, "up"],
                         ["ip", "-n", self.netns, "link", "set", "lo", "up"],
                         self._ip("link", "set", self.uplink, "up")):  # fmt: skip
                _run(argv)
        except FabricError:
            self.remove()
            raise

    def remove(self, also: Sequence[str] = ()) -> None:
        """The veth (both ends go together), the fabric's namespace, and the host-side links
        ``also`` names (an uplink's ifb, should a failed run have left it); whatever exists."""
        for link in (self.uplink, *also):
            _run(self._ip("link", "del", link), check=False)
        _run(["ip", "netns", "del", self.netns], check=False)

    def set_uplink(self, up: bool) -> None:
        _run(self._ip("link", "set", self.uplink, "up" if up else "down"))

    def plain_macvlan(self, netns: str, name: str, address: str, interface: str = "net1") -> None:
        """An unshaped macvlan of the uplink, moved into the named namespace ``netns`` as
        ``interface`` with ``address`` and up: a share as it would be without Tessera."""
        _run(self._ip("link", "add", name, "link", self.uplink, "type", "macvlan", "mode", "bridge"))
        _run(self._ip("link", "set", name, "netns", netns))
        for argv in (["link", "set", name, "name", interface], ["addr", "add", address, "dev", interface],
                     ["link", "set", interface, "up"]):  # fmt: skip
            _run(["ip", "-n", netns, *argv])

    def _listening(self, port: int) -> bool:
        shown = _run(["ip", "netns", "exec", self.netns, "ss", "-Hltn", f"sport = :{port}"], check=False)
        return bool(shown.stdout.strip())

    def measure(self, senders: Sequence[str], seconds: int, omit: int = 1, reverse: bool = False) -> list[float]:
        """Bits per second each sender's flow reached, all flows at once (``reverse``: the
        fabric sends, measuring ingress). ``omit`` seconds of TCP slow start come first, uncounted."""
        ports = [FIRST_PORT + i for i in range(len(senders))]
        servers = [
            subprocess.Popen(["ip", "netns", "exec", self.netns, "iperf3", "-s", "-1", "-p", str(port),
                              "-B", self.address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for port in ports
        ]  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not all(self._listening(port) for port in ports):
                if time.monotonic() > deadline or any(s.poll() is not None for s in servers):
                    raise FabricError("the iperf3 receivers did not start listening")
                time.sleep(0.05)
            clients = [
                subprocess.Popen(
                    ["nsenter", f"--net={netns_path(sender)}", "iperf3", "-c", self.address, "-p", str(port),
                     "-t", str(seconds), "-O", str(omit), "-J", *(["-R"] if reverse else [])],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )
                for sender, port in zip(senders, ports, strict=True)
            ]  # fmt: skip
            rates = []
            for client in clients:
                out, err = client.communicate(timeout=seconds + omit + 30)
                try:
                    report = json.loads(out)
                except ValueError as error:
                    raise FabricError(f"iperf3 printed no report: {err.strip() or out[:200]}") from error
                if "error" in report:
                    raise FabricError(f"iperf3: {report['error']} {err.strip()}")
                rates.append(float(report["end"]["sum_received"]["bits_per_second"]))
            return rates
        finally:
            for server in servers:
                server.kill()
                server.wait()


@contextlib.contextmanager
def fabric(uplink: str, far_end: str, netns: str, gateway: str, host_netns: str | None = None,
           also: Sequence[str] = ()) -> Iterator[Fabric]:  # fmt: skip
    """A made fabric, removed on the way out (with the host-side links ``also`` names)."""
    made = Fabric(uplink, far_end, netns, gateway, host_netns)
    made.make()
    try:
        yield made
    finally:
        made.remove(also)


def netns_holding(mac: str) -> str:
    """The ``/proc/<pid>/ns/net`` of a process whose network namespace has an interface with
    ``mac`` (a Pod's share); FabricError when none has."""
    seen: set[int] = set()
    for proc in sorted(Path("/proc").iterdir(), key=lambda p: p.name):
        if not proc.name.isdigit():
            continue
        path = proc / "ns" / "net"
        try:
            inode = os.stat(path).st_ino
        except OSError:
            continue
        if inode in seen:
            continue
        seen.add(inode)
        shown = _run(["nsenter", f"--net={path}", "ip", "-o", "link", "show"], check=False).stdout
        if f"link/ether {mac.lower()} " in shown:
            return str(path)
    raise FabricError(f"no network namespace holds an interface with MAC {mac}")
