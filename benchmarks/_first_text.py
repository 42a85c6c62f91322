"""Where a round's time to first text goes: a deterministic profile of a real `loopd up` from the round's start until
most answers show text.

python -m benchmarks._first_text [--chats 100] [--share 0.95] [--top 30] [--out FILE]

Under a burst of concurrent chats the server stores every question, then starts the calls and writes each answer's
first text, and only then writes the rest of each answer (its ledger records, completions, Task deletions): the
time to first text of the last chats is, to a good approximation, the server's CPU spent before their first text.
This tool profiles exactly that window. The server runs as `benchmarks.server_chats` runs it (the demo model), with a
``sitecustomize`` module on its path that starts ``cProfile`` on SIGUSR1 and watches every statement SQLite runs on
the event loop's thread (a trace callback on each ``sqlite3`` connection): when the ``--share`` of the round's
answers have stored their first text (the event numbered 2 of a response message), it stops the profiler and writes
the statistics. After a warm-up round of 5 chats the round of ``--chats`` runs; the report lists the entry points a
chat's first text waits for (cumulative time, share of the window) and the time spent in each package (own time).
cProfile slows Python code about 1.7×: read shares, not milliseconds. ``--out`` keeps the ``pstats`` file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import re
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from benchmarks._server import running_server
from benchmarks.server_chats import run_chats

OUT_ENV: Final = "LOOPD_BENCH_FIRST_TEXT_OUT"
TARGET_ENV: Final = "LOOPD_BENCH_FIRST_TEXT_TARGET"
WAIT: Final = 60.0
"""Seconds to wait for the profile after the round (it is written while the round runs)."""
SITECUSTOMIZE: Final = f'''"""Written by benchmarks._first_text: cProfile from SIGUSR1 until N answers show text."""
import os
import re
import signal
import sqlite3
import threading

_out = os.environ.get("{OUT_ENV}")
if _out:
    import cProfile

    _profile = cProfile.Profile()
    _state = {{"on": False, "seen": 0, "target": int(os.environ.get("{TARGET_ENV}", "1"))}}
    _first_text = re.compile(r"INSERT INTO message_events .*VALUES \\('[0-9a-f-]+', 2, ")

    def _start(signum, frame):
        _state["seen"] = 0
        _state["on"] = True
        _profile.enable()

    signal.signal(signal.SIGUSR1, _start)
    _connect = sqlite3.connect

    def _watched(*args, **kwargs):
        conn = _connect(*args, **kwargs)

        def trace(sql):
            if _state["on"] and threading.current_thread() is threading.main_thread() and _first_text.match(sql):
                _state["seen"] += 1
                if _state["seen"] >= _state["target"]:
                    _state["on"] = False
                    _profile.disable()
                    _profile.dump_stats(_out + ".part")
                    os.replace(_out + ".part", _out)

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = _watched
'''

ENTRY_POINTS: Final = (
    ("the questions' HTTP requests (every layer)", "httptools_impl.py", "run_asgi"),
    ("  a question stored with its Task (ChatRequests.ask)", "chat/_requests.py", "ask"),
    ("    its Task created", "chat/_requests.py", "_create_task"),
    ("    its messages opened", "streams/_log.py", "open_messages"),
    ("  a conversation created", "chat/_requests.py", "create_conversation"),
    ("the responder's reconciles", "responder/_responder.py", "_reconcile"),
    ("  the Task's context read", "responder/_responder.py", "_read_context"),
    ("  the call started (Engine.start)", "engine/_engine.py", "start"),
    ("    its ledger trail opened", "engine/_trail.py", "open_with_attempt"),
    ("    the harness session started", "harness/actors/_rig.py", "start_session"),
    ("the drives applying the harness's updates", "engine/_driving.py", "_consume"),
    ("  text written (previews)", "engine/_driving.py", "_apply_previews"),
    ("  durable updates written", "engine/_driving.py", "_apply_one"),
    ("the harness's model calls", "harness/actors/_loop.py", "_call_model"),
    ("the harness's journal commits", "harness/actors/_session_log.py", "commit"),
)
_SRC: Final = re.compile(r"src/loopd/(.*)")


@dataclass(frozen=True)
class Window:
    """The profile of one window: its total own time and the stats themselves."""

    total: float
    stats: pstats.Stats


def load(path: Path) -> Window:
    stats = pstats.Stats(str(path))
    raw = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table in an undocumented attribute
    return Window(sum(entry[2] for entry in raw.values()), stats)


def cumulative(window: Window, file_suffix: str, function: str) -> float:
    """Seconds spent in ``function`` of the file ending in ``file_suffix``, callees included (0.0: not seen)."""
    raw = window.stats.stats  # type: ignore[attr-defined]
    return float(
        sum(entry[3] for (file, _line, name), entry in raw.items() if name == function and file.endswith(file_suffix))
    )


def by_package(window: Window) -> list[tuple[str, float]]:
    """Own time per loopd package (two levels), per third-party distribution and for the rest, largest first."""
    totals: dict[str, float] = {}
    for (file, _line, name), entry in window.stats.stats.items():  # type: ignore[attr-defined]
        found = _SRC.search(file)
        if found:
            parts = found.group(1).split("/")
            key = "loopd/" + "/".join(parts[:2] if len(parts) > 2 else parts[:1])
        elif "site-packages/" in file:
            key = file.split("site-packages/")[1].split("/")[0]
        elif file == "~":
            key = "built-in: " + (name.split("'")[1] if "'" in name else name)
        else:
            key = "stdlib: " + file.rsplit("/", 1)[-1]
        totals[key] = totals.get(key, 0.0) + float(entry[2])
    return sorted(totals.items(), key=lambda item: item[1], reverse=True)


def profile_round(chats: int, share: float, out: Path) -> float:
    """Warm a traced `loopd up`, profile a round of ``chats`` until ``share`` of them show text; the round's
    wall time. Raises RuntimeError when the profile never came."""
    target = max(1, round(chats * share))
    with tempfile.TemporaryDirectory(prefix="loopd-first-text-") as directory:
        site = Path(directory) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        env = {"PYTHONPATH": str(site), OUT_ENV: str(out), TARGET_ENV: str(target)}
        with running_server(Path(directory), env=env) as server:
            asyncio.run(run_chats(server, 5, "warm"))
            time.sleep(1.0)  # the warm-up's trailing work (titles) ends before the window opens
            os.kill(server.pid, signal.SIGUSR1)
            t0 = time.perf_counter()
            asyncio.run(run_chats(server, chats, "profiled"))
            wall = time.perf_counter() - t0
            deadline = time.monotonic() + WAIT
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    if not out.exists():
        raise RuntimeError(f"no profile: fewer than {target} of {chats} answers showed text in the window")
    return wall


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=positive_int, default=100, help="concurrent chats in the profiled round")
    parser.add_argument("--share", type=float, default=0.95, help="stop once this share of answers shows text")
    parser.add_argument("--top", type=positive_int, default=25, help="packages listed")
    parser.add_argument("--out", type=Path, default=None, help="keep the pstats file here")
    args = parser.parse_args(argv)
    if not 0.0 < args.share <= 1.0:
        parser.error(f"--share must be above 0 and at most 1, not {args.share}")
    with tempfile.TemporaryDirectory(prefix="loopd-first-text-out-") as keep:
        out = args.out or Path(keep) / "first-text.prof"
        if out.exists():
            out.unlink()
        wall = profile_round(args.chats, args.share, out)
        window = load(out)
    rows = []
    for label, suffix, function in ENTRY_POINTS:
        seconds = cumulative(window, suffix, function)
        rows.append((label, f"{100 * seconds / window.total:.1f} %", f"{seconds * 1000 / args.chats:.2f}"))
    print_table(
        f"Before {args.share:.0%} of {args.chats} answers show text: where the server's time went",
        ["entry point (callees included; indented: part of the line above)", "share of the window", "ms per chat"],
        rows,
        note=f"cProfile, own time of the window {window.total:.2f} s ({window.total * 1000 / args.chats:.1f} ms "
        f"per chat, about 1.7× unprofiled); the round took {wall:.1f} s in all. Shares overlap where entry points "
        "nest; what no line names (the event loop, other requests' layers) is the rest.",
    )
    print_table(
        "Own time by package in the window",
        ["package", "share"],
        [(name, f"{100 * seconds / window.total:.1f} %") for name, seconds in by_package(window)[: args.top]],
    )


if __name__ == "__main__":
    run_main(main)
