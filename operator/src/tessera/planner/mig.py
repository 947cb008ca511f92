"""MIG placement: which profile goes at which memory slice on one GPU.

Exact and small. A request (profile kinds with counts) has few complete placements on an
8-slice GPU, so :func:`placements` lists them all once (cached per request) and
:func:`place` picks the best that keeps every in-use instance where it is: most existing
instances kept, then the lexicographically smallest layout. When nothing fits, the answer
says why: the request cannot fit any GPU of that model, or named in-use instances block it.
Not for: choosing profiles from a policy (``tessera.planner.gpu``) or NVML (the agent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from tessera.models.catalog import COMPUTE_SLICES, MEMORY_SLICES, SHAPES, ProfileKind, ProfileShape

# A placement: (kind, start). A layout: placements sorted by (start, kind).
Placement = tuple[ProfileKind, int]
Layout = tuple[Placement, ...]
# A request: (kind, count) pairs, sorted, counts > 0.
Request = tuple[tuple[ProfileKind, int], ...]

_KIND_ORDER = {kind: i for i, kind in enumerate(ProfileKind)}


def request_of(kinds: Iterable[ProfileKind]) -> Request:
    """The canonical request for a bag of profile kinds."""
    counts = Counter(kinds)
    return tuple(sorted(counts.items(), key=lambda kc: _KIND_ORDER[kc[0]]))


def slices(placement: Placement) -> range:
    """Memory slices a placement covers."""
    kind, start = placement
    return range(start, start + SHAPES[kind].memory_slices)


def _mask(placement: Placement) -> int:
    kind, start = placement
    return ((1 << SHAPES[kind].memory_slices) - 1) << start


def _sort_layout(layout: Iterable[Placement]) -> Layout:
    return tuple(sorted(layout, key=lambda p: (p[1], _KIND_ORDER[p[0]])))


def layout_problems(layout: Sequence[Placement]) -> list[str]:
    """Why ``layout`` is not a valid MIG layout (empty when it is): starts, overlaps, limits."""
    problems: list[str] = []
    used = 0
    for kind, start in layout:
        shape = SHAPES[kind]
        if start not in shape.starts:
            problems.append(f"{kind.value} cannot start at slice {start}")
        mask = _mask((kind, start))
        if used & mask:
            problems.append(f"{kind.value} at slice {start} overlaps another instance")
        used |= mask
        if start + shape.memory_slices > MEMORY_SLICES:
            problems.append(f"{kind.value} at slice {start} runs past slice {MEMORY_SLICES - 1}")
    for kind, count in Counter(k for k, _ in layout).items():
        if count > SHAPES[kind].max_count:
            problems.append(f"{count} x {kind.value} exceeds the maximum of {SHAPES[kind].max_count}")
    compute = sum(SHAPES[k].compute_slices for k, _ in layout)
    if compute > COMPUTE_SLICES:
        problems.append(f"{compute} compute slices exceed the {COMPUTE_SLICES} a GPU has")
    return problems


def request_problems(request: Request) -> list[str]:
    """Why ``request`` can fit no GPU at all, judged by counting (before any search)."""
    problems: list[str] = []
    for kind, count in request:
        shape = SHAPES[kind]
        if count > shape.max_count:
            problems.append(f"at most {shape.max_count} x {kind.value} fit one GPU, {count} asked for")
    memory = sum(SHAPES[k].memory_slices * n for k, n in request)
    if memory > MEMORY_SLICES:
        problems.append(f"they need {memory} memory slices; a GPU has {MEMORY_SLICES}")
    compute = sum(SHAPES[k].compute_slices * n for k, n in request)
    if compute > COMPUTE_SLICES:
        problems.append(f"they need {compute} compute slices; a GPU has {COMPUTE_SLICES}")
    return problems


@cache
def placements(request: Request) -> tuple[Layout, ...]:
    """Every complete layout of ``request`` on an empty GPU, each sorted, all in ascending
    order. Identical instances are interchangeable, so each layout appears once."""
    if request_problems(request):
        return ()
    # Biggest kinds first: they have the fewest starts, so the search prunes early.
    items: list[ProfileShape] = []
    for kind, count in sorted(request, key=lambda kc: (-SHAPES[kc[0]].memory_slices, _KIND_ORDER[kc[0]])):
        items.extend([SHAPES[kind]] * count)
    found: list[Layout] = []
    chosen: list[Placement] = []

    def search(i: int, used: int, min_start: int) -> None:
        if i == len(items):
            found.append(_sort_layout(chosen))
            return
        shape = items[i]
        next_same = i + 1 < len(items) and items[i + 1] is shape
        for start in shape.starts:
            if start < min_start:
                continue
            mask = ((1 << shape.memory_slices) - 1) << start
            if used & mask:
                continue
            chosen.append((shape.kind, start))
            search(i + 1, used | mask, start + 1 if next_same else 0)
            chosen.pop()

    search(0, 0, 0)
    return tuple(sorted(set(found), key=_layout_key))


def _layout_key(layout: Layout) -> tuple[tuple[int, int], ...]:
    return tuple((start, _KIND_ORDER[kind]) for kind, start in layout)


@dataclass(frozen=True, slots=True)
class Placed:
    """A layout that satisfies the request with every in-use instance in place."""

    layout: Layout
    kept: int  # existing instances the layout keeps


@dataclass(frozen=True, slots=True)
class Blocked:
    """No layout fits around the in-use instances; ``conflicts`` says which block what.

    ``when_idle`` is the layout the request would get once those instances are free (the
    one that keeps the most existing instances), so a drain knows what it drains towards."""

    conflicts: tuple[tuple[Placement, Placement], ...]  # (wanted placement, in-use placement)
    unwanted: tuple[Placement, ...]  # in-use instances the request has no room for
    when_idle: Layout


@dataclass(frozen=True, slots=True)
class Impossible:
    """The request fits no GPU of this shape, whatever is in use."""

    problems: tuple[str, ...]


PlaceResult = Placed | Blocked | Impossible


@cache
def place(request: Request, in_use: frozenset[Placement], existing: frozenset[Placement]) -> PlaceResult:
    """The best layout for ``request`` that keeps every ``in_use`` placement, preferring
    ``existing`` (idle) placements; or why there is none.

    ``in_use`` and ``existing`` hold placements of instances the GPU has now (an instance
    whose profile the catalog does not know has no placement here: the caller decides)."""
    candidates = placements(request)
    if not candidates:
        problems = request_problems(request)
        if not problems:
            names = ", ".join(f"{n} x {k.value}" for k, n in request)
            starts = "; ".join(f"{k.value} starts at {', '.join(map(str, SHAPES[k].starts))}" for k, _ in request)
            problems = [f"no arrangement of {names} fits the valid placements ({starts})"]
        return Impossible(tuple(problems))
    best: Layout | None = None
    best_kept = -1
    for layout in candidates:
        as_set = set(layout)
        if not in_use <= as_set:
            continue
        kept = len(as_set & existing)
        if kept > best_kept:  # candidates are in ascending order: the first of a tie wins
            best, best_kept = layout, kept
    if best is not None:
        return Placed(best, best_kept)
    return _explain(request, in_use, existing, candidates)


def _explain(
    request: Request, in_use: frozenset[Placement], existing: frozenset[Placement], candidates: tuple[Layout, ...]
) -> Blocked:
    """The nearest layout to the in-use set, and what stands in its way."""
    wanted = Counter(k for k, _ in in_use)
    asked = dict(request)
    unwanted = _sort_layout(p for p in in_use if wanted[p[0]] > asked.get(p[0], 0))

    def distance(layout: Layout) -> tuple[int, int, int]:
        as_set = set(layout)
        missing = len(in_use - as_set)
        overlapping = sum(1 for p in layout if p not in in_use for q in in_use if _mask(p) & _mask(q))
        return (missing, overlapping, -len(as_set & existing))

    nearest = min(candidates, key=distance)  # min keeps the first of a tie: deterministic
    conflicts = tuple((p, q) for p in nearest if p not in in_use for q in _sort_layout(in_use) if _mask(p) & _mask(q))
    # max keeps the first of a tie, and candidates are in ascending order: deterministic.
    when_idle = max(candidates, key=lambda layout: len(set(layout) & (existing | in_use)))
    return Blocked(conflicts, unwanted, when_idle)
