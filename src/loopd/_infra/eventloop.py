"""The one way loopd's commands run their event loop: `run` — uvloop where it is installed, asyncio's own otherwise.

Every long-running process (``loopd up``, ``loopd operator``, ``loopd harness serve``) and the interactive clients run
their ``main`` coroutine through `run`, so they all get the same, faster loop: uvloop (libuv) makes the server's
socket I/O, the SQLite threads' wake-ups (``call_soon_threadsafe``) and timers cheaper, which is most of what the
loop does between requests. ``LOOPD_EVENT_LOOP=asyncio`` picks the standard loop (e.g. to compare, or to debug
with asyncio's own tools); ``uvloop`` insists on it (an error when it is missing); unset or ``auto`` prefers it.

Must not do: install a global event-loop policy (each `run` passes its loop factory to `asyncio.Runner`, so
nothing else in the process — tests, embedding applications — is affected).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final, Literal, TypeVar

from loopd._infra.errors import LoopdError

__all__ = ["ENV_VAR", "EventLoopError", "LoopKind", "loop_factory", "loop_kind", "run"]

ENV_VAR: Final = "LOOPD_EVENT_LOOP"
LoopKind = Literal["uvloop", "asyncio"]
_T = TypeVar("_T")


class EventLoopError(LoopdError, RuntimeError):
    """``LOOPD_EVENT_LOOP`` names a loop that is unknown or not installed."""


def _uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_kind(environ: Mapping[str, str] | None = None, *, uvloop_installed: bool | None = None) -> LoopKind:
    """Which loop `run` uses under ``environ`` (default ``os.environ``); `EventLoopError` for a bad setting."""
    wanted = (environ if environ is not None else os.environ).get(ENV_VAR, "").strip().lower() or "auto"
    installed = _uvloop_installed() if uvloop_installed is None else uvloop_installed
    if wanted == "asyncio":
        return "asyncio"
    if wanted == "uvloop":
        if not installed:
            raise EventLoopError(f"{ENV_VAR}=uvloop, but uvloop is not installed: pip install uvloop, or unset it")
        return "uvloop"
    if wanted == "auto":
        return "uvloop" if installed else "asyncio"
    raise EventLoopError(f"{ENV_VAR} must be auto, uvloop or asyncio, not {wanted!r}")


def loop_factory(kind: LoopKind) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of ``kind``."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, _T], *, debug: bool | None = None) -> _T:
    """Run ``main`` to completion on a new loop of `loop_kind` (like `asyncio.run`, which it otherwise matches:
    remaining tasks are cancelled, async generators and the default executor shut down, the loop closed)."""
    try:
        factory = loop_factory(loop_kind())
    except EventLoopError:
        main.close()  # never awaited: say so cleanly instead of a "coroutine was never awaited" warning
        raise
    with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
        return runner.run(main)
