"""`settle_startup_heap`: the garbage of starting is collected, what is alive is frozen (the collector's permanent
generation), and the metrics report it."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from loopd._infra.heap import SERVING_THRESHOLDS, CollectorPacer, settle_startup_heap
from loopd._infra.metrics import Metrics
from tests.support import cycles


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


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The test process's collector on before, and as it was after (the pacer turns it off and on)."""
    with cycles.collector_on():
        yield


def _holding(pacer: CollectorPacer) -> bool:
    return pacer.holding  # read afresh each time (no narrowing from an earlier assert)


async def test_the_pacer_holds_the_collections_while_busy_and_lets_them_run_after(collector_on: None) -> None:
    pacer = CollectorPacer(bound=60.0)
    pacer.busy(True)
    assert not gc.isenabled() and _holding(pacer) and pacer.deferrals == 1
    pacer.busy(True)  # held already: one hold
    assert pacer.deferrals == 1
    pacer.busy(False)
    assert gc.isenabled() and not _holding(pacer) and pacer.expired == 0
    pacer.busy(False)  # nothing held: nothing to do
    assert gc.isenabled()


async def test_the_pacer_lets_the_collections_run_at_its_bound_however_long_the_work(collector_on: None) -> None:
    pacer = CollectorPacer(bound=0.05)
    pacer.hold()
    assert not gc.isenabled()
    await asyncio.sleep(0.2)
    assert gc.isenabled() and not _holding(pacer) and pacer.expired == 1
    pacer.release()  # the work ends later: the collector stays on
    assert gc.isenabled()


async def test_the_pacer_leaves_a_collector_someone_turned_off_alone(collector_on: None) -> None:
    gc.disable()
    pacer = CollectorPacer()
    pacer.hold()
    assert not _holding(pacer) and pacer.deferrals == 0
    pacer.release()
    assert not gc.isenabled()  # not this pacer's to turn on
    with pytest.raises(ValueError):
        CollectorPacer(bound=0)
