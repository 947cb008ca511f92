"""The names of published devices, built and read in one place.

The ResourceSlice publisher names every device with the builders here, and the kubelet
plugin reads an allocated device's name back with ``parse_device_name``; both sides share
this code, so a name can never mean two things. Names are DNS labels (lowercase letters,
digits, ``-``; at most 63 characters), the form ``resource.k8s.io`` requires:

- ``gpu-<index>``: a whole GPU, or a share of one (time-slicing, MPS)
- ``gpu-<index>-mig-<profile>-<start>``: a static MIG instance (or a share of one)
- ``gpu-<index>-dyn-<profile>-<start>``: a DynamicMIG partition, made at prepare time

``<profile>`` is the NVIDIA profile name with ``.`` and ``+`` written as ``-``
(``3g.40gb`` → ``3g-40gb``, ``1g.10gb+me`` → ``1g-10gb-me``); ``<start>`` is the placement's
first memory slice. Not for: looking a device up on a GPU (the agent's inventory does that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from tessera.models.catalog import MEMORY_SLICES

MAX_DEVICE_NAME_LENGTH = 63

_PROFILE_RE = re.compile(r"(?P<compute>[1-9][0-9]*)g\.(?P<memory>[1-9][0-9]*)gb(?:\+(?P<suffix>[a-z]+))?")
_NAME_RE = re.compile(
    r"gpu-(?P<index>0|[1-9][0-9]*)"
    r"(?:-(?P<kind>mig|dyn)-(?P<compute>[1-9][0-9]*)g-(?P<memory>[1-9][0-9]*)gb"
    r"(?:-(?P<suffix>[a-z]+))?-(?P<start>[0-9]+))?"
)


class DeviceKind(StrEnum):
    """What a published device is; the value is the word in its name."""

    GPU = "gpu"  # a whole GPU, or a share of one
    MIG = "mig"  # a static MIG instance, or a share of one
    DYNAMIC_MIG = "dyn"  # a DynamicMIG partition: made at prepare, destroyed at unprepare


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """What a device name says: the GPU by index and, for MIG, the profile and placement."""

    kind: DeviceKind
    gpu_index: int
    profile: str | None = None  # NVIDIA's profile name, e.g. "3g.40gb"; None for whole GPUs
    start: int | None = None  # first memory slice of the placement; None for whole GPUs

    def __post_init__(self) -> None:
        if self.gpu_index < 0:
            raise ValueError(f"GPU index must not be negative, got {self.gpu_index}")
        if self.kind is DeviceKind.GPU:
            if self.profile is not None or self.start is not None:
                raise ValueError("a whole-GPU device has no MIG profile or placement")
            return
        if self.profile is None or _PROFILE_RE.fullmatch(self.profile) is None:
            raise ValueError(
                f"{self.profile!r} is not a MIG profile name; write it like 3g.40gb or 1g.10gb+me"
            )
        if self.start is None or not 0 <= self.start < MEMORY_SLICES:
            raise ValueError(f"placement start must be 0..{MEMORY_SLICES - 1}, got {self.start}")

    @property
    def name(self) -> str:
        """The device name this reference is published under."""
        if self.kind is DeviceKind.GPU:
            return gpu_device_name(self.gpu_index)
        profile, start = self.placement
        return f"gpu-{self.gpu_index}-{self.kind.value}-{_encode_profile(profile)}-{start}"

    @property
    def is_mig(self) -> bool:
        return self.kind is not DeviceKind.GPU

    @property
    def placement(self) -> tuple[str, int]:
        """(profile, start) of a MIG device; a ValueError for a whole GPU."""
        if self.profile is None or self.start is None:
            raise ValueError(f"{self.kind.value} device gpu-{self.gpu_index} has no MIG placement")
        return self.profile, self.start


def _encode_profile(profile: str) -> str:
    return profile.replace(".", "-").replace("+", "-")


def gpu_device_name(gpu_index: int) -> str:
    """``gpu-<index>``: a whole GPU (Exclusive), or the shared GPU (TimeSlicing, MPS)."""
    if gpu_index < 0:
        raise ValueError(f"GPU index must not be negative, got {gpu_index}")
    return f"gpu-{gpu_index}"


# Names are asked for over and over (every decision names every device of a node's GPUs) and
# there are few: a few GPU indexes times the profiles' placements. Errors are not cached.
@lru_cache(maxsize=4096)
def mig_device_name(gpu_index: int, profile: str, start: int) -> str:
    """``gpu-<index>-mig-<profile>-<start>``: a static MIG instance (shared or not)."""
    return DeviceRef(DeviceKind.MIG, gpu_index, profile, start).name


@lru_cache(maxsize=4096)
def dynamic_mig_device_name(gpu_index: int, profile: str, start: int) -> str:
    """``gpu-<index>-dyn-<profile>-<start>``: a DynamicMIG partition at one placement."""
    return DeviceRef(DeviceKind.DYNAMIC_MIG, gpu_index, profile, start).name


def parse_device_name(name: str) -> DeviceRef:
    """Read a published device name back; a ValueError says what a valid name looks like."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        raise ValueError(
            f"{name!r} is not a Tessera device name; expected gpu-<index>, "
            "gpu-<index>-mig-<profile>-<start> or gpu-<index>-dyn-<profile>-<start> "
            "(e.g. gpu-0-mig-3g-40gb-4)"
        )
    index = int(match["index"])
    if match["kind"] is None:
        return DeviceRef(DeviceKind.GPU, index)
    profile = f"{match['compute']}g.{match['memory']}gb"
    if match["suffix"]:
        profile += f"+{match['suffix']}"
    ref = DeviceRef(DeviceKind(match["kind"]), index, profile, int(match["start"]))
    if ref.name != name:  # e.g. a start with a leading zero: not the name we publish
        raise ValueError(f"{name!r} is not in canonical form; the device would be named {ref.name!r}")
    return ref
