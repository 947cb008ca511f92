"""``tessera plan``: preview what SharingPolicies would do to a fleet, before applying them.

    tessera plan --policy examples/policies/h100-inference.yaml --inventory examples/inventory.yaml
    tessera plan --policy my-new-policy.yaml --live [--kubeconfig FILE]

Prints one row per node and GPU (the winning policy, the strategy, the MIG layout or the
reason there is none), then the conflicts. The inventory format is described in
``tessera.planner.inventory``. Exit status: 0 when every GPU could be planned, 1 when some
GPU could not (the table says why), 2 when a policy (its schema or its gpuSelector) or the
inventory file is invalid.

``--live`` reads the cluster instead of an inventory and shows, per GPU, today's layout, the
new one, the devices that would drain and the claims holding them (``tessera.cli.liveplan``).
Not for: writing anything to a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tessera.models.policy import SharingPolicy, Strategy
from tessera.planner import FleetPlan, GpuPlan, plan_fleet
from tessera.planner.inventory import InventoryError, parse_inventory


class InputError(Exception):
    """A policy or inventory file that cannot be used; the message says which and why."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        "-p",
        metavar="FILE",
        type=Path,
        action="append",
        required=True,
        help="a YAML file with one or more SharingPolicies (repeat for more files)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--inventory",
        "-i",
        metavar="FILE",
        type=Path,
        help="a YAML file describing nodes and GPUs (see examples/inventory.yaml)",
    )
    source.add_argument(
        "--live",
        action="store_true",
        help="plan against the cluster as it is: its NodeLayouts, policies and claim allocations",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        type=Path,
        help="with --live: the cluster (default: $KUBECONFIG, else in-cluster)",
    )


def readable_errors(exc: ValidationError) -> list[str]:
    """Each pydantic error as ``field.path: message``, with wire (camelCase) field names."""
    lines: list[str] = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        if err["type"] in ("enum", "literal_error", "string_pattern_mismatch") and isinstance(value, str | int):
            message += f" (got {value!r})"
        lines.append(f"{path}: {message}" if path else message)
    return lines


def load_policies(paths: list[Path]) -> list[SharingPolicy]:
    """Every SharingPolicy in ``paths`` (multi-document YAML; other kinds are skipped)."""
    policies: list[SharingPolicy] = []
    names: dict[str, Path] = {}
    for path in paths:
        found = 0
        for number, doc in enumerate(_documents(path), start=1):
            if not isinstance(doc, dict) or doc.get("kind") != "SharingPolicy":
                continue
            found += 1
            name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
            where = f"{path}: SharingPolicy {name}" if name else f"{path}: document {number}"
            try:
                policy = SharingPolicy.model_validate(doc)
            except ValidationError as exc:
                details = "\n".join(f"  {line}" for line in readable_errors(exc))
                raise InputError(f"{where} is invalid:\n{details}") from None
            if policy.name in names:
                raise InputError(f"{where}: the name is also used in {names[policy.name]}")
            names[policy.name] = path
            policies.append(policy)
        if not found:
            raise InputError(f"{path}: no SharingPolicy in it (kind: SharingPolicy)")
    return policies


def _documents(path: Path) -> list[Any]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    out: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def _layout_text(plan: GpuPlan) -> str:
    if plan.error is not None or plan.layout is None:
        return "-"
    layout = plan.layout
    parts = [f"{i.profile}@{i.start}" for i in layout.mig_instances]
    text = " ".join(parts)
    if layout.mig_sharing is not None:
        text += f" (each shared by {layout.mig_sharing.value})"
    if layout.time_slicing is not None and not parts:
        text = f"{layout.time_slicing.replicas} replicas, {layout.time_slicing.interval.value} interval"
    if layout.mps is not None and not parts:
        text = f"MPS, {layout.mps.compute.default}% compute, {layout.mps.memory.default} memory by default"
    if layout.strategy is Strategy.DYNAMIC_MIG:
        text = "MIG on; instances made per claim"
    return text or "whole GPU"


def _note(plan: GpuPlan) -> str:
    if plan.unmanaged:
        return "no policy selects it: unmanaged, left exactly as it is"
    if plan.error is not None:
        return f"{plan.error.reason.value}: {plan.error.message}"
    if len(plan.candidates) > 1:
        return "also selected by " + ", ".join(plan.candidates[1:])
    return ""


def render_table(plan: FleetPlan) -> str:
    """The plan as an aligned text table, one row per GPU."""
    header = ("NODE", "GPU", "MODEL", "POLICY", "STRATEGY", "LAYOUT", "NOTE")
    rows = [header]
    for p in plan.gpus:
        strategy = p.layout.strategy.value if p.layout is not None else "-"
        rows.append(
            (
                p.node,
                str(p.gpu.index),
                p.gpu.model or p.gpu.product_name,
                p.policy or "(none)",
                strategy,
                _layout_text(p),
                _note(p),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def run_live(policies: list[SharingPolicy], kubeconfig: Path | None) -> int:
    from tessera.cli.liveplan import (  # the cluster client only when asked
        adaptive_preview,
        live_rows,
        read_demand,
        read_fleet,
        render_adaptive,
        render_live,
    )

    try:
        fleet = asyncio.run(read_fleet(kubeconfig))
        claims, pods = asyncio.run(read_demand(kubeconfig))
    except Exception as exc:  # any failure to reach or read the cluster: said plainly, exit 2
        print(f"tessera plan --live: cannot read the cluster: {type(exc).__name__}: {str(exc)[:300]}",
              file=sys.stderr)
        return 2
    plan = live_rows(fleet, policies)
    print(render_live(plan) + render_adaptive(adaptive_preview(fleet, policies, claims, pods)))
    failed = [r for r in plan.rows if r.error]
    if failed:
        print(f"\n{len(failed)} of {len(plan.rows)} GPU(s) cannot be planned", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    if args.live:
        try:
            live_policies = load_policies(list(args.policy))
        except InputError as exc:
            print(f"tessera plan: {exc}", file=sys.stderr)
            return 2
        return run_live(live_policies, args.kubeconfig)
    try:
        policies = load_policies(list(args.policy))
        try:
            inventory_data = yaml.safe_load(Path(args.inventory).read_text())
        except OSError as exc:
            raise InputError(f"{args.inventory}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise InputError(f"{args.inventory}: not valid YAML: {exc}") from None
        try:
            nodes = parse_inventory(inventory_data)
        except InventoryError as exc:
            raise InputError(f"{args.inventory}: {exc}") from None
    except InputError as exc:
        print(f"tessera plan: {exc}", file=sys.stderr)
        return 2
    plan = plan_fleet(policies, nodes)
    print(render_table(plan))
    for name, message in sorted(plan.policy_errors.items()):
        print(f"tessera plan: policy {name} is invalid and selects nothing: {message}", file=sys.stderr)
    if plan.conflicts:
        print(f"\n{len(plan.conflicts)} GPU(s) selected by more than one policy (priority, then name, decides):")
        for c in plan.conflicts:
            print(f"  {c.node} {c.gpu}: {c.winner} wins over {', '.join(c.losers)}")
    if plan.policy_errors:
        return 2
    failed = [p for p in plan.gpus if p.error is not None]
    if failed:
        print(f"\n{len(failed)} of {len(plan.gpus)} GPU(s) cannot be planned", file=sys.stderr)
        return 1
    return 0
