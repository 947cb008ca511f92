"""The GPU catalog: the MIG-capable GPUs Tessera knows, with their MIG profiles and placements.

The numbers come from NVIDIA's MIG user guide and NVML output (see ``shared/FACTS.md``); where
a real GPU was read (``scripts/nvml-record``, recordings in ``tests/fixtures/nvml/``), the
recording wins and ``tests/test_models_catalog_recorded.py`` holds the catalog to it.
The catalog serves the simulated backend, the planner and offline validation; on real
hardware the NVML backend reads profiles and placements from the driver instead. Values the
public sources do not give (B200 3g/4g/7g) are estimates and marked ``estimated``.
Not for: anything that talks to a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cache


class ProfileKind(StrEnum):
    """The shape of a GPU-instance profile, the same on every 8-slice GPU."""

    ONE = "1g"
    ONE_MEDIA = "1g+me"
    ONE_DOUBLE = "1g-double"
    TWO = "2g"
    THREE = "3g"
    FOUR = "4g"
    SEVEN = "7g"


@dataclass(frozen=True, slots=True)
class ProfileShape:
    """What a profile kind is, independent of the GPU model."""

    kind: ProfileKind
    profile_id: int  # nvmlGpuInstanceProfileInfo.id: what placement and create calls take
    nvml_constant: int  # NVML_GPU_INSTANCE_PROFILE_*: what GetGpuInstanceProfileInfo takes
    compute_slices: int
    memory_slices: int
    max_count: int
    starts: tuple[int, ...]


SHAPES: dict[ProfileKind, ProfileShape] = {
    s.kind: s
    for s in (
        ProfileShape(ProfileKind.ONE, 19, 0x0, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        ProfileShape(ProfileKind.ONE_MEDIA, 20, 0x7, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ProfileShape(ProfileKind.ONE_DOUBLE, 15, 0x9, 1, 2, 4, (0, 2, 4, 6)),
        ProfileShape(ProfileKind.TWO, 14, 0x1, 2, 2, 3, (0, 2, 4)),
        ProfileShape(ProfileKind.THREE, 9, 0x2, 3, 4, 2, (0, 4)),
        ProfileShape(ProfileKind.FOUR, 5, 0x3, 4, 4, 1, (0,)),
        ProfileShape(ProfileKind.SEVEN, 0, 0x4, 7, 8, 1, (0,)),
    )
}

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model, e.g. H100-80GB's ``3g.40gb``."""

    name: str
    shape: ProfileShape
    memory_mib: int
    multiprocessors: int
    estimated: bool = False

    @property
    def kind(self) -> ProfileKind:
        return self.shape.kind

    @property
    def memory_slices(self) -> int:
        return self.shape.memory_slices

    @property
    def compute_slices(self) -> int:
        return self.shape.compute_slices

    @property
    def max_count(self) -> int:
        return self.shape.max_count

    @property
    def starts(self) -> tuple[int, ...]:
        return self.shape.starts


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model: identity, size, and its MIG profiles (empty when it has no MIG)."""

    key: str  # the catalog key users write in --simulate: "H100-80GB"
    product_name: str  # what nvmlDeviceGetName returns
    memory_mib: int
    multiprocessors: int
    compute_capability: str
    architecture: str
    pci_device_id: int
    profiles: tuple[MigProfile, ...]
    aliases: tuple[str, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    def profile(self, name: str) -> MigProfile:
        """The profile called ``name``, or a ValueError that lists the valid ones."""
        for p in self.profiles:
            if p.name == name:
                return p
        valid = ", ".join(p.name for p in self.profiles) or "none (no MIG)"
        raise ValueError(f"{self.key} has no MIG profile {name!r}; valid profiles: {valid}")

    def profile_of_kind(self, kind: ProfileKind) -> MigProfile:
        for p in self.profiles:
            if p.kind is kind:
                return p
        raise ValueError(f"{self.key} has no {kind.value} MIG profile")


def _profiles(
    names: tuple[str, str, str, str, str, str],
    memory_mib: tuple[int, int, int, int, int, int],
    multiprocessors: tuple[int, int, int, int, int, int],
    estimated: frozenset[ProfileKind] = frozenset(),
) -> tuple[MigProfile, ...]:
    """Build a model's profiles from its six sizes: 1g, 1g double, 2g, 3g, 4g, 7g (+ 1g+me)."""
    kinds = (
        ProfileKind.ONE,
        ProfileKind.ONE_DOUBLE,
        ProfileKind.TWO,
        ProfileKind.THREE,
        ProfileKind.FOUR,
        ProfileKind.SEVEN,
    )
    out = [
        MigProfile(name, SHAPES[kind], mem, sms, kind in estimated)
        for kind, name, mem, sms in zip(kinds, names, memory_mib, multiprocessors, strict=True)
    ]
    out.insert(1, MigProfile(names[0] + "+me", SHAPES[ProfileKind.ONE_MEDIA], memory_mib[0], multiprocessors[0]))
    return tuple(out)


