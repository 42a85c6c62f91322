"""Waiting on a condition over real I/O (a subprocess, a socket, a database thread), with a deadline.

This is the one place the suite polls real time: a test waits *for a condition*, never for a fixed delay. Code that
takes a ``Clock`` is driven on ``VirtualClock`` instead; these helpers are for what no clock controls.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

_INTERVAL = 0.005  # how often a condition over real I/O is checked; short, the deadline bounds the whole wait


@overload
async def eventually(predicate: Callable[[], Awaitable[T | None]], *, timeout: float = ..., what: str = ...) -> T: ...
@overload
async def eventually(predicate: Callable[[], T | None], *, timeout: float = ..., what: str = ...) -> T: ...
async def eventually(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str = "the condition") -> Any:
    """Check ``predicate`` (sync or async) until its value is truthy; that value. ``AssertionError`` after
    ``timeout`` real seconds (a guard, not a measurement)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(_INTERVAL)


def wait_until(
    predicate: Callable[[], T | None], *, timeout: float = 30.0, what: str = "the condition", interval: float = 0.1
) -> T:
    """``eventually`` for synchronous tests (a subprocess started by the test): block until ``predicate()`` is
    truthy; that value. ``AssertionError`` after ``timeout`` real seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def opened_despite_load(
    open_: Callable[[], Awaitable[T]], unavailable: type[BaseException], *, attempts: int = 10
) -> T:
    """``await open_()``, tried again (up to ``attempts`` times) while it raises ``unavailable``: for a handle opened
    with the short timeout a test is about, where opening it — a thread hop, a connect — is not what the test checks
    and a loaded machine may not finish that within the short timeout. The last failure is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return await open_()
        except unavailable:
            if attempt == attempts:
                raise
    raise AssertionError("attempts must be at least 1")
