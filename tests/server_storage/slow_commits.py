"""Injecting a slow SQLite COMMIT: the lane thread blocks in ``COMMIT`` until the test releases it (every statement
runs on the lane thread meanwhile, none inline)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from loopd._infra.sqlite import SqliteLane as _Lane
from loopd._infra.sqlite import _SqliteTransaction as _SqliteConnection


@dataclass
class SlowCommit:
    """While armed, the next write's ``COMMIT`` blocks until `release` (then it commits, or fails when ``fail``).

    ``release_after_timeouts``: release by itself once that many lane calls have timed out (the COMMIT's own
    timeout is the first; the transaction's wait for it to settle is the second), so no test depends on a sleep.
    """

    release_after_timeouts: int | None = None
    fail: bool = False
    armed: bool = True
    timeouts: int = 0
    released: threading.Event = field(default_factory=threading.Event)
    committing: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@contextmanager
def slow_commits(monkeypatch: pytest.MonkeyPatch, slow: SlowCommit) -> Iterator[SlowCommit]:
    original_end = _SqliteConnection.end
    original_call = _Lane.call

    def end(self: _SqliteConnection, verb: str) -> Callable[[], None]:
        run = original_end(self, verb)
        if verb != "COMMIT" or not slow.armed or self._begin != "BEGIN IMMEDIATE":  # a write's COMMIT only
            return run
        slow.armed = False

        def blocked() -> None:
            slow.committing.set()
            if not slow.released.wait(30):  # bounded: a broken test must not hang the lane thread forever
                raise sqlite3.OperationalError("the test never released the COMMIT")
            if slow.fail:
                self._lane.conn.execute("ROLLBACK")  # the COMMIT fails; SQLite has rolled it back
                self.committed = False
                self._lane.owner = None
                raise sqlite3.OperationalError("disk I/O error (injected)")
            run()

        return blocked

    async def call(self: _Lane, fn: Callable[[], Any], *, opening: bool = False) -> Any:
        try:
            return await original_call(self, fn, opening=opening)
        except Exception as exc:
            if isinstance(exc.__cause__, TimeoutError):
                slow.timeouts += 1
                if slow.release_after_timeouts is not None and slow.timeouts >= slow.release_after_timeouts:
                    slow.release()
            raise

    monkeypatch.setattr(_SqliteConnection, "end", end)
    monkeypatch.setattr(_Lane, "call", call)
    # A COMMIT that waits (for the disk, say) does so on the lane thread: no statement runs inline meanwhile, so
    # the commits go there too (on an idle lane they would run inline, on the test's own thread).
    monkeypatch.setattr(_Lane, "can_run_inline", property(lambda _lane: False))
    try:
        yield slow
    finally:
        slow.release()
