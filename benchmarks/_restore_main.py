"""Restore one stored session in a fresh process (as after a crash) and print the timings as one JSON line.

python -m benchmarks._restore_main --db PATH --events N [--freeze] [--no-snapshots] [--profile FILE]

``restore_ms`` is `Rig.restore_session` end to end (open the writer, load the newest state snapshot, read, decode and
fold the records after it, start the loops; ``--no-snapshots``: read, decode and fold every record);
``gc_ms`` the part of it spent in the cyclic garbage collector; ``read_ms`` one plain `journal.read` of the same
session afterwards (warm), for scale. ``--freeze`` calls ``gc.freeze()`` after the imports first, to show what
the collector costs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from pathlib import Path

from benchmarks._workload import GcTime
from loopd.harness import EchoTool, LoopDefinition, Reply, Rig, ScriptedModel, SqliteJournal

SESSION = "big"


async def restore(path: Path, n_events: int, profile: Path | None, snapshots: bool) -> dict[str, float]:
    journal = await SqliteJournal.open(path)
    try:
        model = ScriptedModel([], default=Reply(text="done"))
        rig = Rig(
            loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))],
            journal=journal,
            # The session must not save a new snapshot on shutdown's commit: every run restores the same way.
            state_snapshots=10**12 if snapshots else None,
        )
        gc_time = GcTime()
        profiler = None
        if profile is not None:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0002, async_mode="enabled")
            profiler.start()
        with gc_time.measuring():
            started = time.perf_counter()
            session = await rig.restore_session(SESSION)
            total = time.perf_counter() - started
        if profiler is not None and profile is not None:
            profiler.stop()
            profile.write_text(profiler.output_text(unicode=True, color=False, show_all=False))
        if session.state.last_seq < n_events:
            raise SystemExit(f"restored to seq {session.state.last_seq}, expected at least {n_events}")
        await session.shutdown()
        started = time.perf_counter()
        records = await journal.read(SESSION)
        read = time.perf_counter() - started
        del records
    finally:
        await journal.aclose()
    return {"restore_ms": total * 1000, "gc_ms": gc_time.seconds * 1000, "read_ms": read * 1000}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() before restoring")
    parser.add_argument("--no-snapshots", action="store_true", help="ignore state snapshots: fold the whole journal")
    parser.add_argument("--profile", type=Path, default=None, help="write a pyinstrument text report here")
    args = parser.parse_args()
    if args.freeze:
        gc.freeze()
    result = asyncio.run(restore(args.db, args.events, args.profile, not args.no_snapshots))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