_AMPERE_SMS = (14, 14, 28, 42, 56, 98)
_HOPPER_SMS = (16, 26, 32, 60, 64, 132)
_B200_ESTIMATED = frozenset({ProfileKind.THREE, ProfileKind.FOUR, ProfileKind.SEVEN})

MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 108, "8.0", "Ampere", 0x20B010DE,
        _profiles(
            ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
            (4864, 9856, 9856, 19968, 19968, 40192),
            _AMPERE_SMS,
        ),
        aliases=("NVIDIA A100-PCIE-40GB",),
    ),
    GpuModel(
        "A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 108, "8.0", "Ampere", 0x20B210DE,
        _profiles(
            ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            (9728, 19968, 19968, 40192, 40192, 80896),
            _AMPERE_SMS,
        ),
        aliases=("NVIDIA A100 80GB PCIe",),
    ),
    GpuModel(
        "H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 132, "9.0", "Hopper", 0x233010DE,
        _profiles(
            ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            (9984, 20096, 20096, 40448, 40448, 81152),
            _HOPPER_SMS,
        ),
        aliases=("NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
    ),
    GpuModel(
        "H200-141GB", "NVIDIA H200", 143771, 132, "9.0", "Hopper", 0x233510DE,
        _profiles(
            ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
            (16384, 33280, 33280, 71424, 71424, 143360),  # read from NVML on an H200, 580.159.04
            _HOPPER_SMS,
        ),
        aliases=("NVIDIA H200 NVL",),
    ),
    GpuModel(
        "B200", "NVIDIA B200", 183359, 148, "10.0", "Blackwell", 0x290110DE,
        _profiles(
            ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
            (22528, 45312, 45312, 90624, 90624, 181248),
            (18, 30, 36, 60, 72, 148),
            estimated=_B200_ESTIMATED,
        ),
    ),
)

MODELS_BY_KEY: dict[str, GpuModel] = {m.key: m for m in MODELS}

# Every profile name any model knows, sorted: the CRD schema refuses others.
KNOWN_PROFILE_NAMES: tuple[str, ...] = tuple(sorted({p.name for m in MODELS for p in m.profiles}))


def model_by_key(key: str) -> GpuModel:
    """The catalog model for a key such as ``"H100-80GB"``, or a ValueError listing the keys."""
    try:
        return MODELS_BY_KEY[key]
    except KeyError:
        raise ValueError(
            f"unknown GPU model {key!r}; known models: {', '.join(MODELS_BY_KEY)}"
        ) from None


@cache
def model_for_product(product_name: str) -> GpuModel | None:
    """The catalog model whose NVML product name (or an alias) is ``product_name``."""
    for m in MODELS:
        if product_name == m.product_name or product_name in m.aliases:
            return m
    return None


def catalog_model(model_key: str | None, product_name: str) -> GpuModel | None:
    """The catalog model of a GPU, the one lookup the planner and the publisher share: by its
    catalog key when the catalog knows the key, else by its NVML product name; None when the
    catalog knows neither (the GPU is then planned and published without MIG)."""
    if model_key:
        known = MODELS_BY_KEY.get(model_key)
        if known is not None:
            return known
    return model_for_product(product_name)
