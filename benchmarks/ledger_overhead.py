"""Full-ledger overhead: a harness step's wall time through the Harness Engine with every model call's request and
reply stored in the ledger (redacted, content-addressed artifacts) against the trail's usage facts only, at h steps.

python -m benchmarks.ledger_overhead [--repeat N] [--calls C] [--quick] [--steps H]

Each run is a fresh process (`benchmarks._ledger_main`): C harness calls (default 3) one after the other, each on
SQLite (server database and journal) whose turn makes H tool steps (zero-latency scripted model, echo tool with a
200-byte output), the history growing to about 2H messages. The engine follows the harness asynchronously, so the
figure is the call's wall time per step from its start until the engine has applied (and the ledger stored) its last
update, with the process CPU per step beside it, each the mean over the run's calls (on this VM one process can run
1.4× slower than the next: several calls per process and alternating processes keep that out of the ratio). On and
off alternate (off first in even repetitions, on first in odd ones), so drifting machine load hits both; medians of
the runs are reported and the wall-time ratio is checked against the target (≤ 1.2). The stored bytes show the
prefix sharing: a growing conversation stores each message once, not once per call.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks._common import median, print_table, run_child, verdict

TARGET_RATIO = 1.2


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3, help="calls per run (each timed alone)")
    parser.add_argument("--quick", action="store_true", help="one repetition of 60 steps (a smoke run)")
    parser.add_argument("--steps", type=int, default=500, help="history length H in steps (default 500)")
    args = parser.parse_args(argv)
    steps, repeat, calls = (60, 1, 1) if args.quick else (args.steps, args.repeat, args.calls)
    window = min(50, steps)
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    stored: dict[str, dict[str, int]] = {}
    for index in range(repeat):
        for mode in ("off", "on") if index % 2 == 0 else ("on", "off"):
            result = run_child(
                "benchmarks._ledger_main",
                [mode, "--steps", str(steps), "--window", str(window), "--calls", str(calls)],
                timeout=3600,
            )
            per_step[mode].append(float(result["per_step_ms"]))
            cpu[mode].append(float(result["cpu_per_step_ms"]))
            stored[mode] = {key: int(result[key]) for key in ("artifacts", "artifact_bytes", "events")}
    off, on = median(per_step["off"]), median(per_step["on"])
    ratio = on / off if off > 0 else float("nan")
    cpu_off, cpu_on = median(cpu["off"]), median(cpu["on"])
    print_table(
        f"per-step cost at h={steps} through the engine, full ledger on vs off, median of {repeat} runs of {calls} "
        "call(s)",
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
        note="the whole call per step (start to the engine's last update); 'on' stores each request and reply",
    )


if __name__ == "__main__":
    main()
