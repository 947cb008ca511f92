"""Simulated GPUs' state: plain data that round-trips through JSON, and how it is first made.

What the simulated driver keeps per GPU (GPU and compute instances, MIG mode current and
pending, time slice, compute mode, health, lost), the holds, in-memory MPS daemons, pending
injected faults and undelivered health events. GPUs come from the catalog, chosen by a spec
such as ``4xH100-80GB,2xA100-80GB`` (``parse_simulate_spec``); UUIDs are seeded by the node name,
so two runs describe byte-identical hardware; ``board_slot`` places GPUs on an HGX-style board.
Not for: the driver's rules (``simulated.SimulatedHardware``), fault injection (``simfaults``),
or device nodes (``simdevices``).
"""

from __future__ import annotations

import re
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from typing import Any

from tessera.agent.backends.base import NotFoundError, NotSupportedError
from tessera.agent.nics.spec import is_nic_item
from tessera.models.catalog import GpuModel, MigProfile, model_by_key
from tessera.models.layout import Health
from tessera.models.policy import TimeSliceInterval

SIM_DRIVER_VERSION = "580.95.05"
SIM_CUDA_VERSION = "13.0"
_NAMESPACE = uuidlib.UUID("6f1c8a52-3f0e-4d7b-9a63-2c1e5b7d9e41")
_SPEC_ITEM = re.compile(r"^(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9.+-]+)$")

GPUS_PER_PCIE_ROOT = 2
NUMA_NODES = 2


@dataclass(frozen=True, slots=True)
class BoardSlot:
    """Where a simulated GPU sits on the board."""

    pci_bus_id: str  # NVML's form
    pcie_root: str
    numa_node: int


def board_slot(index: int, gpu_count: int) -> BoardSlot:
    """GPU ``index`` of ``gpu_count`` on an HGX-style board: two GPUs behind each PCIe root
    complex (they share a PCIe switch), the roots split evenly between two CPU sockets (NUMA
    nodes). Eight GPUs: roots ``pci0000:10``, ``:30``, ``:50``, ``:70``; GPUs 0-3 on NUMA node 0,
    4-7 on node 1."""
    roots = max(1, -(-gpu_count // GPUS_PER_PCIE_ROOT))
    root = index // GPUS_PER_PCIE_ROOT
    domain, root_bus = divmod(root, 8)
    bus = 0x10 + root_bus * 0x20
    gpu_bus = bus + 0x08 + 0x04 * (index % GPUS_PER_PCIE_ROOT)
    return BoardSlot(
        pci_bus_id=f"{domain:08X}:{gpu_bus:02X}:00.0",
        pcie_root=f"pci{domain:04x}:{bus:02x}",
        numa_node=min(NUMA_NODES - 1, root * NUMA_NODES // roots),
    )


def parse_simulate_spec(spec: str) -> list[GpuModel]:
    """``"4xH100-80GB,2xA100-80GB"`` → six catalog models, in order. Errors name the bad part."""
    models: list[GpuModel] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item or is_nic_item(item):  # NICs of the same node spec: tessera.agent.nics.simulated
            continue
        m = _SPEC_ITEM.match(item)
        if m is None:
            raise ValueError(f"bad GPU spec {item!r}: write COUNTxMODEL, e.g. 4xH100-80GB")
        count = int(m.group(1) or "1")
        if not 1 <= count <= 64:
            raise ValueError(f"bad GPU spec {item!r}: the count must be between 1 and 64")
        models.extend([model_by_key(m.group(2))] * count)
    if not models:
        raise ValueError("the GPU spec is empty: write e.g. 4xH100-80GB,2xA100-80GB")
    if len(models) > 64:
        raise ValueError(f"the GPU spec describes {len(models)} GPUs; at most 64 per node")
    return models


def simulated_gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(_NAMESPACE, f'{node_name}/gpu/{index}')}"


def simulated_mig_uuid(gpu_uuid: str, gpu_instance_id: int, profile_id: int, start: int) -> str:
    return f"MIG-{uuidlib.uuid5(_NAMESPACE, f'{gpu_uuid}/gi/{gpu_instance_id}/{profile_id}@{start}')}"


@dataclass
class SimInstance:
    gpu_instance_id: int
    profile_id: int
    start: int
    size: int
    compute_instance_id: int | None = None
    uuid: str | None = None


@dataclass
class SimGpu:
    index: int
    uuid: str
    model: str
    mig_current: bool = False
    mig_pending: bool = False
    instances: list[SimInstance] = field(default_factory=list)
    time_slice: str = TimeSliceInterval.DEFAULT.value
    compute_mode: int = 0
    lost: bool = False
    health: str = Health.HEALTHY.value
    health_message: str = ""

    @property
    def catalog(self) -> GpuModel:
        return model_by_key(self.model)

    def profile_by_id(self, profile_id: int) -> MigProfile:
        for p in self.catalog.profiles:
            if p.shape.profile_id == profile_id:
                return p
        raise NotSupportedError(f"GPU {self.index} ({self.model}) has no MIG profile id {profile_id}")

    def instance(self, gpu_instance_id: int) -> SimInstance:
        for i in self.instances:
            if i.gpu_instance_id == gpu_instance_id:
                return i
        raise NotFoundError(f"GPU {self.index} has no GPU instance {gpu_instance_id}")


@dataclass
class SimFault:
    operation: str
    error: str
    gpu_index: int | None = None
    remaining: int = 1
    skip: int = 0  # calls that succeed before the fault fires


@dataclass
class SimEvent:
    gpu_index: int
    kind: str
    xid: int | None = None
    gpu_instance_id: int | None = None
    message: str = ""


@dataclass
class SimState:
    node_name: str
    gpus: list[SimGpu]
    holds: dict[str, list[str]] = field(default_factory=dict)  # device UUID -> holders
    mps: dict[str, str] = field(default_factory=dict)  # device UUID -> pipe directory (in-memory daemons)
    mps_defaults: dict[str, dict[str, int | None]] = field(default_factory=dict)  # device UUID -> MpsDefaults
    faults: list[SimFault] = field(default_factory=list)
    events: list[SimEvent] = field(default_factory=list)
    driver_available: bool = True

    def copy(self) -> SimState:
        """A deep copy, field by field: what ``from_json(asdict(...))`` gives, a dozen times
        faster (a simulated node's inventory is read on every reconcile pass; a bench runs a
        thousand nodes' passes on one machine). Every field of the dataclasses here is either
        immutable or copied below."""
        return SimState(
            node_name=self.node_name,
            gpus=[replace(g, instances=[replace(i) for i in g.instances]) for g in self.gpus],
            holds={k: list(v) for k, v in self.holds.items()},
            mps=dict(self.mps),
            mps_defaults={k: dict(v) for k, v in self.mps_defaults.items()},
            faults=[replace(f) for f in self.faults],
            events=[replace(e) for e in self.events],
            driver_available=self.driver_available,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SimState:
        gpus = [
            SimGpu(**{**g, "instances": [SimInstance(**i) for i in g.get("instances", [])]})
            for g in data["gpus"]
        ]
        return cls(
            node_name=data["node_name"],
            gpus=gpus,
            holds={k: list(v) for k, v in data.get("holds", {}).items()},
            mps=dict(data.get("mps", {})),
            mps_defaults={k: dict(v) for k, v in data.get("mps_defaults", {}).items()},
            faults=[SimFault(**f) for f in data.get("faults", [])],
            events=[SimEvent(**e) for e in data.get("events", [])],
            driver_available=data.get("driver_available", True),
        )
