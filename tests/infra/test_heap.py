"""`settle_startup_heap`: the garbage of starting is collected, what is alive is frozen (the collector's permanent
generation), and the metrics report it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from loopd._infra.heap import SERVING_THRESHOLDS, settle_startup_heap
from loopd._infra.metrics import Metrics


@pytest.fixture
def thawed() -> Iterator[None]:
    """Leave the test process's collector as it found it (freezing and thresholds are process-wide)."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_settling_sets_the_serving_thresholds(thawed: None) -> None:
    gc.set_threshold(700, 10, 10)  # CPython's default
    settle_startup_heap()
    assert gc.get_threshold() == SERVING_THRESHOLDS
    assert SERVING_THRESHOLDS[0] > 700  # young collections far apart: a request's short-lived objects die by refcount


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settling_collects_the_garbage_of_starting_then_freezes_what_is_alive(thawed: None) -> None:
    garbage = _Node()
    del garbage  # unreachable, but kept by its own cycle until a collection
    kept = _Node()
    assert gc.is_tracked(kept) and any(o is kept for o in gc.get_objects())

    settled = settle_startup_heap()

    assert settled.collected >= 1  # the cycle dropped above
    assert settled.frozen == gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen: no generation the collector walks holds it
    assert not any(isinstance(o, _Node) and o is not kept for o in gc.get_objects())
    later = _Node()  # what is allocated afterwards is walked as usual
    assert any(o is later for o in gc.get_objects())


def test_a_second_settle_also_freezes_what_started_since(thawed: None) -> None:
    first = settle_startup_heap().frozen
    started_since = [_Node() for _ in range(100)]
    second = settle_startup_heap().frozen
    assert second >= first + len(started_since)


def _samples(text: str) -> dict[str, float]:
    return {
        name: float(value) for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#")
    }


def test_the_metrics_report_the_frozen_objects_and_the_collections(thawed: None) -> None:
    metrics = Metrics()
    assert _samples(metrics.exposition().decode())["loopd_gc_frozen_objects"] == 0.0
    settle_startup_heap()
    samples = _samples(metrics.exposition().decode())
    assert samples["loopd_gc_frozen_objects"] == gc.get_freeze_count() > 0
    assert samples['python_gc_collections_total{generation="2"}'] >= 1  # the settle's own full collection
