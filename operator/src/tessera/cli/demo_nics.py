"""The demo's shared NIC: one uplink of ``demo-h100`` sold in bandwidth shares, two Pods holding a
200M and a 500M share, and the rate each Pod reached when both sent flat out at once.

The uplink is the fabric's veth (``tessera.localcluster.fabric``): its near end in the host's
network namespace, where the real nodes live, its far end in a namespace of its own with the
receivers. The node's agent reports it (``--nic-interfaces``), a NetworkSharingPolicy sells it,
the scheduler allocates the two claims from its device, the kubelet's NIC plugin makes the shares
and the CDI hook attaches each as its Pod's ``net1``, addressed from the policy's network. The
demo then finds each Pod's network namespace by its share's MAC, runs the host's iperf3 there
for two seconds (after one uncounted second of slow start), both Pods at once, and prints per
share: its rate, the Pod that holds it, its ``net1``, and what that Pod measured. Real nodes
only: without a runtime no Pod has a network namespace to send from.
Not for: the GPU part of the demo (``tessera.cli.demo``).
"""

from __future__ import annotations

import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.agent.nics.shaping import ifb_name
from tessera.dra.nics import NIC_DRIVER, SHARED_NIC_CLASS, format_rate
from tessera.localcluster.fabric import Fabric, netns_holding
from tessera.localcluster.images import BUSYBOX_IMAGE
from tessera.localcluster.workloads import claim_template, on_node, pod_with_claim
from tessera.models.allocation import allocation_results
from tessera.models.quantity import parse_quantity

NIC_NODE = "demo-h100"
POLICY = "demo-uplink"
NETWORK, GATEWAY = "10.96.0.0/24", "10.96.0.1/24"
SHARES = {"upload-0": "200M", "upload-1": "500M"}  # Pod -> the bandwidth its claim asks for
SEND_SECONDS, SLOW_START_SECONDS = 2, 1
GBIT = 10**9


def why_no_nic(real: bool) -> str | None:
    """None when the demo can show a shared NIC here; otherwise why not, in a few words."""
    if not real:
        return "it needs real nodes, whose Pods have network namespaces to send from"
    for tool in ("iperf3", "ss", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not on PATH (apt-get install iperf3 iproute2 util-linux)"
    return None


@dataclass(frozen=True)
class DemoNic:
    """The fabric the demo made, and what it applies and measures on it."""

    fabric: Fabric

    @classmethod
    def start(cls) -> DemoNic:
        suffix = secrets.token_hex(3)
        fabric = Fabric(f"td{suffix}", f"tdf{suffix}", f"tessera-demo-fabric-{suffix}", GATEWAY)
        fabric.make()
        return cls(fabric)

    def stop(self) -> None:
        """The veth, the fabric's namespace, and the uplink's ifb should the agent have left it."""
        self.fabric.remove(also=[ifb_name(self.fabric.uplink)])

    def agent_flags(self, node: str) -> list[str]:
        """The NIC node's agent reports the uplink; the CDI hook runs this checkout's tessera."""
        if node != NIC_NODE:
            return []
        hook = str(Path(sys.executable).parent / "tessera")
        return ["--nic-interfaces", self.fabric.uplink, "--nic-attach-executable", hook]

    def objects(self, namespace: str) -> list[dict[str, Any]]:
        """The policy that sells the uplink, and per Pod its claim template and the Pod."""
        policy = {
            "apiVersion": "tessera.dev/v1alpha1", "kind": "NetworkSharingPolicy", "metadata": {"name": POLICY},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NIC_NODE}},
                     "interfaces": [self.fabric.uplink], "lineRate": "1G",
                     "share": {"default": "100M", "min": "100M", "step": "100M"}, "addresses": {"cidr": NETWORK}},
        }  # fmt: skip
        out: list[dict[str, Any]] = [policy]
        for pod, rate in SHARES.items():
            template = f"{pod}-{rate.lower()}"
            out.append(claim_template(template, namespace, SHARED_NIC_CLASS, capacity={"bandwidth": rate}))
            hold = ["sh", "-c", "ip -o -4 addr show net1; echo ready; exec sleep 86400"]
            out.append(pod_with_claim(pod, namespace, template, on_node(NIC_NODE), BUSYBOX_IMAGE, hold))
        return out

    def show(self, target: Any, namespace: str, timeout: float) -> list[str]:
        """Wait for the Pods, measure both at once, and say per share who holds it and what it got."""
        holders = _wait_attached(target, namespace, timeout)
        paths = [netns_holding(h["mac"]) for h in holders]
        rates = self.fabric.measure(paths, SEND_SECONDS, omit=SLOW_START_SECONDS)
        device = holders[0]["device"]
        lines = [f"Shared NIC on {NIC_NODE}: device {device} (veth {self.fabric.uplink} standing in for the "
                 f"uplink), NetworkSharingPolicy {POLICY}, 1G sold in 100M steps"]  # fmt: skip
        for holder, measured in zip(holders, rates, strict=True):
            share = holder["rate"]
            lines.append(
                f"  share {format_rate(share):<5} <- {holder['pod']}  net1 {holder['address']}  "
                f"measured {measured / GBIT:.3f} Gbit/s, {100 * measured / share:.1f}% of its share"
            )
        return lines


def _wait_attached(target: Any, namespace: str, timeout: float) -> list[dict[str, Any]]:
    """Per Pod (in SHARES order), once it runs: its share's device, rate, MAC and address."""
    deadline = time.monotonic() + timeout
    while True:
        pods = {p["metadata"]["name"]: p for p in target.get_json("pods", "-n", namespace)["items"]}
        claims = {c["metadata"]["name"]: c for c in target.get_json("resourceclaims", "-n", namespace)["items"]}
        holders = []
        for name in SHARES:
            pod = pods.get(name, {})
            statuses = pod.get("status", {}).get("resourceClaimStatuses") or [{}]
            claim = claims.get(statuses[0].get("resourceClaimName") or "")
            if pod.get("status", {}).get("phase") != "Running" or claim is None:
                break
            [result] = allocation_results(claim, NIC_DRIVER)
            entries = [d for d in (claim.get("status") or {}).get("devices") or [] if d["driver"] == NIC_DRIVER]
            if not entries:
                break
            data = entries[0].get("networkData") or {}
            holders.append({"pod": name, "device": result.device, "mac": data.get("hardwareAddress", ""),
                            "address": ", ".join(data.get("ips") or ["(none)"]),
                            "rate": parse_quantity(result.consumed_capacity.get("bandwidth", "0"))})  # fmt: skip
        if len(holders) == len(SHARES):
            return holders
        if time.monotonic() > deadline:
            raise TimeoutError(f"the shared-NIC Pods ({', '.join(SHARES)}) not Running after {timeout:.0f}s")
        time.sleep(0.5)

