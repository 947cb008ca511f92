"""Shared-NIC enforcement, measured: two shares of one uplink (2 Gbit/s and 5 Gbit/s) sending
flat out at the same time, each through its Pod's ``net1``, then the same two senders unshaped;
and the prepare / unprepare latency of one share.

The uplink is a veth pair: its near end in a namespace that plays the host (where Tessera's
NicFamily makes the macvlans, HTB classes, ifb and filters, exactly as on a node), its far end in
a namespace that plays the fabric, with one iperf3 server per sender (Debian's iperf3). Each
sender runs in a namespace of its own that plays the Pod's; the share's interface is moved in
through the same attach the CDI createRuntime hook runs. Nothing leaves these namespaces.

Not through a kubelet: the NIC family is not yet served by the kubelet plugin (see the closing
note of issue 19), so this measures the enforcement and the prepare path, not the Pod start.

    .venv/bin/python benchmarks/bench_nic.py [--seconds 8] [--reverse] [--rounds 50]

Prints ``share <rate>: <measured> Gbit/s, <p>% of rate`` per share, then
``unshaped: <measured> Gbit/s`` (both senders together, no shaping), then the latency lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyroute2 import NetNS

from tessera.agent.nics.family import NicFamily, ShareRequest
from tessera.agent.nics.shaping import POD_INTERFACE, UplinkShaper
from tessera.dra.nics import format_rate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the namespace lab lives beside the tests
from tests.nic_lab import FABRIC_ADDRESS, UPLINK, Lab, network_lab  # noqa: E402

GBIT = 10**9
SHARES = (2 * GBIT, 5 * GBIT)


def _iperf_pair(lab: Lab, pods: list[str], seconds: int, reverse: bool) -> list[float]:
    """Bits per second each Pod's flow reached, all flows at once."""
    servers = [
        subprocess.Popen(["ip", "netns", "exec", lab.fabric, "iperf3", "-s", "-1", "-p", str(5301 + i),
                          "-B", FABRIC_ADDRESS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(len(pods))
    ]  # fmt: skip
    time.sleep(0.5)
    clients = [
        subprocess.Popen(
            ["ip", "netns", "exec", pod, "iperf3", "-c", FABRIC_ADDRESS, "-p", str(5301 + i), "-t", str(seconds),
             "-O", "1", "-J", *(["-R"] if reverse else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i, pod in enumerate(pods)
    ]
    rates = []
    for client in clients:
        out, err = client.communicate(timeout=seconds + 30)
        report = json.loads(out)
        if "error" in report:
            raise RuntimeError(f"iperf3: {report['error']} {err}")
        rates.append(float(report["end"]["sum_received"]["bits_per_second"]))
    for server in servers:
        server.kill()
        server.wait()
    return rates


def _plain_macvlan(lab: Lab, pod: str, address: str) -> None:
    """An unshaped macvlan of the uplink as the Pod's net1 (the 'without Tessera' case)."""
    with NetNS(lab.host) as ip:
        uplink = ip.link_lookup(ifname=UPLINK)[0]
        ip.link("add", ifname="plain-" + pod[-2:], kind="macvlan", link=uplink, macvlan_mode="bridge")
        index = ip.link_lookup(ifname="plain-" + pod[-2:])[0]
        ip.link("set", index=index, net_ns_fd=pod)
    with NetNS(pod) as ip:
        index = ip.link_lookup(ifname="plain-" + pod[-2:])[0]
        ip.link("set", index=index, ifname=POD_INTERFACE)
        ip.addr("add", index=index, address=address.split("/")[0], prefixlen=24)
        ip.link("set", index=index, state="up")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8, help="how long the senders send")
    parser.add_argument("--reverse", action="store_true", help="measure ingress (the fabric sends to the Pods)")
    parser.add_argument("--rounds", type=int, default=50, help="prepare/unprepare rounds for the latency figures")
    parser.add_argument(
        "--scale", type=float, default=1.0,
        help="multiply the share rates (0.1: 200M and 500M), for machines whose CPUs cannot push 7 Gbit/s",
    )  # fmt: skip
    args = parser.parse_args()

    with network_lab() as lab, tempfile.TemporaryDirectory() as tmp:
        family = NicFamily(Path(tmp) / "nic-checkpoint.json", UplinkShaper(lab.host))
        shares = [int(rate * args.scale) for rate in SHARES]
        pods = [lab.pod() for _ in shares]
        addresses = [f"10.98.0.{10 + i}/24" for i in range(len(SHARES))]
        for i, (pod, rate) in enumerate(zip(pods, shares, strict=True)):
            family.prepare(f"claim-{i}", [ShareRequest("s0", UPLINK, rate, address=addresses[i])])
            family.attach(f"claim-{i}", f"/run/netns/{pod}")
        shaped = _iperf_pair(lab, pods, args.seconds, args.reverse)
        for rate, measured in zip(shares, shaped, strict=True):
            print(f"share {format_rate(rate)}: {measured / GBIT:.2f} Gbit/s, {100 * measured / rate:.1f}% of rate")

        for i in range(len(SHARES)):
            family.unprepare(f"claim-{i}")
        plain_pods = [lab.pod() for _ in SHARES]
        for pod, address in zip(plain_pods, addresses, strict=True):
            _plain_macvlan(lab, pod, address)
        unshaped = _iperf_pair(lab, plain_pods, args.seconds, args.reverse)
        print(f"unshaped: {sum(unshaped) / GBIT:.2f} Gbit/s")
        for pod in plain_pods:  # their macvlans go with the namespaces
            lab.run(pod, "ip", "link", "del", POD_INTERFACE)

        # Latency: the uplink is held by one share, so each round measures one share's own cost.
        family.prepare("holder", [ShareRequest("s0", UPLINK, GBIT)])
        prepare_ms, unprepare_ms = [], []
        for n in range(args.rounds):
            started = time.perf_counter()
            family.prepare(f"round-{n}", [ShareRequest("s0", UPLINK, 2 * GBIT)])
            prepare_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            family.unprepare(f"round-{n}")
            unprepare_ms.append((time.perf_counter() - started) * 1000)
        family.unprepare("holder")
        for what, values in (("prepare", prepare_ms), ("unprepare", unprepare_ms)):
            print(
                f"NIC share {what}: p50 {statistics.median(values):.1f} ms, "
                f"p99 {_percentile(values, 0.99):.1f} ms ({args.rounds} rounds)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
