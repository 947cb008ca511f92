"""Inventory files: a fleet written by hand, for ``tessera plan`` to preview policies on.

The format (YAML; ``examples/inventory.yaml`` has a full example)::

    nodes:
      - name: gpu-a                     # required, unique
        labels: {pool: inference}       # optional
        simulate: 4xH100-80GB           # short form: N x a catalog model; a list takes several
      - name: gpu-b
        gpus:                           # explicit GPUs, in index order
          - model: A100-80GB            # a catalog key fills product name, memory, SMs, ...
            migInstances:               # the layout it has now (optional)
              - {profile: 3g.40gb, start: 4, inUse: true}
          - productName: NVIDIA L4      # a GPU the catalog lacks: no MIG
            memoryMiB: 23034

Every other GpuStatus field (camelCase) may be given on an explicit GPU. UUIDs not given are
derived from the node name and GPU index, so the same file always gives the same UUIDs.
Not for: reading a live cluster (the operator reads NodeLayout.status).
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tessera.models.catalog import model_by_key
from tessera.models.layout import GpuStatus, MigInstanceStatus
from tessera.planner.fleet import NodeInventory

_NAMESPACE = uuidlib.UUID("5e55e7a0-7e55-4e2a-9a11-0000000000a1")
_SIMULATE_RE = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9.-]+)\s*$")


class InventoryError(ValueError):
    """The inventory file is not in the format above; the message says where and why."""


def gpu_uuid(node: str, index: int) -> str:
    """The deterministic UUID of GPU ``index`` on ``node``: ``GPU-`` and a UUIDv5."""
    return f"GPU-{uuidlib.uuid5(_NAMESPACE, f'{node}/{index}')}"


def mig_uuid(gpu: str, start: int, profile: str) -> str:
    return f"MIG-{uuidlib.uuid5(_NAMESPACE, f'{gpu}/{profile}@{start}')}"


def catalog_gpu(node: str, index: int, model_key: str, **fields: Any) -> GpuStatus:
    """A GPU of a catalog model, as a simulated agent would report it (idle, MIG off)."""
    model = model_by_key(model_key)
    data: dict[str, Any] = {
        "uuid": gpu_uuid(node, index),
        "index": index,
        "product_name": model.product_name,
        "model": model.key,
        "memory_mib": model.memory_mib,
        "multiprocessors": model.multiprocessors,
        "cuda_compute_capability": model.compute_capability,
        "architecture": model.architecture,
        "mig_capable": model.mig_capable,
    }
    data.update(fields)
    return GpuStatus.model_validate(data)


def _expand_simulate(node: str, spec: Any, first_index: int) -> list[GpuStatus]:
    entries = spec if isinstance(spec, list) else [spec]
    gpus: list[GpuStatus] = []
    for entry in entries:
        match = _SIMULATE_RE.match(str(entry))
        if match is None:
            raise InventoryError(f"node {node}: simulate {entry!r} should look like 4xH100-80GB")
        count = int(match.group(1) or 1)
        try:
            model_by_key(match.group(2))
        except ValueError as exc:
            raise InventoryError(f"node {node}: {exc}") from None
        for _ in range(count):
            gpus.append(catalog_gpu(node, first_index + len(gpus), match.group(2)))
    return gpus


def _explicit_gpu(node: str, index: int, entry: Mapping[str, Any]) -> GpuStatus:
    data = dict(entry)
    data.setdefault("index", index)
    data.setdefault("uuid", gpu_uuid(node, int(data["index"])))
    model_key = data.pop("model", None)
    instances = data.pop("migInstances", data.pop("mig_instances", []))
    base: dict[str, Any] = {}
    if model_key is not None:
        try:
            base = catalog_gpu(node, int(data["index"]), str(model_key)).model_dump(exclude_defaults=True)
        except ValueError as exc:
            raise InventoryError(f"node {node}, GPU {index}: {exc}") from None
    if "memoryMiB" in data:
        data["memoryMib"] = data.pop("memoryMiB")
    merged = {**base, **{_snake(k): v for k, v in data.items()}}
    merged.setdefault("memory_mib", 0)
    merged["mig_instances"] = [
        _instance(node, index, str(merged["uuid"]), str(model_key) if model_key else None, i, gi)
        for gi, i in enumerate(instances or [], start=1)
    ]
    if merged["mig_instances"]:
        merged.setdefault("mig_mode_current", True)
        merged.setdefault("strategy", "MIG")
    try:
        return GpuStatus.model_validate(merged)
    except ValidationError as exc:
        raise InventoryError(f"node {node}, GPU {index}: {_first_error(exc)}") from None


def _instance(node: str, index: int, gpu: str, model_key: str | None, entry: Any, gi: int) -> MigInstanceStatus:
    if not isinstance(entry, Mapping) or "profile" not in entry or "start" not in entry:
        raise InventoryError(
            f"node {node}, GPU {index}: a MIG instance needs profile and start, e.g. {{profile: 1g.10gb, start: 0}}"
        )
    data = {_snake(k): v for k, v in entry.items()}
    if model_key is not None:
        try:
            profile = model_by_key(model_key).profile(str(data["profile"]))
        except ValueError as exc:
            raise InventoryError(f"node {node}, GPU {index}: {exc}") from None
        data.setdefault("size", profile.memory_slices)
        data.setdefault("memory_mib", profile.memory_mib)
        data.setdefault("multiprocessors", profile.multiprocessors)
    data.setdefault("uuid", mig_uuid(gpu, int(data["start"]), str(data["profile"])))
    data.setdefault("gpu_instance_id", gi)
    data.setdefault("size", 1)
    data.setdefault("memory_mib", 0)
    try:
        return MigInstanceStatus.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(f"node {node}, GPU {index}: {_first_error(exc)}") from None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def parse_inventory(data: Any) -> list[NodeInventory]:
    """Nodes from a parsed inventory file, or an :class:`InventoryError` naming the problem."""
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise InventoryError("an inventory file is a mapping with a list under 'nodes'")
    nodes: list[NodeInventory] = []
    seen: set[str] = set()
    for i, entry in enumerate(data["nodes"]):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise InventoryError(f"nodes[{i}] needs a name")
        name = entry["name"]
        if name in seen:
            raise InventoryError(f"node {name} appears twice")
        seen.add(name)
        unknown = sorted(set(entry) - {"name", "labels", "simulate", "gpus"})
        if unknown:
            raise InventoryError(f"node {name}: unknown field {', '.join(unknown)} (name, labels, simulate, gpus)")
        labels = entry.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise InventoryError(f"node {name}: labels must be a mapping")
        gpus: list[GpuStatus] = []
        if entry.get("simulate") is not None:
            gpus.extend(_expand_simulate(name, entry["simulate"], 0))
        for gpu_entry in entry.get("gpus") or []:
            if not isinstance(gpu_entry, Mapping):
                raise InventoryError(f"node {name}: each entry under gpus is a mapping")
            gpus.append(_explicit_gpu(name, len(gpus), gpu_entry))
        nodes.append(NodeInventory(name, {str(k): str(v) for k, v in labels.items()}, tuple(gpus)))
    return nodes
