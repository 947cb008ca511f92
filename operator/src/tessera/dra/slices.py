"""Devices → ResourceSlices (``resource.k8s.io/v1``, plain dicts) for one node's pool.

One pool per node: ``pool.name`` = ``spec.nodeName`` = the node, driver ``gpu.tessera.dev``.
Every GPU gets a slice of its own, named ``<node>-tessera-gpu-<index>`` (published even when
empty, say a MIG GPU between layouts, so a GPU that changes rewrites one slice and the set
of slices stays put); a DynamicMIG GPU has a second slice ``<node>-tessera-gpu-<index>-counters``
with its counter set (from 1.35 a slice holds devices or counters, not both). Should a GPU
ever have more devices than one slice may hold (128; 64 when a device has taints or consumes
counters) they continue in ``…-part-1``, ``…-part-2``. Names longer than 253 characters
keep a hash of the node name instead of all of it.

Slices are owned by their Node (garbage-collected with it) and labelled
``app.kubernetes.io/managed-by: tessera``. ``pool.generation`` is left at 0 here:
``tessera.dra.diff.plan_slice_writes`` decides it against what exists.
Output is deterministic (slices by name, devices in the packing order ``tessera.dra.devices``
lists them in — see ``tessera.dra.packing``: the allocator tries them in that order —, maps by
key): two builds from the same input are byte-identical.
Not for: deciding writes (``tessera.dra.diff``) or making them (the controller).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import RESOURCE_API_VERSION
from tessera.dra.devices import DRIVER, Device, GpuDevices, build_gpu_devices
from tessera.models.layout import GpuStatus, NodeLayoutStatus

KIND = "ResourceSlice"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "tessera"
MAX_NAME = 253
MAX_DEVICES = 128  # per slice (resource.k8s.io/v1)
MAX_DEVICES_WITH_ADVANCED_FEATURES = 64  # when any device has taints or consumes counters

ResourceSlice = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeRef:
    """The node a pool belongs to: its name, and its UID for the owner reference."""

    name: str
    uid: str


def slice_name(node: str, suffix: str) -> str:
    """``<node>-<suffix>``, shortened with a hash of the node name past 253 characters."""
    name = f"{node}-{suffix}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(suffix) - len(digest) - 2
    head = node[:keep].rstrip(".-")
    return f"{head}-{digest}-{suffix}"


def gpu_slice_suffix(gpu_index: int, part: int = 0) -> str:
    return f"tessera-gpu-{gpu_index}" + (f"-part-{part}" if part else "")


def counter_slice_suffix(gpu_index: int) -> str:
    return f"tessera-gpu-{gpu_index}-counters"


def uses_advanced_features(device: Device) -> bool:
    """Taints or counter consumption: such a device lowers its slice's limit to 64 devices."""
    return bool(device.get("taints")) or bool(device.get("consumesCounters"))


def chunk_devices(devices: Sequence[Device]) -> list[list[Device]]:
    """Devices in slice-sized chunks, in order; one empty chunk for no devices."""
    chunks: list[list[Device]] = [[]]
    for device in devices:
        current = chunks[-1]
        advanced = uses_advanced_features(device) or any(uses_advanced_features(d) for d in current)
        limit = MAX_DEVICES_WITH_ADVANCED_FEATURES if advanced else MAX_DEVICES
        if len(current) >= limit:
            chunks.append([device])
        else:
            current.append(device)
    return chunks


def _slice(node: NodeRef, name: str, body: dict[str, Any]) -> ResourceSlice:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": node.name,
        "pool": {"name": node.name, "generation": 0, "resourceSliceCount": 0},
        **body,
    }
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
            ],
        },
        "spec": dict(sorted(spec.items())),
    }


def gpu_slices(node: NodeRef, gpu: GpuDevices) -> list[ResourceSlice]:
    """The slices of one GPU: its devices (at least one slice), then its counter sets."""
    out = []
    for part, chunk in enumerate(chunk_devices(gpu.devices)):
        body = {"devices": chunk} if chunk else {}
        out.append(_slice(node, slice_name(node.name, gpu_slice_suffix(gpu.gpu_index, part)), body))
    if gpu.counter_sets:
        name = slice_name(node.name, counter_slice_suffix(gpu.gpu_index))
        out.append(_slice(node, name, {"sharedCounters": list(gpu.counter_sets)}))
    return out


def build_slices_from_devices(node: NodeRef, gpus: Iterable[GpuDevices]) -> list[ResourceSlice]:
    """Slices for a node's devices, sorted by name, with ``resourceSliceCount`` filled in."""
    slices = sorted((s for g in gpus for s in gpu_slices(node, g)), key=lambda s: str(s["metadata"]["name"]))
    for s in slices:
        s["spec"]["pool"]["resourceSliceCount"] = len(slices)
    return slices


def build_node_slices(
    node: NodeRef,
    status: NodeLayoutStatus | Sequence[GpuStatus] | None,
    draining: Collection[str] = (),
) -> list[ResourceSlice]:
    """Every ResourceSlice the node's pool should hold, from what its agent reports.

    ``draining``: GPU UUIDs, MIG instance UUIDs or device names being drained (they get the
    ``tessera.dev/repartition`` NoSchedule taint). No status, or no GPUs → no slices."""
    if status is None:
        return []
    gpus = status.gpus if isinstance(status, NodeLayoutStatus) else list(status)
    drain = frozenset(draining)
    return build_slices_from_devices(node, (build_gpu_devices(g, drain) for g in gpus))


def slice_devices(resource_slice: ResourceSlice) -> list[Device]:
    devices: list[Device] = resource_slice.get("spec", {}).get("devices") or []
    return devices


def published_device_count(slices: Iterable[ResourceSlice]) -> int:
    """How many devices a set of slices publishes (for SharingPolicy status)."""
    return sum(len(slice_devices(s)) for s in slices)
