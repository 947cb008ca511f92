"""Shared-NIC enforcement, measured: two shares of one uplink (2 Gbit/s and 5 Gbit/s) sending
flat out at the same time, each through its Pod's ``net1``, then the same two senders unshaped;
and the prepare / unprepare latency of one share.

The uplink is a veth pair: its near end in a namespace that plays the host (where Tessera's
NicFamily makes the macvlans, HTB classes, ifb and filters, exactly as on a node), its far end in
a namespace that plays the fabric, with one iperf3 server per sender (Debian's iperf3). Each
sender runs in a namespace of its own that plays the Pod's; the share's interface is moved in
through the same attach the CDI createRuntime hook runs. Nothing leaves these namespaces.

With ``--real-node`` the two shares are claims of two Pods on a real node (a kubelet with its own
containerd and runc beside a local control plane, the operator and the node's agent): the
kubelet's NIC plugin makes them and the CDI hook attaches them, as in production; see
``run_on_a_real_node`` for what plays the Pods' senders. No latency lines then.

``--scale`` multiplies both rates (0.1: 200M and 500M): a machine whose CPUs cannot push 7 Gbit/s
through veths measures its own saturation, not the shaping, at full rates.

    .venv/bin/python benchmarks/bench_nic.py [--seconds 8] [--reverse] [--rounds 50] [--scale 1]
    .venv/bin/python benchmarks/bench_nic.py --real-node [--scale 0.1]

Prints ``share <rate>: <measured> Gbit/s, <p>% of rate`` per share, then
``unshaped: <measured> Gbit/s`` (both senders together, no shaping), then the latency lines: a
share's prepare and unprepare, and how soon a link that goes down turns its device unhealthy
through the agent's link-event watcher.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyroute2 import NetNS

from tessera.agent.nics.family import NicFamily, ShareRequest
from tessera.agent.nics.health import NicHealth
from tessera.agent.nics.linkwatch import LinkWatcher
from tessera.agent.nics.shaping import POD_INTERFACE, UplinkShaper, ifb_name
from tessera.dra.nics import format_rate
from tessera.models.nics import LinkState, NicStatus

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the namespace lab lives beside the tests
from tests.nic_lab import FABRIC_ADDRESS, UPLINK, network_lab  # noqa: E402

GBIT = 10**9
SHARES = (2 * GBIT, 5 * GBIT)


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
    parser.add_argument(
        "--real-node", action="store_true",
        help="run the two shares through Pods on a real node (kubelet, containerd, runc; needs root), not namespaces",
    )  # fmt: skip
    args = parser.parse_args()
    if args.real_node:
        run_on_a_real_node(args)
        return 0

    with network_lab() as lab, tempfile.TemporaryDirectory() as tmp:
        family = NicFamily(Path(tmp) / "nic-checkpoint.json", UplinkShaper(lab.host))
        shares = [int(rate * args.scale) for rate in SHARES]
        pods = [lab.pod() for _ in shares]
        addresses = [f"10.98.0.{10 + i}/24" for i in range(len(SHARES))]
        for i, (pod, rate) in enumerate(zip(pods, shares, strict=True)):
            family.prepare(f"claim-{i}", [ShareRequest("s0", UPLINK, rate, address=addresses[i])])
            family.attach(f"claim-{i}", f"/run/netns/{pod}")
        shaped = lab.net.measure(pods, args.seconds, reverse=args.reverse)
        for rate, measured in zip(shares, shaped, strict=True):
            print(f"share {format_rate(rate)}: {measured / GBIT:.2f} Gbit/s, {100 * measured / rate:.1f}% of rate")

        for i in range(len(SHARES)):
            family.unprepare(f"claim-{i}")
        plain_pods = [lab.pod() for _ in SHARES]
        for pod, address in zip(plain_pods, addresses, strict=True):
            lab.net.plain_macvlan(pod, "plain-" + pod[-2:], address, POD_INTERFACE)
        unshaped = lab.net.measure(plain_pods, args.seconds, reverse=args.reverse)
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
        down_ms = _link_down_to_unhealthy(lab.host, args.rounds)
        print(f"link down -> NIC unhealthy (link events): p50 {statistics.median(down_ms):.1f} ms, "
              f"p99 {_percentile(down_ms, 0.99):.1f} ms ({args.rounds} rounds)")  # fmt: skip
    return 0


def _link_down_to_unhealthy(host: str, rounds: int) -> list[float]:
    """Milliseconds from the netlink request that takes the uplink down to its device's health
    turning unhealthy through the agent's link watcher (no pass in between), per round."""
    health = NicHealth()
    health.observe([NicStatus(interface=UPLINK)])
    changed = threading.Event()

    def on_link(name: str, state: LinkState) -> None:
        if health.link_changed(name, state):
            changed.set()

    watcher = LinkWatcher(on_link, netns=host)
    watcher.start()
    took = []
    try:
        with NetNS(host, flags=0) as ip:
            index = ip.link_lookup(ifname=UPLINK)[0]
            for _ in range(rounds):
                for state in ("down", "up"):
                    changed.clear()
                    started = time.perf_counter()
                    ip.link("set", index=index, state=state)
                    if not changed.wait(10):
                        raise RuntimeError(f"no link event for {UPLINK} {state}")
                    if state == "down":
                        took.append((time.perf_counter() - started) * 1000)
    finally:
        watcher.stop()
    return took


