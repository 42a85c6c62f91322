"""A benchmark leaves nothing running behind it, however it ends: its entry point and the processes it starts.

* `run_main` runs a benchmark's ``main``: SIGTERM and SIGHUP (``timeout``, ``kill``, a closed terminal, a cancelled CI
  job) end it the way Ctrl-C does — every ``with`` that started a server stops it — and an interrupted run ends
  with one line on stderr and the shell's status for that signal (130 for Ctrl-C, 143 for SIGTERM), not a
  traceback.
* `spawn` starts a child process (as ``subprocess.Popen``) that Linux ends with SIGTERM when this process ends —
  even by SIGKILL, where no ``finally`` runs. It execs the command through a tiny launcher that asks the kernel for
  that (``prctl(PR_SET_PDEATHSIG)``; it survives the exec, and the child keeps its pid, so stopping it by pid still
  works). The kernel sends it when the *thread* that started the child ends: start children from the main thread.
  Children that fork servers of their own (``pg_ctl``) are stopped by their ``with`` through `run_main`'s handlers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

_DIE_WITH_PARENT: Final = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"  # 1: PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)\n"  # the parent ended before the kernel was asked: nothing is waiting for this child
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""Run by ``python -I -S -c`` (no site, no environment: it starts in ~10 ms) with the parent's pid and the
command."""
ENDING_SIGNALS: Final = (signal.SIGTERM, signal.SIGHUP)


def spawn(command: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **popen)`` whose child gets SIGTERM when this process ends (see the module)."""
    if sys.platform == "linux":
        command = [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]
    return subprocess.Popen(list(command), **popen)


def run_main(main: Callable[[], object]) -> None:
    """Run a benchmark's ``main`` as a command: SIGTERM and SIGHUP unwind it like Ctrl-C; an interrupted run prints
    one line and exits with 128 + the signal's number.

    Each of those signals is turned into SIGINT, so whatever runs then handles it as Ctrl-C: outside an event loop
    ``KeyboardInterrupt``; inside ``asyncio.run`` the runner cancels its main task (``finally`` blocks and ``async
    with`` exits run in order) and raises ``KeyboardInterrupt`` when it is done."""
    received: list[int] = []

    def as_ctrl_c(signum: int, frame: object) -> None:
        received.append(signum)
        signal.raise_signal(signal.SIGINT)

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a background job of a script: SIGTERM must still work
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in ENDING_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(signum, as_ctrl_c)
    try:
        main()
    except KeyboardInterrupt:
        got = received[0] if received else int(signal.SIGINT)
        name = signal.Signals(got).name
        print(f"\ninterrupted ({name}): stopped, and so is every server this run started", file=sys.stderr)
        raise SystemExit(128 + got) from None


def run_to_end(command: Sequence[str], *, stop_timeout: float = 60.0, **popen: Any) -> int:
    """`spawn` ``command`` and wait for it: its exit status. Interrupted meanwhile, it first asks the child to stop
    (SIGTERM: a benchmark child then stops its own servers, see `run_main`), kills it only after ``stop_timeout``
    seconds, and then lets the interruption go on."""
    child = spawn(command, **popen)
    try:
        return child.wait()
    except BaseException:
        child.terminate()
        try:
            child.wait(stop_timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
