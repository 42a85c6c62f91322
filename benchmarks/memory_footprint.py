"""Memory: per idle harness session (in-process), and per idle SSE stream on a `loopd up` server.

* Idle sessions: in a fresh interpreter, the standard rig (`open_standard_rig`, demo model, the built-in tools)
  with its `SqliteJournal`, or the same rig with a `MemoryJournal`; after a few warm-up sessions, ``--sessions``
  more are started and left idle. Reported per session: the VmRSS delta and, in a second fresh interpreter, the
  tracemalloc delta (Python allocations still alive), plus the start time; the allocation sites that hold most of
  it are printed (tracemalloc, by line).
* Idle streams: a `loopd up` subprocess; idle ``GET /v1/conversations/{id}/stream`` connections are opened from
  this process in steps, and the server's VmRSS is read after each step. Reported: the least-squares slope (KiB
  per connection) and the server's CPU use while the streams sit idle (each open stream re-reads the database
  every poll interval).

python -m benchmarks.memory_footprint [--sessions 200] [--streams 1000] [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table, run_child, verdict
from benchmarks._server import Api, EventStream, now, open_event_stream, raise_open_files, rss_kb
from benchmarks._server import running_server as start_server
from loopd.harness.actors import Rig, Session
from loopd.harness.journal import MemoryJournal
from loopd.harness.models import ModelConfig
from loopd.harness.standard import HarnessSettings, open_standard_rig

GOAL_SESSION_KB: Final = 20.0
WARMUP: Final = 5
SETTLE: Final = 1.5
IDLE_WINDOW: Final = 4.0
TOP_SITES: Final = 10
SITE_FRAMES: Final = 60
SITE_SESSIONS: Final = 20


# --- idle sessions (runs in a child interpreter) -----------------------------------------------------------


async def _idle_sessions(journal: str, count: int, frames: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="loopd-bench-memory-") as directory:
        root = Path(directory)
        settings = HarnessSettings(workspace=root / "workspace", data_dir=root / "harness", model=ModelConfig())
        async with open_standard_rig(settings) as standard:
            rig: Rig = standard if journal == "sqlite" else dataclasses.replace(standard, journal=MemoryJournal())
            sessions: list[Session] = [await rig.start_session() for _ in range(WARMUP)]
            await asyncio.sleep(0.2)
            gc.collect()
            if frames:
                tracemalloc.start(frames)
            before_rss, before_traced = rss_kb(os.getpid()), tracemalloc.get_traced_memory()[0]
            before = tracemalloc.take_snapshot() if frames > 1 else None
            starts: list[float] = []
            for _ in range(count):
                t0 = time.perf_counter()
                sessions.append(await rig.start_session())
                starts.append(time.perf_counter() - t0)
            await asyncio.sleep(0.5)
            gc.collect()
            after_rss, after_traced = rss_kb(os.getpid()), tracemalloc.get_traced_memory()[0]
            sites: list[tuple[str, float]] = []
            if before is not None:
                sites = _sites(tracemalloc.take_snapshot().compare_to(before, "traceback"), count)
            tracemalloc.stop()
            await asyncio.gather(*(s.shutdown() for s in sessions))
    return {
        "rss_kb": (after_rss - before_rss) / count,
        "traced_kb": (after_traced - before_traced) / 1024 / count,
        "start_ms": statistics.median(starts) * 1000,
        "sites": sites,
    }


def _sites(stats: Sequence[tracemalloc.StatisticDiff], count: int) -> list[tuple[str, float]]:
    """KiB per session by the most recent loopd line on each allocation's stack (the code that asked for it)."""
    totals: dict[str, int] = {}
    for stat in stats:
        stack = list(stat.traceback)  # oldest first
        ours = [f for f in stack if "/loopd/" in f.filename]
        frame = ours[-1] if ours else stack[-1]
        where = f"{_short(frame.filename)}:{frame.lineno}" + ("" if ours else " (no loopd frame on the stack kept)")
        totals[where] = totals.get(where, 0) + stat.size_diff
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:TOP_SITES]
    return [(where, size / 1024 / count) for where, size in ranked]


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/src/", "/lib/python"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _child_main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", choices=("sqlite", "memory"), required=True)
    parser.add_argument("--sessions", type=positive_int, required=True)
    parser.add_argument("--frames", type=int, default=0, help="tracemalloc frames (0: RSS only; >1: also sites)")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(_idle_sessions(args.journal, args.sessions, args.frames))), flush=True)


def idle_session(journal: str, count: int, frames: int) -> dict[str, Any]:
    args = ["--child", "--journal", journal, "--sessions", str(count), "--frames", str(frames)]
    return run_child("benchmarks.memory_footprint", args, timeout=600)


# --- idle SSE streams on the server ------------------------------------------------------------------------


def _slope(points: Sequence[tuple[int, float]]) -> float:
    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


