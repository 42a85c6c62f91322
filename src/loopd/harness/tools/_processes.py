"""Child processes that tools start: each in its own process group, killed as a group, always reaped.

Used by bash and grep (bash's group leader may be a sandbox, see `_sandbox`). Killing is synchronous (a
signal), so it also happens on the way out of a cancelled task; waiting afterwards is bounded. Exit is
observed through ``returncode`` rather than ``Process.wait()``: asyncio's ``wait()`` also waits for the pipes
to close, which a background grandchild can keep open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Final

REAP_TIMEOUT: Final = 2.0
_POLL_SECONDS: Final = 0.01


def signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``process`` (started with ``start_new_session=True``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


async def wait_exited(process: asyncio.subprocess.Process) -> int:
    """Return the exit status as soon as the process itself has exited (its pipes may still be open)."""
    # Polling on purpose: asyncio offers no public event for "exited, pipes still open".
    while process.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_SECONDS)
    return process.returncode


async def stop_group(
    process: asyncio.subprocess.Process, *, grace: float = 0.0, term_groups: Sequence[int] = ()
) -> None:
    """Stop the whole group: SIGTERM, ``grace`` seconds for the leader to exit, then SIGKILL; then reap.

    ``term_groups``, when given, get the SIGTERM instead of the process's own group: a sandbox runs the command
    in a group of its own, and terminating the sandbox's own process would kill the command without a grace.
    """
    if grace > 0 and process.returncode is None:
        if term_groups:
            for group in term_groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGTERM)
        else:
            signal_group(process, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await wait_exited(process)
    signal_group(process, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REAP_TIMEOUT):
            await wait_exited(process)


def abandon_pipes(process: asyncio.subprocess.Process) -> None:
    """Close the transport when a process outside the group still holds our pipes, so nothing leaks."""
    transport = getattr(process, "_transport", None)  # asyncio keeps no public handle on it
    close = getattr(transport, "close", None)
    if callable(close):
        close()