# -- through a real node ---------------------------------------------------------------------

REAL_NODE = "nic-bench"


def run_on_a_real_node(args: argparse.Namespace) -> None:
    """Two Pods on a real node (kubelet, containerd, runc) with claims of ``shared-nic.tessera.dev``
    for the two rates; the kubelet's NIC plugin makes the shares and the CDI hook attaches them as
    the Pods' net1, addressed from the policy's network. The uplink is the fabric's veth
    (``tessera.localcluster.fabric``). Each Pod's container only sleeps: the sender is the host's
    iperf3 run in that Pod's network namespace (found by its share's MAC; the container's own
    image has no iperf3), over its net1. Unshaped: the same two senders over plain macvlans of the
    same uplink in namespaces of their own (no Pod, no Tessera)."""
    from tessera.dra.nics import SHARED_NIC_CLASS
    from tessera.localcluster import LocalCluster
    from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS
    from tessera.localcluster.fabric import fabric, netns_holding
    from tessera.localcluster.images import BUSYBOX_IMAGE
    from tessera.localcluster.nodes import RealNode
    from tessera.localcluster.processes import TesseraProcesses
    from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim

    suffix = secrets.token_hex(3)
    uplink = f"tb{suffix}"
    shares = [int(rate * args.scale) for rate in SHARES]
    step = int(100e6 * min(args.scale, 1.0)) or 1
    plain: list[str] = []
    with fabric(uplink, f"tbf{suffix}", f"tsn-bench-{suffix}", f"{FABRIC_ADDRESS}/24",
                also=[ifb_name(uplink)]) as net:  # fmt: skip
        try:
            node: RealNode | None = None
            with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster, \
                    tempfile.TemporaryDirectory() as tmp:  # fmt: skip
                cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
                processes = TesseraProcesses(cluster, Path(tmp))
                try:
                    node = RealNode.start(cluster, REAL_NODE)
                    processes.operator()
                    hook = str(Path(sys.executable).parent / "tessera")
                    processes.agent_on(node, "1xH100-80GB",
                                       ["--nic-interfaces", uplink, "--nic-attach-executable", hook])
                    cluster.apply_objects([{
                        "apiVersion": "tessera.dev/v1alpha1", "kind": "NetworkSharingPolicy",
                        "metadata": {"name": "bench"},
                        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": REAL_NODE}},
                                 "interfaces": [uplink], "lineRate": "10G",
                                 "share": {"default": str(step), "min": str(step), "step": str(step)},
                                 "addresses": {"cidr": f"{FABRIC_ADDRESS}/24"}},
                    }])  # fmt: skip
                    _wait(lambda: cluster.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
                          60, "the default ServiceAccount")
                    objects: list[dict[str, Any]] = []
                    for i, rate in enumerate(shares):
                        objects.append(claim_template(f"share-{i}", "default", SHARED_NIC_CLASS,
                                                      capacity={"bandwidth": str(rate)}))
                        objects.append(pod_with_claim(f"sender-{i}", "default", f"share-{i}", on_node(REAL_NODE),
                                                      BUSYBOX_IMAGE, ["sleep", "36000"]))
                    cluster.apply_objects(objects)

                    def running() -> bool:
                        pods = cluster.get_json("pods", "-n", "default")["items"]
                        return len(pods) == len(shares) and all(p["status"].get("phase") == "Running" for p in pods)

                    _wait(running, 180, "the two sender Pods Running")
                    paths = []
                    for i in range(len(shares)):
                        pod = cluster.get_json("pod", f"sender-{i}", "-n", "default")
                        claim = cluster.get_json("resourceclaim", pod["status"]["resourceClaimStatuses"][0]
                                                 ["resourceClaimName"], "-n", "default")
                        [entry] = claim["status"]["devices"]
                        paths.append(netns_holding(entry["networkData"]["hardwareAddress"]))
                    shaped = net.measure(paths, args.seconds, reverse=args.reverse)
                    for rate, measured in zip(shares, shaped, strict=True):
                        print(f"share {format_rate(rate)}: {measured / GBIT:.2f} Gbit/s, "
                              f"{100 * measured / rate:.1f}% of rate")
                    cluster.kubectl("delete", "pods", "--all", "-n", "default", "--wait=true", "--timeout=90s")
                finally:
                    processes.stop_all()
                    if node is not None:
                        node.stop()
            for i in range(len(shares)):  # the unshaped case: plain macvlans, no Pod, no Tessera
                name = f"tsn-bp{i}-{suffix}"
                subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
                plain.append(name)
                net.plain_macvlan(name, f"tbp{i}{suffix}", f"10.98.0.{20 + i}/24", POD_INTERFACE)
            unshaped = net.measure(plain, args.seconds, reverse=args.reverse)
            print(f"unshaped: {sum(unshaped) / GBIT:.2f} Gbit/s")
        finally:
            for name in plain:
                subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _wait(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
