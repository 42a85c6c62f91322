"""Tracing overhead: a harness step's wall time with tracing on (the SDK's in-memory exporter) and off, at h steps.

python -m benchmarks.tracing_overhead [--repeat N] [--sessions S] [--quick] [--steps H]

Each run is a fresh process (`benchmarks._tracing_main`): S sessions (default 5) one after the other, each on its
own SQLite journal, whose turn makes H tool steps (echo tool); the run's figure is the mean over its sessions of the
time per step over each session's last 100 steps, where the history holds about 2H messages, entered right after a
full garbage collection in both modes (so a full pass landing in the window by chance does not decide the figure).
One 100-step window is about 0.1 s, and on this VM one process can run 1.7× slower than the next: S windows per
process and N processes per mode keep that noise out of the ratio.

The judged row runs every step as a real loopd call runs it: loopd's OpenAI-compatible adapter builds the request
from the history and sends it through an in-process transport that answers at once (the peers benchmark's workload).
A second row, not judged, answers in process with a scripted model (no request built): tracing's fixed cost over the
cheapest step loopd can make. On and off alternate, and so do the two models, so drifting machine load hits all four
alike; medians are reported, and the adapter row's ratio is checked against the target (≤ 1.2).

A third row takes the step as loop-server runs it: one harness call through the Harness Engine
(`benchmarks._ledger_main` with the full ledger off, ``--tracing on|off``), the call's wall time per step from its
start until the engine applied its last update — the workload of `benchmarks.ledger_overhead`, where the engine's
projection, trail and checkpoints share the step. It is judged too: both rows must meet the target.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks._children import run_main
from benchmarks._common import median, positive_int, print_table, run_child, verdict

TARGET_RATIO = 1.2
MODELS = ("adapter", "scripted")
ENGINE = "engine"
LABELS = {
    "adapter": "harness, real adapter",
    "scripted": "harness, scripted model (not judged)",
    ENGINE: "through the engine (loop-server)",
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=positive_int, default=9)
    parser.add_argument("--sessions", type=positive_int, default=5, help="sessions per harness run (each timed alone)")
    parser.add_argument("--quick", action="store_true", help="one repetition of 60 steps (a smoke run)")
    parser.add_argument("--steps", type=positive_int, default=500, help="history length H in steps (default 500)")
    args = parser.parse_args(argv)
    steps, repeat, sessions = (60, 1, 1) if args.quick else (args.steps, args.repeat, args.sessions)
    window = min(100, steps // 2)
    per_step: dict[tuple[str, str], list[float]] = {
        (model, mode): [] for model in (*MODELS, ENGINE) for mode in ("off", "on")
    }
    spans = 0
    for index in range(repeat):
        for model in MODELS if index % 2 == 0 else MODELS[::-1]:
            for mode in ("off", "on") if index % 2 == 0 else ("on", "off"):
                result = run_child(
                    "benchmarks._tracing_main",
                    [
                        mode,
                        "--steps",
                        str(steps),
                        "--window",
                        str(window),
                        "--model",
                        model,
                        "--sessions",
                        str(sessions),
                    ],
                    timeout=1800,
                )
                per_step[model, mode].append(float(result["per_step_ms"]))
                spans = max(spans, int(result["spans"]))
        for mode in ("off", "on") if index % 2 == 0 else ("on", "off"):
            result = run_child(
                "benchmarks._ledger_main", ["off", "--steps", str(steps), "--tracing", mode], timeout=3600
            )
            per_step[ENGINE, mode].append(float(result["per_step_ms"]))
    rows: list[tuple[object, ...]] = []
    for model in (*MODELS, ENGINE):
        off, on = median(per_step[model, "off"]), median(per_step[model, "on"])
        ratio = on / off if off > 0 else float("nan")
        judged = model != "scripted"
        label = LABELS[model]
        rows.append((label, "off", off, 1.0, ""))
        rows.append((label, "on", on, ratio, verdict(ratio <= TARGET_RATIO) if judged else ""))
    print_table(
        f"per-step cost at h={steps}, tracing on (in-memory exporter) vs off, median of {repeat}",
        ["step", "tracing", "ms per step", "ratio to off", f"target ≤ {TARGET_RATIO}"],
        rows,
        note=f"{spans} spans recorded in one traced session; harness rows: each run's figure is the mean over its "
        f"{sessions} session(s) of the mean over each session's last {window} steps, entered "
        "after a full collection in both modes; the real adapter builds each request from the history and sends it "
        "through an in-process OpenAI-compatible transport, the scripted model builds none; the engine row is the "
        "whole call per step (start to the engine's last update, scripted model, full ledger off), as in "
        "ledger_overhead",
    )


if __name__ == "__main__":
    run_main(main)
