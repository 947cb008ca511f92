"""``tessera status`` (also ``kubectl tessera status``): per node and GPU, the layout that exists,
the devices Tessera publishes for it, and which ResourceClaim (namespace/name) holds each.

It reads NodeLayouts (the agents' status: GPUs, strategy, policy, MIG instances),
Tessera's ResourceSlices (what the scheduler can allocate) and every ResourceClaim's allocation.
``render_status`` is pure (plain objects in, text out); ``read_cluster`` is the I/O. Nothing is
written. Not for: previewing a policy change (``tessera plan --live``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera import DRIVER_NAME
from tessera.kube.http import KubeClient
from tessera.kube.objects import CLAIMS, LAYOUTS, SLICES, Api
from tessera.models.quantity import format_bytes, parse_quantity

DYNAMIC_MARK = "-dyn-"  # DynamicMIG placements: shown only when a claim holds one


@dataclass(frozen=True)
class ClusterView:
    """What ``tessera status`` reads: NodeLayouts, ResourceSlices and ResourceClaims, as the API gives them."""

    layouts: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    claims: list[dict[str, Any]]


def holders(claims: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(pool, device) of Tessera's driver → the claims allocated it, as ``namespace/name`` plus
    what a share consumed (``memory 10Gi, compute 25``)."""
    held: dict[tuple[str, str], list[str]] = {}
    for claim in claims:
        meta = claim.get("metadata", {})
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != DRIVER_NAME:
                continue
            consumed = result.get("consumedCapacity") or {}
            extra = ", ".join(f"{k} {_quantity_text(k, str(v))}" for k, v in sorted(consumed.items()))
            who = f"{meta.get('namespace', '')}/{meta.get('name', '')}" + (f" ({extra})" if extra else "")
            held.setdefault((result["pool"], result["device"]), []).append(who)
    return held


def render_status(view: ClusterView, nodes: Iterable[str] = ()) -> str:
    """Per node (all, or those named) and GPU: layout, published devices and their holders."""
    wanted = set(nodes)
    held = holders(view.claims)
    published: dict[str, dict[str, dict[str, Any]]] = {}
    for resource_slice in view.slices:
        spec = resource_slice.get("spec", {})
        if spec.get("driver") != DRIVER_NAME:
            continue
        pool = spec.get("pool", {}).get("name", "")
        for device in spec.get("devices") or []:
            published.setdefault(pool, {})[device["name"]] = device
    lines: list[str] = []
    for layout in sorted(view.layouts, key=lambda item: str(item["metadata"]["name"])):
        node = str(layout["metadata"]["name"])
        if wanted and node not in wanted:
            continue
        devices = published.get(node, {})
        gpus = (layout.get("status") or {}).get("gpus") or []
        lines.append(f"node {node}" + ("" if gpus else "  (no GPUs reported yet: is the agent running there?)"))
        for gpu in sorted(gpus, key=lambda g: int(g.get("index", 0))):
            lines += _gpu_lines(node, gpu, devices, held)
    if not lines:
        return "no NodeLayouts" + (f" for {', '.join(sorted(wanted))}" if wanted else "") + \
            ": no Tessera agent has reported yet"
    return "\n".join(lines)


def _gpu_lines(
    node: str, gpu: Mapping[str, Any], devices: Mapping[str, Mapping[str, Any]],
    held: Mapping[tuple[str, str], list[str]],
) -> list[str]:
    index = gpu.get("index", "?")
    memory = f"{int(gpu.get('memoryMib', 0)) / 1024:.0f}GiB"
    lines = [
        f"  GPU {index}  {gpu.get('productName', '?')}  {memory}  strategy {gpu.get('strategy', '?')}"
        f"  policy {gpu.get('policy') or '(none: unmanaged)'}  health {gpu.get('health', 'Healthy')}"
    ]
    if gpu.get("migInstances"):
        cut = "  ".join(f"{i['profile']}@{i['start']}" for i in gpu["migInstances"])
        lines.append(f"      MIG instances: {cut}")
    prefix = f"gpu-{index}"
    mine = sorted(n for n in devices if n == prefix or n.startswith(prefix + "-"))
    shown = [n for n in mine if DYNAMIC_MARK not in n or (node, n) in held]
    for name in shown:
        device = devices[name]
        kind = device.get("attributes", {}).get("type", {}).get("string", "")
        shared = " shared" if device.get("allowMultipleAllocations") else ""
        tainted = " tainted" if device.get("taints") else ""
        who = held.get((node, name), [])
        lines.append(
            f"      {name:<28} {kind + shared + tainted:<18} {_memory(device):>8}  "
            + (("<- " + "; ".join(who)) if who else "free")
        )
    if len(mine) > len(shown):
        lines.append(f"      + {len(mine) - len(shown)} DynamicMIG placements published (made when a claim needs one)")
    if not mine:
        lines.append("      (no devices published)")
    return lines


def _memory(device: Mapping[str, Any]) -> str:
    value = device.get("capacity", {}).get("memory", {}).get("value")
    return "" if value is None else f"{parse_quantity(str(value)) / 2**30:.1f}Gi"


def _quantity_text(name: str, value: str) -> str:
    if name == "memory":
        return format_bytes(parse_quantity(value))
    return f"{value}%" if name == "compute" else value


async def read_cluster(kubeconfig: Path | None) -> ClusterView:
    """NodeLayouts, Tessera's ResourceSlices and every ResourceClaim, read at once."""
    async with KubeClient.from_environment(str(kubeconfig) if kubeconfig else None) as client:
        api = Api(client)
        layouts, slices, claims = await asyncio.gather(
            api.list_all(*LAYOUTS), api.list_all(*SLICES), api.list_all(*CLAIMS),
        )
    return ClusterView(layouts=layouts, slices=slices, claims=claims)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", nargs="*", help="only these nodes (default: every node with a NodeLayout)")
    parser.add_argument("--kubeconfig", metavar="FILE", type=Path,
                        help="the cluster (default: $KUBECONFIG, else in-cluster)")


def run(args: argparse.Namespace) -> int:
    try:
        view = asyncio.run(read_cluster(args.kubeconfig))
    except Exception as exc:  # any failure to reach or read the cluster: said plainly, exit 2
        print(f"tessera status: cannot read the cluster: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return 2
    print(render_status(view, args.node))
    return 0