async def _idle_streams(steps: Sequence[int]) -> dict[str, Any]:
    raise_open_files(max(steps) + 512)
    with (
        tempfile.TemporaryDirectory(prefix="loopd-bench-sse-memory-") as directory,
        start_server(Path(directory)) as server,
    ):
        async with Api(server) as api:
            conversation = await api.create_conversation("idle streams")
        path = f"/v1/conversations/{conversation}/stream"
        gate = asyncio.Semaphore(32)

        async def connect() -> EventStream:
            async with gate:
                return await open_event_stream(server.host, server.port, path, token=server.token, timeout=60)

        async def idle_cpu() -> float:
            cpu0, t0 = server.cpu_seconds(), now()
            await asyncio.sleep(IDLE_WINDOW)
            return (server.cpu_seconds() - cpu0) / (now() - t0)

        streams: list[EventStream] = []
        try:
            await asyncio.sleep(SETTLE)
            points: list[tuple[int, float]] = [(0, float(server.rss_kb()))]
            cpu_empty = await idle_cpu()
            for target in steps:
                streams += await asyncio.gather(*(connect() for _ in range(target - len(streams))))
                await asyncio.sleep(SETTLE)
                points.append((len(streams), float(server.rss_kb())))
            cpu_full = await idle_cpu()
        finally:
            await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
    return {
        "kb_per_stream": _slope(points),
        "points": points,
        "cpu_empty": cpu_empty,
        "cpu_full": cpu_full,
        "streams": len(streams),
    }


# --- main --------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        _child_main(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=positive_int, default=200, help="idle harness sessions")
    parser.add_argument("--streams", type=positive_int, default=1000, help="idle SSE streams at the last step")
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run, 50 sessions, 200 streams")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else max(1, args.repeat)
    sessions = 50 if args.quick else args.sessions
    top = 200 if args.quick else args.streams
    steps = [round(top * k / 4) for k in range(1, 5)]

    session_rows: list[tuple[object, ...]] = []
    for journal in ("sqlite", "memory"):
        rss = [idle_session(journal, sessions, frames=0) for _ in range(repeat)]
        traced = idle_session(journal, sessions, frames=1)  # allocations are deterministic: one run
        rss_kb_ = statistics.median(r["rss_kb"] for r in rss)
        start_ms = statistics.median(r["start_ms"] for r in rss)
        session_rows.append(
            (
                f"standard rig, {journal} journal",
                sessions,
                rss_kb_,
                traced["traced_kb"],
                start_ms,
                verdict(traced["traced_kb"] * 1024 < GOAL_SESSION_KB * 1000),
            )
        )
        print(f"  {journal}: RSS {rss_kb_:.1f} KiB, traced {traced['traced_kb']:.1f} KiB per idle session", flush=True)
    site_sessions = 5 if args.quick else SITE_SESSIONS
    sites = idle_session("sqlite", site_sessions, frames=SITE_FRAMES)
    print_table(
        f"Idle harness session: memory per session (RSS: median of {repeat} fresh interpreter(s))",
        ["rig", "sessions", "RSS KiB/session", "tracemalloc KiB/session", "start ms p50", "goal < 20 KB"],
        session_rows,
        note=f"Deltas over the sessions started after {WARMUP} warm-up sessions; RSS (and start time) and "
        "tracemalloc in separate fresh interpreters. The goal is judged on tracemalloc (RSS moves in allocator-arena "
        "steps).",
    )
    print_table(
        f"Idle harness session: who allocates it (tracemalloc over {site_sessions} sessions, SQLite journal; "
        f"{sites['traced_kb']:.1f} KiB/session in all)",
        ["loopd line on the allocating stack (most recent)", "KiB/session"],
        list(sites["sites"]),
    )

    runs = [asyncio.run(_idle_streams(steps)) for _ in range(repeat)]
    slope = statistics.median(r["kb_per_stream"] for r in runs)
    cpu_empty = statistics.median(r["cpu_empty"] for r in runs)
    cpu_full = statistics.median(r["cpu_full"] for r in runs)
    middle = sorted(runs, key=lambda r: r["kb_per_stream"])[len(runs) // 2]
    curve = ", ".join(f"{n}: {kb / 1024:.0f} MiB" for n, kb in middle["points"])
    print_table(
        f"Idle SSE streams on loopd up: server memory and CPU (medians of {repeat} run(s))",
        ["streams", "KiB per stream", "server VmRSS by streams", "idle CPU, 0 streams", f"idle CPU, {top} streams"],
        [(top, slope, curve, f"{cpu_empty:.1%}", f"{cpu_full:.1%}")],
        note="KiB per stream: least-squares slope of the server's VmRSS over the open idle streams (one "
        f"conversation). Idle CPU: share of one core over {IDLE_WINDOW:g} s with nothing happening.",
    )


if __name__ == "__main__":
    run_main(main)
