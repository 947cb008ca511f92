"""A network lab in namespaces of its own, for the shared-NIC tests and the benchmark: a namespace
that plays the host (with the fabric's veth standing in for the uplink, ``tessera.localcluster.fabric``),
the fabric on the far side (a receiver at 10.98.0.1), and Pod namespaces. Names carry a random
suffix, so parallel runs and other users of the machine never meet; nothing is sent outside
these namespaces."""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from pyroute2 import NetNS, netns

from tessera.localcluster.fabric import Fabric, fabric

FABRIC_ADDRESS = "10.98.0.1"
UPLINK = "uplink0"


@dataclass
class Lab:
    host: str
    net: Fabric
    pods: list[str] = field(default_factory=list)

    @property
    def fabric(self) -> str:
        """The fabric's namespace."""
        return self.net.netns

    def pod(self) -> str:
        name = f"{self.host}-p{len(self.pods)}"
        netns.create(name)
        self.pods.append(name)
        with NetNS(name) as ip:
            ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")
        return name

    def run(self, namespace: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def links(self, namespace: str) -> set[str]:
        with NetNS(namespace) as ip:
            return {link.get_attr("IFLA_IFNAME") for link in ip.get_links()}

    def tc_state(self) -> str:
        """Every qdisc, class and filter on the host's links, as tc prints them (less counters)."""
        out = []
        for link in sorted(self.links(self.host)):
            for what in ("qdisc", "class", "filter"):
                out.append(self.run(self.host, "tc", what, "show", "dev", link).stdout)
        out.append(self.run(self.host, "tc", "filter", "show", "dev", UPLINK, "ingress").stdout)
        return re.sub(r"direct_packets_stat \d+ ", "", "".join(out))  # a counter, not a piece


@contextmanager
def network_lab() -> Iterator[Lab]:
    suffix = secrets.token_hex(3)
    host = f"tsn-h-{suffix}"
    netns.create(host)
    lab: Lab | None = None
    try:
        with fabric(UPLINK, "fabric0", f"tsn-f-{suffix}", f"{FABRIC_ADDRESS}/24", host_netns=host) as net:
            lab = Lab(host, net)
            yield lab
    finally:
        for name in (*(lab.pods if lab else ()), host):
            with suppress(OSError):
                netns.remove(name)
