"""Sandboxes for the bash tests: bubblewrap when it works here (else skip, or fail under ``CI=true``), and none."""

from __future__ import annotations

import os
from pathlib import Path

from loopd.harness.tools._sandbox import UNCONFINED, BubblewrapSandbox, Sandbox, bubblewrap_problem, resolve_sandbox
from tests.support.availability import missing
from tests.support.waiting import eventually

SANDBOX_NAMES = ("none", "bubblewrap")


def bubblewrap(*, network: bool = False) -> BubblewrapSandbox:
    """The working bubblewrap sandbox; skips the test (fails it under ``CI=true``) when there is none."""
    problem = bubblewrap_problem(network=network)
    if problem is not None:
        missing(f"bubblewrap cannot run here: {problem}")
    sandbox = resolve_sandbox("bubblewrap", network=network, environ={})
    assert isinstance(sandbox, BubblewrapSandbox)
    return sandbox


def sandbox_named(name: str) -> Sandbox:
    return bubblewrap() if name == "bubblewrap" else UNCONFINED


def pids_running(marker: str) -> list[int]:
    """Host pids of live (non-zombie) processes whose command line contains ``marker`` as an argument."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(") ", 1)[-1].split()[0]
        except OSError:
            continue
        if marker.encode() in args and state != "Z":
            found.append(int(entry.name))
    return found


async def wait_running(marker: str, timeout: float = 30.0) -> list[int]:
    """The host pids running ``marker`` once there is at least one (works inside a pid namespace too)."""
    pids: list[int] = await eventually(lambda: pids_running(marker), timeout=timeout, what=f"{marker!r} running")
    return pids


async def wait_gone(pids: list[int], timeout: float = 30.0) -> bool:
    """True once none of ``pids`` is alive (``AssertionError`` after ``timeout`` seconds)."""
    await eventually(lambda: not any(_alive(pid) for pid in pids), timeout=timeout, what=f"pids {pids} to exit")
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"
