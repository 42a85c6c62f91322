"""The server CPU a chat round cost: a process tree's user + system time, and how server_chats reports it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from benchmarks._server import cpu_seconds, tree_cpu_seconds
from benchmarks.server_chats import ChatRun, _median, _row

_CHILD = """
import time
end = time.process_time() + 0.4
while time.process_time() < end:
    pass
print("done", flush=True)
time.sleep(30)
"""
_PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {_CHILD!r}], stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
child.wait()
"""


def test_a_process_trees_cpu_counts_its_children() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    child_pid = 0
    try:
        assert parent.stdout is not None
        pid, said = parent.stdout.readline().split()
        child_pid = int(pid)
        assert said == "done"
        own, tree = cpu_seconds(parent.pid), tree_cpu_seconds(parent.pid)
        assert tree >= own + 0.3, (own, tree)  # the child's busy 0.4 s of CPU are in the tree only
    finally:
        if child_pid:
            os.kill(child_pid, signal.SIGKILL)
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
    assert tree_cpu_seconds(parent.pid) == 0.0  # gone: nothing to count, no error


def _run(cpu: float | None) -> ChatRun:
    return ChatRun(
        chats=100, ok=100, wall=2.0, ttft_p50_ms=1, ttft_p95_ms=2, done_p50_ms=3, done_p95_ms=4, cpu_ms_per_chat=cpu
    )


def test_the_cpu_per_chat_is_a_median_and_shown_as_na_when_not_measured() -> None:
    assert _median([_run(10.0), _run(30.0), _run(20.0)]).cpu_ms_per_chat == 20.0
    assert _median([_run(None), _run(12.0)]).cpu_ms_per_chat == 12.0
    assert _row(_median([_run(None)]))[-1] == "n/a"
    assert _row(_run(15.5))[-1] == 15.5
