"""`benchmarks._tracing_main`, the child of `benchmarks.tracing_overhead`: both models run the whole turn, and with
tracing on every step records its ``chat`` and ``execute_tool`` spans (plus the turn's ``invoke_agent``), so the
"on" figure times real spans and the "off" one none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def _run(module: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _child(mode: str, model: str) -> dict[str, Any]:
    return _run("benchmarks._tracing_main", mode, "--steps", str(STEPS), "--window", "6", "--model", model)


@pytest.mark.parametrize("model", ["adapter", "scripted"])
def test_each_step_is_timed_and_traced_only_when_on(model: str) -> None:
    on, off = _child("on", model), _child("off", model)
    assert on["spans"] == 2 * STEPS + 2  # a chat span per model call (steps + the final one), a tool span per step
    assert off["spans"] == 0
    assert on["per_step_ms"] > 0 and off["per_step_ms"] > 0


def test_several_sessions_in_one_run_are_each_timed_and_traced() -> None:
    on = _run("benchmarks._tracing_main", "on", "--steps", str(STEPS), "--window", "6", "--sessions", "2")
    assert on["spans_per_session"] == [2 * STEPS + 2] * 2  # the second session's spans alone (the first's were sent)
    assert len(on["per_session_ms"]) == 2 and all(ms > 0 for ms in on["per_session_ms"])
    assert on["per_step_ms"] == pytest.approx(sum(on["per_session_ms"]) / 2)


def test_the_engine_row_traces_the_call_only_when_on() -> None:
    """The server-side row (`benchmarks._ledger_main --tracing`): the drive's ``loopd.harness_call`` span and the
    harness's spans under it with tracing on, none off."""

    def child(mode: str) -> dict[str, Any]:
        return _run("benchmarks._ledger_main", "off", "--steps", str(STEPS), "--window", "6", "--tracing", mode)

    on, off = child("on"), child("off")
    assert on["spans"] == 2 * STEPS + 3  # the harness's spans, its turn's and the call's own
    assert off["spans"] == 0
    assert on["per_step_ms"] > 0 and off["per_step_ms"] > 0
