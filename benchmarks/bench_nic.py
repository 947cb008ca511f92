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
``unshaped: <measured> Gbit/s`` (both senders together, no shaping), then the latency lines.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyroute2 import NetNS

from tessera.agent.nics.family import NicFamily, ShareRequest
from tessera.agent.nics.shaping import POD_INTERFACE, UplinkShaper, ifb_name
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


# -- through a real node ---------------------------------------------------------------------

REAL_NODE = "nic-bench"


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


def _sleeper_pid(seconds: int) -> int:
    """The host pid of the Pod container whose command is ``sleep <seconds>`` (unique per Pod)."""
    want = f"sleep\0{seconds}\0".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes() == want:
                    return int(proc.name)
            except OSError:
                continue
    raise RuntimeError(f"no container runs sleep {seconds}")


def _iperf_from(fabric: str, netns_paths: list[str], address: str, seconds: int, reverse: bool) -> list[float]:
    """Bits per second each flow reached, all at once, each sender in the network namespace at its path."""
    servers = [subprocess.Popen(["ip", "netns", "exec", fabric, "iperf3", "-s", "-1", "-p", str(5301 + i), "-B",
                                 address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i in range(len(netns_paths))]  # fmt: skip
    time.sleep(0.5)
    clients = [subprocess.Popen(["nsenter", f"--net={path}", "iperf3", "-c", address, "-p", str(5301 + i), "-t",
                                 str(seconds), "-O", "1", "-J", *(["-R"] if reverse else [])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i, path in enumerate(netns_paths)]  # fmt: skip
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


def run_on_a_real_node(args: argparse.Namespace) -> None:
    """Two Pods on a real node (kubelet, containerd, runc) with claims of ``shared-nic.tessera.dev``
    for the two rates; the kubelet's NIC plugin makes the shares and the CDI hook attaches them as
    the Pods' net1. The uplink is a veth whose far end sits in a namespace playing the fabric (one
    iperf3 server per flow). Each Pod's container only sleeps: the sender is the host's iperf3 run
    in that Pod's network namespace (the container's own image has no iperf3), over its net1,
    addressed by the benchmark. Unshaped: the same two senders over plain macvlans of the same
    uplink in namespaces of their own (no Pod, no Tessera)."""
    from tessera.agent.nics.shaping import share_mac
    from tessera.dra.nics import NIC_DRIVER, SHARED_NIC_CLASS
    from tessera.localcluster import LocalCluster
    from tessera.localcluster.cluster import CONTROLLERS, WORKLOAD_CONTROLLERS
    from tessera.localcluster.images import BUSYBOX_IMAGE
    from tessera.localcluster.nodes import RealNode
    from tessera.localcluster.processes import TesseraProcesses
    from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim

    suffix = secrets.token_hex(3)
    uplink, far_end, fabric = f"tb{suffix}", f"tbf{suffix}", f"tsn-bench-{suffix}"
    shares = [int(rate * args.scale) for rate in SHARES]
    step = int(100e6 * min(args.scale, 1.0)) or 1
    _sh("ip", "netns", "add", fabric)
    _sh("ip", "link", "add", uplink, "type", "veth", "peer", "name", far_end)
    _sh("ip", "link", "set", far_end, "netns", fabric)
    _sh("ip", "-n", fabric, "addr", "add", f"{FABRIC_ADDRESS}/24", "dev", far_end)
    for argv in (["ip", "-n", fabric, "link", "set", far_end, "up"], ["ip", "-n", fabric, "link", "set", "lo", "up"],
                 ["ip", "link", "set", uplink, "up"]):
        _sh(*argv)
    node: RealNode | None = None
    plain: list[str] = []
    try:
        with LocalCluster.start(controllers=CONTROLLERS + WORKLOAD_CONTROLLERS) as cluster, \
                tempfile.TemporaryDirectory() as tmp:  # fmt: skip
            cluster.apply(ROOT / "crds", ROOT / "manifests" / "deviceclasses.yaml")
            processes = TesseraProcesses(cluster, Path(tmp))
            try:
                node = RealNode.start(cluster, REAL_NODE)
                processes.operator()
                hook = str(Path(sys.executable).parent / "tessera")
                processes.agent_on(node, "1xH100-80GB", ["--nic-interfaces", uplink, "--nic-attach-executable", hook])
                cluster.apply_objects([{
                    "apiVersion": "tessera.dev/v1alpha1", "kind": "NetworkSharingPolicy",
                    "metadata": {"name": "bench"},
                    "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": REAL_NODE}},
                             "interfaces": [uplink], "lineRate": "10G",
                             "share": {"default": str(step), "min": str(step), "step": str(step)}},
                }])  # fmt: skip
                _wait(lambda: any(s["spec"]["driver"] == NIC_DRIVER and s["spec"].get("devices") for s in
                                  cluster.get_json("resourceslices")["items"]), 120, "the uplink's NIC device")
                _wait(lambda: cluster.kubectl("get", "serviceaccount", "default", check=False).returncode == 0, 60,
                      "the default ServiceAccount")
                objects: list[dict[str, Any]] = []
                for i, rate in enumerate(shares):
                    objects.append(claim_template(f"share-{i}", "default", SHARED_NIC_CLASS,
                                                  capacity={"bandwidth": str(rate)}))
                    objects.append(pod_with_claim(f"sender-{i}", "default", f"share-{i}", on_node(REAL_NODE),
                                                  BUSYBOX_IMAGE, ["sleep", str(36000 + i)]))
                cluster.apply_objects(objects)

                def running() -> bool:
                    pods = cluster.get_json("pods", "-n", "default")["items"]
                    return len(pods) == len(shares) and all(p["status"].get("phase") == "Running" for p in pods)

                _wait(running, 180, "the two sender Pods Running")
                paths = []
                for i in range(len(shares)):
                    pid = _sleeper_pid(36000 + i)
                    pod = cluster.get_json("pod", f"sender-{i}", "-n", "default")
                    claim = cluster.get_json("resourceclaim", pod["status"]["resourceClaimStatuses"][0]
                                             ["resourceClaimName"], "-n", "default")
                    [result] = claim["status"]["allocation"]["devices"]["results"]
                    path = f"/proc/{pid}/ns/net"
                    shown = _sh("nsenter", f"--net={path}", "ip", "-o", "link", "show", POD_INTERFACE).stdout
                    if share_mac(claim["metadata"]["uid"], result["shareID"]) not in shown:
                        raise RuntimeError(f"sender-{i}'s net1 is not its share: {shown}")
                    _sh("nsenter", f"--net={path}", "ip", "addr", "add", f"10.98.0.{10 + i}/24", "dev", POD_INTERFACE)
                    paths.append(path)
                shaped = _iperf_from(fabric, paths, FABRIC_ADDRESS, args.seconds, args.reverse)
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
            _sh("ip", "netns", "add", name)
            plain.append(name)
            _sh("ip", "link", "add", f"tbp{i}{suffix}", "link", uplink, "type", "macvlan", "mode", "bridge")
            _sh("ip", "link", "set", f"tbp{i}{suffix}", "netns", name)
            _sh("ip", "-n", name, "addr", "add", f"10.98.0.{20 + i}/24", "dev", f"tbp{i}{suffix}")
            _sh("ip", "-n", name, "link", "set", f"tbp{i}{suffix}", "up")
        unshaped = _iperf_from(fabric, [f"/run/netns/{n}" for n in plain], FABRIC_ADDRESS, args.seconds, args.reverse)
        print(f"unshaped: {sum(unshaped) / GBIT:.2f} Gbit/s")
    finally:
        for name in plain:
            _sh("ip", "netns", "del", name, check=False)
        _sh("ip", "link", "del", uplink, check=False)
        _sh("ip", "link", "del", ifb_name(uplink), check=False)
        _sh("ip", "netns", "del", fabric, check=False)


def _wait(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
