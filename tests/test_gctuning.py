"""The operator's collector settings: the young threshold is raised, the older ratios are kept,
and each collection's time is counted once, however often ``tune`` is called."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tessera import gctuning


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold, callbacks = gc.get_threshold(), list(gc.callbacks)
    yield
    gc.enable()
    gc.set_threshold(*threshold)
    gc.callbacks[:] = callbacks


def _seconds(generation: int) -> float:
    return gctuning.GC_SECONDS.labels(str(generation))._value.get()


@pytest.mark.usefixtures("restored_gc")
def test_tune_raises_the_young_threshold_and_keeps_the_older_ratios() -> None:
    gc.set_threshold(700, 7, 9)
    gctuning.tune()
    assert gc.get_threshold() == (gctuning.YOUNG_THRESHOLD, 7, 9)
    gctuning.tune(5_000)
    assert gc.get_threshold() == (5_000, 7, 9)


@pytest.mark.usefixtures("restored_gc")
def test_each_collection_is_timed_once_into_its_generation() -> None:
    gctuning.tune()
    gctuning.tune()
    assert sum(isinstance(c, gctuning._Timer) for c in gc.callbacks) == 1
    gc.disable()  # no automatic collection in between: only the one asked for below
    before = [_seconds(g) for g in range(3)]
    garbage = [[] for _ in range(200_000)]  # a full collection has something to walk
    for item in garbage:
        item.append(item)  # cycles: only the collector frees them
    del garbage
    gc.collect(2)
    after = [_seconds(g) for g in range(3)]
    assert after[2] > before[2], "a full collection's time is counted under generation 2"
    assert after[:2] == before[:2], "and under no other"


@pytest.mark.usefixtures("restored_gc")
def test_freeze_leaves_what_is_alive_out_of_later_walks_and_frees_it_still_by_count() -> None:
    kept = [[] for _ in range(50_000)]  # alive when frozen
    try:
        gctuning.freeze()
        assert gc.get_freeze_count() >= len(kept)
        tracked = len(gc.get_objects())  # what a full collection walks: frozen objects are not among them
        assert tracked < gc.get_freeze_count()
        frozen = gc.get_freeze_count()
        del kept
        assert gc.get_freeze_count() <= frozen - 50_000, "frozen objects are still freed by reference counting"
    finally:
        gc.unfreeze()
