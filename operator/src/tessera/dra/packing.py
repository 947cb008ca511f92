"""Publication order that makes the scheduler's first fit a best fit, from static facts only.

The DRA allocator in kube-scheduler 1.36 is first fit: within a node's pool it walks slices
sorted by name and, in each slice, devices in the order they are listed, and takes the first
device (set) that satisfies the claim (``k8s.io/dynamic-resource-allocation``
``structured/internal/*/pools_*.go`` sorts slices by name; the devices keep list order).
What is listed first is tried first, so the order Tessera publishes in steers placement:

- Across GPUs the order is the GPU index: a node's GPUs share slices (``<node>-tessera-gpus``,
  ``-01``, …, names that sort in fill order, see ``tessera.dra.slices``), GPU after GPU by
  index, so the order is fixed for the life of a GPU. A fixed order is what makes first fit
  pack: every claim tries the same GPU first, so a partly used GPU (or MIG instance, or shared
  device) keeps filling before the next one is touched, and the GPUs further down stay whole
  for large requests.
- Within one GPU's devices (this module): smaller devices first, so a request that several
  devices would satisfy takes the smallest; and for DynamicMIG, among the placements of one
  profile, the placement that blocks least of the others first (:func:`placement_cost`), so a
  small instance lands where it fragments least — a 1g goes to memory slice 6, then 5, 4, …,
  leaving slices 0-3 free for a 4g or a 3g as long as possible.

Only static facts decide the order (profile shape, placement, instance size), never live
usage: an allocation or release changes nothing the operator publishes, so "a publish with
nothing new writes nothing" stays true and no allocation causes a slice rewrite. Live packing
is the allocator's own consequence of the fixed order (counters and consumed capacity are
what it checks against, not our list). Renaming slices by usage would rename (create and
delete) slices on every allocation, bump the pool generation and rewrite the whole pool —
that is the storm this module avoids.
Not for: building devices (``tessera.dra.devices``) or slices (``tessera.dra.slices``).
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache

from tessera.models.catalog import MEMORY_SLICES, SHAPES, ProfileKind, ProfileShape
from tessera.models.layout import MigInstanceStatus


def _overlap(start_a: int, size_a: int, start_b: int, size_b: int) -> bool:
    return start_a < start_b + size_b and start_b < start_a + size_a


def _valid_starts(shape: ProfileShape) -> tuple[int, ...]:
    return tuple(s for s in shape.starts if s + shape.memory_slices <= MEMORY_SLICES)


@cache
def placement_cost(kind: ProfileKind, start: int) -> Fraction:
    """How much of the GPU's other room a placement of ``kind`` at ``start`` takes away.

    For every other profile shape, the fraction of its placements this one overlaps, summed:
    a 1g at slice 0 removes the only 4g placement (1), one of two 3g (1/2), one of three 2g
    (1/3), one of four double-memory 1g (1/4) and the 7g (1); a 1g at slice 6 removes one 3g,
    one double 1g and the 7g. Lower is better; the 7g term is the same for every placement."""
    shape = SHAPES[kind]
    cost = Fraction(0)
    for other in SHAPES.values():
        if other.kind is kind:
            continue
        starts = _valid_starts(other)
        if not starts:
            continue
        hit = sum(1 for s in starts if _overlap(start, shape.memory_slices, s, other.memory_slices))
        cost += Fraction(hit, len(starts))
    return cost


def dynamic_placement_order(kind: ProfileKind, start: int, name: str) -> tuple[int, int, int, Fraction, int, str]:
    """Sort key of a DynamicMIG placement: smaller profiles first (fewer memory slices, then
    compute slices, the media-engine variant after the plain one), then the placement that
    fragments least, then the higher start, then the name (total and stable)."""
    shape = SHAPES[kind]
    media = 1 if kind is ProfileKind.ONE_MEDIA else 0
    return (shape.memory_slices, shape.compute_slices, media, placement_cost(kind, start), -start, name)


def static_instance_order(instance: MigInstanceStatus, name: str) -> tuple[int, int, int, str]:
    """Sort key of an existing MIG instance: smaller first (memory slices, then memory), then
    by placement and name, so a request several instances satisfy takes the smallest."""
    return (instance.size, instance.memory_mib, instance.start, name)
