"""A benchmark leaves nothing running behind it (benchmarks/_children.py): children started with `spawn` end with
their parent even when it is SIGKILLed; `run_main` turns SIGTERM and SIGHUP into Ctrl-C, so the servers a run
started are stopped by their ``with`` and the run ends with one line and 128 + the signal; `run_to_end` asks its
child to stop before it lets an interruption go on. Real processes, real signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks._children import spawn

ROOT = Path(__file__).resolve().parents[2]
WAIT = 15.0

# A child that says it started (its pid in a file) and writes "stopped" when SIGTERM ends it.
CHILD = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    out.with_suffix(".stopped").write_text("stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
out.write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""

# A benchmark-like command: run_main(main), main starts CHILD in a `with` (stopped by SIGTERM in its finally, as
# benchmarks._server does) and waits inside asyncio.run; MODE "wait" runs run_to_end on a nested such command.
PARENT = """
import asyncio, contextlib, subprocess, sys
from pathlib import Path
from benchmarks._children import run_main, run_to_end, spawn

CHILD, OUT, MODE = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

@contextlib.contextmanager
def running_child():
    child = spawn([sys.executable, "-c", CHILD, str(OUT / "child.pid")])
    try:
        yield child
    finally:
        child.terminate()
        child.wait(10)
        (OUT / "with-exited").write_text("yes")

async def forever():
    (OUT / "ready").write_text("yes")
    while True:
        await asyncio.sleep(0.05)

def main():
    if MODE == "wait":
        nested = OUT / "nested"
        nested.mkdir()
        run_to_end([sys.executable, "-c", sys.argv[4], CHILD, str(nested), "loop", sys.argv[4]])
        return
    with running_child():
        asyncio.run(forever())

run_main(main)
"""


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT:g} s"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":  # ended, not yet reaped by its (new) parent
            return True
        time.sleep(0.02)
    return False


def _default_signals(*ignored: signal.Signals) -> None:
    """In a child before it runs: SIGINT and SIGHUP as a terminal's job gets them, or ``ignored``."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)


@contextlib.contextmanager
def _parent(tmp_path: Path, mode: str = "loop", **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """PARENT started (stderr piped, read with ``communicate``), killed by its handle if a test leaves it running."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-c", PARENT, CHILD, str(tmp_path), mode, PARENT]
    popen.setdefault("preexec_fn", _default_signals)  # not what this test runner ignores (e.g. under nohup)
    parent = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)
    try:
        yield parent
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.communicate(timeout=WAIT)


pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")


def test_a_spawned_child_keeps_its_pid_and_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    with _parent(tmp_path) as parent:
        _wait_for(tmp_path / "ready", "the parent's start")
        _wait_for(tmp_path / "child.pid", "the child's start")
        child_pid = int((tmp_path / "child.pid").read_text())
        parent.kill()  # SIGKILL: no finally, no `with` runs in the parent
        parent.wait(WAIT)
    if not _gone(child_pid):
        os.kill(child_pid, signal.SIGKILL)  # the child this test started, by its pid
        pytest.fail("the child outlived its SIGKILLed parent")
    assert (tmp_path / "child.stopped").read_text() == "stopped"  # it got SIGTERM: it could stop cleanly
    assert not (tmp_path / "with-exited").exists()


def test_spawn_returns_the_commands_own_pid(tmp_path: Path) -> None:
    child = spawn([sys.executable, "-c", CHILD, str(tmp_path / "child.pid")])
    try:
        _wait_for(tmp_path / "child.pid", "the child's start")
        assert int((tmp_path / "child.pid").read_text()) == child.pid  # stopping it by its pid stops the command
    finally:
        child.terminate()
        child.wait(WAIT)
    assert (tmp_path / "child.stopped").exists()


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_an_ending_signal_stops_the_servers_and_ends_with_one_line(
    tmp_path: Path, signum: signal.Signals, status: int
) -> None:
    with _parent(tmp_path) as parent:
        _wait_for(tmp_path / "ready", "the parent's start")
        _wait_for(tmp_path / "child.pid", "the child's start")
        parent.send_signal(signum)
        _, err = parent.communicate(timeout=WAIT)
    assert parent.returncode == status
    assert (tmp_path / "with-exited").read_text() == "yes"  # the `with` that started the child ran its exit
    assert (tmp_path / "child.stopped").exists()
    assert err.strip() == f"interrupted ({signum.name}): stopped, and so is every server this run started"


def test_sigterm_works_where_a_script_started_the_run_with_sigint_ignored(tmp_path: Path) -> None:
    # A background job of a non-interactive shell starts with SIGINT ignored.
    with _parent(tmp_path, preexec_fn=lambda: _default_signals(signal.SIGINT)) as parent:
        _wait_for(tmp_path / "ready", "the parent's start")
        parent.send_signal(signal.SIGTERM)
        _, err = parent.communicate(timeout=WAIT)
    assert parent.returncode == 143 and "interrupted (SIGTERM)" in err
    assert (tmp_path / "with-exited").exists()


def test_run_to_end_asks_its_child_to_stop_before_the_interruption_goes_on(tmp_path: Path) -> None:
    nested = tmp_path / "nested"
    with _parent(tmp_path, "wait") as parent:
        _wait_for(nested / "ready", "the nested run's start")
        _wait_for(nested / "child.pid", "the nested run's child")
        parent.send_signal(signal.SIGTERM)
        _, err = parent.communicate(timeout=WAIT)
    assert parent.returncode == 143 and err.strip().endswith("every server this run started")
    assert (nested / "with-exited").exists()  # the nested run unwound: its server was stopped by its `with`
    assert (nested / "child.stopped").exists()


def test_a_run_started_under_nohup_keeps_ignoring_sighup(tmp_path: Path) -> None:
    with _parent(tmp_path, preexec_fn=lambda: _default_signals(signal.SIGHUP)) as parent:
        _wait_for(tmp_path / "ready", "the parent's start")
        parent.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            parent.wait(1.0)  # still running: nohup asked for that
        parent.send_signal(signal.SIGTERM)
        _, err = parent.communicate(timeout=WAIT)
    assert parent.returncode == 143 and "interrupted (SIGTERM)" in err
    assert (tmp_path / "with-exited").exists()
