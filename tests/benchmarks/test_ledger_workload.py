"""`benchmarks._ledger_main`, the child of `benchmarks.ledger_overhead`: ``on`` stores every model call's request and
reply as artifacts and ``off`` none, and a run of several calls times each on its own databases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def _child(mode: str, calls: int) -> dict[str, Any]:
    options = ["--steps", str(STEPS), "--window", "5", "--calls", str(calls)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks._ledger_main", mode, *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_full_ledger_stores_artifacts_only_when_on_and_each_call_is_timed() -> None:
    on, off = _child("on", 2), _child("off", 1)
    assert len(on["per_call_ms"]) == 2 and len(off["per_call_ms"]) == 1
    assert on["per_step_ms"] == pytest.approx(sum(on["per_call_ms"]) / 2)
    # one call's ledger (fresh databases per call): a request and a reply per model call, shared prefixes once
    assert on["artifacts"] > 0 and off["artifacts"] == 0
    assert on["events"] == off["events"] > 0


def test_both_modes_alternate_in_one_run() -> None:
    both = _child("both", 2)
    assert set(both) >= {"off", "on"}
    assert len(both["on"]["per_call_ms"]) == 2 and len(both["off"]["per_call_ms"]) == 2
    assert both["on"]["artifacts"] > 0 and both["off"]["artifacts"] == 0  # each call on its own databases
