"""Tracing overhead: a harness step's wall time with tracing on (the SDK's in-memory exporter) and off, at h steps.

python -m benchmarks.tracing_overhead [--repeat N] [--quick] [--steps H]

Each run is a fresh process (`benchmarks._tracing_main`): one session on a SQLite journal whose turn makes H tool
steps (zero-latency scripted model, echo tool); the figure is the mean time per step over the last 50 steps, where
the history holds about 2H messages, entered right after a full garbage collection in both modes (so a full pass
landing in the window by chance does not decide the figure). On and off alternate, so drifting machine load hits
both; medians are reported and their ratio is checked against the target (≤ 1.2).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks._common import median, print_table, run_child, verdict

TARGET_RATIO = 1.2


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repetition of 60 steps (a smoke run)")
    parser.add_argument("--steps", type=int, default=500, help="history length H in steps (default 500)")
    args = parser.parse_args(argv)
    steps, repeat = (60, 1) if args.quick else (args.steps, args.repeat)
    window = min(50, steps)
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    spans = 0
    for _ in range(repeat):
        for mode in ("off", "on"):
            result = run_child(
                "benchmarks._tracing_main", [mode, "--steps", str(steps), "--window", str(window)], timeout=1800
            )
            per_step[mode].append(float(result["per_step_ms"]))
            spans = max(spans, int(result["spans"]))
    off, on = median(per_step["off"]), median(per_step["on"])
    ratio = on / off if off > 0 else float("nan")
    print_table(
        f"per-step cost at h={steps}, tracing on (in-memory exporter) vs off, median of {repeat}",
        ["tracing", "ms per step", "ratio to off", f"target ≤ {TARGET_RATIO}"],
        [
            ("off", off, 1.0, ""),
            ("on", on, ratio, verdict(ratio <= TARGET_RATIO)),
        ],
        note=f"{spans} spans recorded in one traced run; mean over the last {window} steps of each run, "
        "entered after a full collection in both modes",
    )


if __name__ == "__main__":
    main()
