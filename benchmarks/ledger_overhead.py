"""Full-ledger overhead: a harness step's wall time through the Harness Engine with every model call's request and
reply stored in the ledger (redacted, content-addressed artifacts) against the trail's usage facts only, at h steps.

python -m benchmarks.ledger_overhead [--repeat N] [--calls C] [--quick] [--steps H]

Each run is a fresh process (`benchmarks._ledger_main both`): C harness calls (default 3) with the full ledger off
and C with it on, alternating (off, on, on, off, …), each on its own SQLite databases (server database and journal),
whose turn makes H tool steps (zero-latency scripted model, echo tool with a 200-byte output), the history growing
to about 2H messages. The engine follows the harness asynchronously, so a call's figure is its wall time per step
from its start until the engine has applied (and the ledger stored) its last update, with the process CPU per step
beside it. A run's ratio is the mean of its on calls over the mean of its off calls: both modes share the process,
because on this VM one process can run 1.4× slower than the next, which decided ratios taken across processes. The
judged ratio is the median of the runs' ratios (≤ 1.2); the ms columns are the medians of the runs' means. The
stored bytes show the prefix sharing: a growing conversation stores each message once, not once per call.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks._children import run_main
from benchmarks._common import median, positive_int, print_table, run_child, verdict

TARGET_RATIO = 1.2


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--calls", type=positive_int, default=3, help="calls per run (each timed alone)")
    parser.add_argument("--quick", action="store_true", help="one repetition of 60 steps (a smoke run)")
    parser.add_argument("--steps", type=positive_int, default=500, help="history length H in steps (default 500)")
    args = parser.parse_args(argv)
    steps, repeat, calls = (60, 1, 1) if args.quick else (args.steps, args.repeat, args.calls)
    window = min(50, steps)
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []
    stored: dict[str, dict[str, int]] = {}
    for _ in range(repeat):
        result = run_child(
            "benchmarks._ledger_main",
            ["both", "--steps", str(steps), "--window", str(window), "--calls", str(calls)],
            timeout=3600,
        )
        for mode in ("off", "on"):
            per_step[mode].append(float(result[mode]["per_step_ms"]))
            cpu[mode].append(float(result[mode]["cpu_per_step_ms"]))
            stored[mode] = {key: int(result[mode][key]) for key in ("artifacts", "artifact_bytes", "events")}
        ratios.append(per_step["on"][-1] / per_step["off"][-1])
    off, on = median(per_step["off"]), median(per_step["on"])
    ratio = median(ratios)
    cpu_off, cpu_on = median(cpu["off"]), median(cpu["on"])
    print_table(
        f"per-step cost at h={steps} through the engine, full ledger on vs off, median of {repeat} runs of {calls} "
        "call(s) each, the modes alternating within a run",
        [
            "full ledger",
            "ms per step",
            "ratio to off",
            f"target ≤ {TARGET_RATIO}",
            "CPU ms per step",
            "artifacts",
            "KiB stored",
            "events",
        ],
        [
            (
                "off",
                off,
                1.0,
                "",
                cpu_off,
                stored["off"]["artifacts"],
                stored["off"]["artifact_bytes"] / 1024,
                stored["off"]["events"],
            ),
            (
                "on",
                on,
                ratio,
                verdict(ratio <= TARGET_RATIO),
                cpu_on,
                stored["on"]["artifacts"],
                stored["on"]["artifact_bytes"] / 1024,
                stored["on"]["events"],
            ),
        ],
        note="the whole call per step (start to the engine's last update); 'on' stores each request and reply; the "
        "ratio is the median of each run's on/off ratio (both modes in one process)",
    )


if __name__ == "__main__":
    run_main(main)
