"""Devices → ResourceSlices (``resource.k8s.io/v1``, plain dicts) for one node's pool.

One pool per node: ``pool.name`` = ``spec.nodeName`` = the node, driver ``gpu.tessera.dev``.
A node's GPU devices share slices: ``<node>-tessera-gpus``, then ``<node>-tessera-gpus-01``,
``-02``, … (names that sort in the order they are filled), up to 64 devices each, GPUs in index
order and each GPU's devices in its packing order. A GPU's devices stay in one slice unless
they alone fill more than one, so a change to one GPU rewrites one slice. The first slice is
published even when no GPU has a device (MIG GPUs between layouts), so the pool stays put.
DynamicMIG counter sets go in slices of their own (from 1.35 a slice holds devices or
counters, not both), 8 sets each: ``<node>-tessera-counters``, ``-01``, ….

Why shared slices: to find a node's pools the scheduler's allocator walks every slice of the
cluster, for every node it tries, so a node's slice count is multiplied by the fleet's size
(issue 22: with eight one-GPU slices a node, the allocator alone took 164-176 us per node at
1,000 nodes against 58-110 with one shared slice; ``benchmarks/bench_allocator.py``). Counter
slices cost more still: the allocator adds every counter slice of the cluster to every node's
pools, so they are packed 8 sets to a slice. Why 64 devices and not 128: 64 is the limit as
soon as one device has a taint or consumes counters; using it always means a drain taint never
reshapes (renames) the pool.
Names longer than 253 characters keep a hash of the node name instead of all of it.

Slices are owned by their Node (garbage-collected with it) and labelled
``app.kubernetes.io/managed-by: tessera``. ``pool.generation`` is left at 0 here:
``tessera.dra.diff.plan_slice_writes`` decides it against what exists.
Output is deterministic (slices by name, devices in the packing order ``tessera.dra.devices``
lists them in — see ``tessera.dra.packing``: the allocator walks slices by name and each
slice's devices in listed order —, maps by key): two builds from the same input are
byte-identical.
Not for: deciding writes (``tessera.dra.diff``) or making them (the controller).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import RESOURCE_API_VERSION
from tessera.dra.devices import DRIVER, CounterSet, Device, GpuDevices, build_gpu_devices
from tessera.models.layout import GpuStatus, NodeLayoutStatus

KIND = "ResourceSlice"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "tessera"
MAX_NAME = 253
MAX_DEVICES = 128  # per slice (resource.k8s.io/v1)
MAX_DEVICES_WITH_ADVANCED_FEATURES = 64  # when any device has taints or consumes counters
MAX_COUNTER_SETS = 8  # per slice (resource.k8s.io/v1)
DEVICES_PER_SLICE = MAX_DEVICES_WITH_ADVANCED_FEATURES  # always: a taint must not reshape the pool
COUNTER_SETS_PER_SLICE = MAX_COUNTER_SETS
GPU_SLICE = "tessera-gpus"
COUNTER_SLICE = "tessera-counters"
MAX_PARTS = 100  # ``-01`` … ``-99``: two digits keep name order = fill order

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


def part_suffix(base: str, part: int) -> str:
    """The suffix of part ``part`` of a run of slices: ``base``, ``base-01``, … ``base-99``."""
    if not 0 <= part < MAX_PARTS:
        raise ValueError(f"a node's {base} would need more than {MAX_PARTS} slices; "
                         f"that many devices or counter sets on one node is not supported")
    return base if part == 0 else f"{base}-{part:02d}"


def gpu_slice_suffix(part: int = 0) -> str:
    return part_suffix(GPU_SLICE, part)


def counter_slice_suffix(part: int = 0) -> str:
    return part_suffix(COUNTER_SLICE, part)


def pack_gpu_devices(gpus: Sequence[GpuDevices], limit: int = DEVICES_PER_SLICE) -> list[list[Device]]:
    """The node's devices in slice-sized chunks: GPUs in index order, each GPU's devices in
    their order, a GPU's devices kept in one chunk when they fit in one (a new chunk starts
    rather than split it). At least one chunk, empty when no GPU has a device."""
    chunks: list[list[Device]] = [[]]
    for gpu in sorted(gpus, key=lambda g: g.gpu_index):
        if chunks[-1] and len(chunks[-1]) + len(gpu.devices) > limit:
            chunks.append([])
        for device in gpu.devices:
            if len(chunks[-1]) >= limit:
                chunks.append([])
            chunks[-1].append(device)
    return chunks


def pack_counter_sets(gpus: Sequence[GpuDevices], limit: int = COUNTER_SETS_PER_SLICE) -> list[list[CounterSet]]:
    """The node's counter sets (GPUs in index order) in chunks of ``limit``; none when no GPU has one."""
    sets = [s for gpu in sorted(gpus, key=lambda g: g.gpu_index) for s in gpu.counter_sets]
    return [sets[i:i + limit] for i in range(0, len(sets), limit)]


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


def build_slices_from_devices(node: NodeRef, gpus: Iterable[GpuDevices]) -> list[ResourceSlice]:
    """Slices for a node's devices, sorted by name, with ``resourceSliceCount`` filled in;
    none for a node without GPUs."""
    every = list(gpus)
    if not every:
        return []
    slices = [
        _slice(node, slice_name(node.name, gpu_slice_suffix(part)), {"devices": chunk} if chunk else {})
        for part, chunk in enumerate(pack_gpu_devices(every))
    ]
    slices += [
        _slice(node, slice_name(node.name, counter_slice_suffix(part)), {"sharedCounters": chunk})
        for part, chunk in enumerate(pack_counter_sets(every))
    ]
    slices.sort(key=lambda s: str(s["metadata"]["name"]))
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
