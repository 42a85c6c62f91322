"""`benchmarks._stacks`: a profile's busy samples by stage and by kind of work, idle threads apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks._stacks import LOOP, OTHER, PARTIAL, THREADS, breakdown, kind_of, read, render

ROOT = Path(__file__).resolve().parents[2]
LOOP_ROOT = "<module> (loopd/__main__.py:3);run (loopd/_infra/eventloop.py:40);Runner.run (asyncio/runners.py:118)"
SQL_CALL = "_SqliteTransaction.fetch.<locals>.<lambda> (loopd/_infra/sqlite.py:380)"
PROFILE = [
    # a chat's request doing SQL
    f"{LOOP_ROOT};RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py:419);"
    f"ChatRequests._ask (loopd/server/chat/_requests.py:200);{SQL_CALL} 30",
    # the drive, inside a generic race task, writing JSON: the first stage from the root counts
    f"{LOOP_ROOT};race.<locals>.run (loopd/_infra/tasks.py:96);Drive._consume (loopd/server/engine/_driving.py:541);"
    "LoopActor._run (loopd/harness/actors/_loop.py:1);compact (loopd/_infra/jsontext.py:45) 20",
    # the responder in loopd code
    f"{LOOP_ROOT};Controller._work (loopd/resources/reconcile/_controller.py:10);"
    "HarnessResponder.reconcile (loopd/server/responder/_responder.py:5) 10",
    # the loop itself
    f"{LOOP_ROOT} 8",
    # a lane thread checkpointing (busy) and one waiting for work (idle)
    "Thread._bootstrap (threading.py:1002);_LaneThread._run (loopd/_infra/sqlite.py:98);"
    "SqliteDatabase._count_pages.<locals>.checkpoint (loopd/_infra/sqlite.py:600) 2",
    "Thread._bootstrap (threading.py:1002);_LaneThread._run (loopd/_infra/sqlite.py:98) 50",
    "Thread._bootstrap (threading.py:1002);_worker (concurrent/futures/thread.py:81) 40",
    # outside every stage, in the standard library
    f"{LOOP_ROOT};Handle._run (asyncio/events.py:80);replace (dataclasses.py:1453) 5",
    # cut short by a sampler that did not pause the process: no root, so no stage
    f"_SqliteTransaction._statement (loopd/_infra/sqlite.py:351);{SQL_CALL} 4",
    "not a stack line",
]


def test_busy_samples_by_stage_and_kind_with_idle_threads_apart() -> None:
    found = breakdown(PROFILE)
    assert (found.busy, found.idle) == (79, 90)
    assert found.stages == {
        "HTTP requests (middleware, routes, the ask)": 30,
        "engine drive (harness updates → messages, ledger)": 20,
        "responder (Task reconcile: admission, completion)": 10,
        LOOP: 8,
        THREADS: 2,
        OTHER: 5,
        PARTIAL: 4,
    }
    assert found.kinds["SQLite (statements, commits, checkpoints)"] == 36
    assert found.kinds["JSON"] == 20
    assert found.kinds["loopd Python"] == 10
    assert found.kinds["event loop and asyncio"] == 8
    assert sum(found.kinds.values()) == found.busy
    shares = dict(found.shares(found.stages))
    assert shares["HTTP requests (middleware, routes, the ask)"] == pytest.approx(30 / 79)


@pytest.mark.parametrize(
    ("leaf", "kind"),
    [
        ("SqliteJournal.create_session.<locals>.create (loopd/harness/journal/_sqlite.py:9)", "SQLite"),
        ("SqliteDatabase._acquire (loopd/_infra/sqlite.py:468)", "loopd Python"),  # Python in a SQLite module
        ("loads (json/__init__.py:346)", "JSON"),
        ("Timeout.reschedule (asyncio/timeouts.py:50)", "event loop"),
        ("RequestResponseCycle.send (uvicorn/protocols/http/httptools_impl.py:461)", "HTTP stack"),
        ("BaseModel.__init__ (pydantic/main.py:1)", "pydantic"),
        ("MutexValue.inc (prometheus_client/values.py:1)", "metrics"),
        ("__init__ (<string>:2)", "standard library"),
    ],
)
def test_the_kind_of_work_is_the_leaf_frames(leaf: str, kind: str) -> None:
    assert kind_of(leaf).startswith(kind)


def test_files_are_read_together_and_rendered_as_shares(tmp_path: Path) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("\n".join(PROFILE[:2]) + "\n")
    second.write_text("\n".join(PROFILE[2:]) + "\n")
    text = render(read([first, second]), "two files")
    assert "79 busy samples (90 idle thread samples left out)" in text
    assert "  38.0%  HTTP requests" in text
    assert render(breakdown([]), "nothing") == "nothing: no busy samples"


def test_the_command_prints_the_breakdown_and_names_a_missing_file(tmp_path: Path) -> None:
    profile = tmp_path / "chats-100.txt"
    profile.write_text("\n".join(PROFILE) + "\n")
    command = [sys.executable, "-m", "benchmarks._stacks"]
    shown = subprocess.run([*command, str(profile)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "by stage:" in shown.stdout and "by kind of work:" in shown.stdout
    missing = subprocess.run(
        [*command, str(tmp_path / "nope.txt")], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 2
    assert "no such profile" in missing.stderr and "Traceback" not in missing.stderr
