"""MIG placement: every plan is a valid layout, in-use instances stay put, the planner finds a
layout exactly when a brute-force search does, keeps as many instances as can be kept, and
gives the same answer every time."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.models.catalog import COMPUTE_SLICES, MEMORY_SLICES, SHAPES, ProfileKind
from tessera.planner.mig import (
    Blocked,
    Impossible,
    Placed,
    Placement,
    layout_problems,
    place,
    placements,
    request_of,
    request_problems,
)

KINDS = list(ProfileKind)


def _mask(p: Placement) -> int:
    kind, start = p
    return ((1 << SHAPES[kind].memory_slices) - 1) << start


def _valid(layout: list[Placement]) -> bool:
    """Independent of the planner: starts, bounds, overlaps, counts, compute."""
    used = 0
    for kind, start in layout:
        if start not in SHAPES[kind].starts or start + SHAPES[kind].memory_slices > MEMORY_SLICES:
            return False
        if used & _mask((kind, start)):
            return False
        used |= _mask((kind, start))
    counts = Counter(k for k, _ in layout)
    if any(n > SHAPES[k].max_count for k, n in counts.items()):
        return False
    return sum(SHAPES[k].compute_slices for k, _ in layout) <= COMPUTE_SLICES


def _brute_force(request: list[ProfileKind], in_use: frozenset[Placement]) -> list[frozenset[Placement]]:
    """Every complete layout of ``request`` containing ``in_use``, by trying every start."""
    remaining = Counter(request)
    remaining.subtract(k for k, _ in in_use)
    if any(n < 0 for n in remaining.values()):
        return []
    free = sorted(remaining.elements(), key=lambda k: k.value)
    solutions: set[frozenset[Placement]] = set()
    for starts in itertools.product(*(SHAPES[k].starts for k in free)):
        layout = [*in_use, *zip(free, starts, strict=True)]
        if _valid(layout):
            solutions.add(frozenset(layout))
    return list(solutions)


@st.composite
def gpu_states(draw: st.DrawFn) -> tuple[frozenset[Placement], frozenset[Placement]]:
    """A valid current layout, split into (in use, idle)."""
    layout: list[Placement] = []
    used = 0
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(KINDS))
        start = draw(st.sampled_from(SHAPES[kind].starts))
        if used & _mask((kind, start)) or not _valid([*layout, (kind, start)]):
            continue
        used |= _mask((kind, start))
        layout.append((kind, start))
    in_use = frozenset(p for p in layout if draw(st.booleans()))
    return in_use, frozenset(layout) - in_use


requests = st.lists(st.sampled_from(KINDS), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(request=requests, state=gpu_states())
def test_plan_is_valid_and_keeps_in_use_instances(
    request: list[ProfileKind], state: tuple[frozenset[Placement], frozenset[Placement]]
) -> None:
    in_use, idle = state
    result = place(request_of(request), in_use, idle)
    if isinstance(result, Placed):
        assert layout_problems(result.layout) == []
        assert _valid(list(result.layout))
        assert Counter(k for k, _ in result.layout) == Counter(request)
        assert in_use <= set(result.layout)
        assert list(result.layout) == sorted(result.layout, key=lambda p: p[1])


@settings(max_examples=150, deadline=None)
@given(request=requests, state=gpu_states())
def test_finds_a_layout_exactly_when_brute_force_does_and_keeps_the_most(
    request: list[ProfileKind], state: tuple[frozenset[Placement], frozenset[Placement]]
) -> None:
    in_use, idle = state
    solutions = _brute_force(request, in_use)
    result = place(request_of(request), in_use, idle)
    assert isinstance(result, Placed) == bool(solutions)
    if isinstance(result, Placed):
        assert frozenset(result.layout) in solutions
        assert result.kept == max(len(s & idle) for s in solutions)
    elif not _brute_force(request, frozenset()):
        assert isinstance(result, Impossible)
    else:
        assert isinstance(result, Blocked)
        assert set(result.when_idle) in _brute_force(request, frozenset())


@settings(max_examples=50, deadline=None)
@given(request=requests, state=gpu_states())
def test_same_input_same_output(
    request: list[ProfileKind], state: tuple[frozenset[Placement], frozenset[Placement]]
) -> None:
    in_use, idle = state
    first = place.__wrapped__(request_of(request), in_use, idle)
    placements.cache_clear()
    second = place.__wrapped__(request_of(list(reversed(request))), frozenset(sorted(in_use)), idle)
    assert first == second


def test_balanced_preset_needs_search_not_first_fit() -> None:
    # Largest-first, first-fit puts 3g at 0, 2g at 4, 1g at 6 and finds no room for the last 1g.
    result = place(
        request_of([ProfileKind.THREE, ProfileKind.TWO, ProfileKind.ONE, ProfileKind.ONE]), frozenset(), frozenset()
    )
    assert isinstance(result, Placed)
    assert (ProfileKind.THREE, 4) in result.layout


def test_seven_small_instances_fill_slices_0_to_6() -> None:
    result = place(request_of([ProfileKind.ONE] * 7), frozenset(), frozenset())
    assert isinstance(result, Placed)
    assert [start for _, start in result.layout] == [0, 1, 2, 3, 4, 5, 6]


def test_keeps_an_idle_instance_the_new_layout_also_wants() -> None:
    request = request_of([ProfileKind.THREE, ProfileKind.THREE])
    result = place(request, frozenset(), frozenset({(ProfileKind.THREE, 4), (ProfileKind.ONE, 0)}))
    assert isinstance(result, Placed)
    assert result.kept == 1


def test_counting_refuses_too_many_of_a_kind() -> None:
    result = place(request_of([ProfileKind.FOUR, ProfileKind.FOUR]), frozenset(), frozenset())
    assert isinstance(result, Impossible)
    assert "at most 1 x 4g fit one GPU, 2 asked for" in result.problems


def test_on_an_empty_gpu_every_request_that_counting_allows_has_a_layout() -> None:
    # So an Impossible answer always names a count (slices or max per GPU), never a vague "no fit".
    for n in range(1, 8):
        for combo in itertools.combinations_with_replacement(KINDS, n):
            request = request_of(combo)
            assert isinstance(place(request, frozenset(), frozenset()), Placed) == (not request_problems(request))


def test_four_g_beside_a_two_g_and_a_double_memory_one_g() -> None:
    result = place(request_of([ProfileKind.FOUR, ProfileKind.TWO, ProfileKind.ONE_DOUBLE]), frozenset(), frozenset())
    assert isinstance(result, Placed)
    assert result.layout == ((ProfileKind.FOUR, 0), (ProfileKind.TWO, 4), (ProfileKind.ONE_DOUBLE, 6))


def test_blocked_names_the_wanted_slices_and_the_instance_in_use() -> None:
    request = request_of([ProfileKind.THREE, ProfileKind.TWO, ProfileKind.ONE, ProfileKind.ONE])
    result = place(request, frozenset({(ProfileKind.ONE, 5)}), frozenset())
    assert isinstance(result, Blocked)
    assert result.conflicts == (((ProfileKind.THREE, 4), (ProfileKind.ONE, 5)),)
