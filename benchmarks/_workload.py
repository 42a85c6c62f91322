"""The workload every peer runs, and the clock that times it.

One conversation, one user message, then ``steps`` model calls that each ask for one call of a trivial echo tool
with a ~200-byte argument (the tool returns it), then a final answer. The fake model answers at once; its own
time is measured and subtracted, so what remains is the library's own cost per step: building the request, running
the tool, and persisting the step.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAYLOAD = "x" * 200
USER_TEXT = "go " + PAYLOAD
FINAL_TEXT = "final " + PAYLOAD
TOOL_ARGUMENTS = {"text": PAYLOAD}
WINDOW = 25  # steps averaged for "ms/step at history length h": steps h-24 .. h


def raw_message_bytes(steps: int) -> int:
    """Bytes of message content in the conversation: user text, tool arguments and outputs, the final answer."""
    per_step = len(json.dumps(TOOL_ARGUMENTS).encode()) + len(PAYLOAD.encode())
    return len(USER_TEXT.encode()) + steps * per_step + len(FINAL_TEXT.encode())


@dataclass
class StepClock:
    """Timestamps of every model call and the time spent inside the fake model.

    Call ``k`` (0-based) happens after ``k`` completed steps, so ``calls[k] - calls[k-1]`` is the wall time of
    step ``k`` (model call, tool, persistence) and ``model[k-1]`` the fake model's share of it.
    """

    steps: int
    calls: list[float] = field(default_factory=list)
    model: list[float] = field(default_factory=list)

    def enter(self) -> tuple[int, float]:
        now = time.perf_counter()
        self.calls.append(now)
        return len(self.calls) - 1, now

    def leave(self, started: float) -> None:
        self.model.append(time.perf_counter() - started)

    def wants_tool(self, index: int) -> bool:
        return index < self.steps

    def window_ms(self, history: int, width: int = WINDOW) -> float | None:
        """Mean library time per step (ms) over the ``width`` steps ending at step ``history``."""
        if history < width or history >= len(self.calls):
            return None
        wall = self.calls[history] - self.calls[history - width]
        model = sum(self.model[history - width : history])
        return (wall - model) / width * 1000


@dataclass
class GcTime:
    """Wall time spent in the cyclic garbage collector while `measuring` is active."""

    seconds: float = 0.0
    collections: int = 0
    _started: float = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections += 1

    @contextmanager
    def measuring(self) -> Iterator[GcTime]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)


def count_rows(path: Path, sql: str) -> int:
    """Run a ``SELECT count(*)`` on a read-only connection of its own (never the library's)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def directory_bytes(directory: Path, prefix: str) -> int:
    """Bytes of the database named ``prefix`` plus its WAL or rollback journal (the shared-memory index is not data)."""
    return sum(
        p.stat().st_size
        for p in directory.iterdir()
        if p.is_file() and p.name.startswith(prefix) and not p.name.endswith("-shm")
    )


@dataclass
class PeerRun:
    """What one run of one peer reports (JSON over a subprocess's stdout)."""

    peer: str
    steps: int
    wall: float
    model: float
    windows: dict[int, float | None]
    disk_bytes: int
    persisted: dict[str, int]
    ok: bool
    problem: str = ""
    durable_rows: list[int] = field(default_factory=list)  # with --probe: durable rows seen at each model call
    unsynced_calls: int = 0
    """With --probe: model calls that started while committed rows still waited for their fsync (loopd at FULL: a
    step whose next effects are safe to repeat is synced within 5 ms, beside the next call)."""
    peak_rss_kb: int = 0
    gc_seconds: float = 0.0

    @property
    def overhead_ms(self) -> float:
        return (self.wall - self.model) / self.steps * 1000

    def to_json(self) -> str:
        return json.dumps(
            {
                "peer": self.peer,
                "steps": self.steps,
                "wall": self.wall,
                "model": self.model,
                "windows": {str(k): v for k, v in self.windows.items()},
                "disk_bytes": self.disk_bytes,
                "persisted": self.persisted,
                "ok": self.ok,
                "problem": self.problem,
                "durable_rows": self.durable_rows,
                "unsynced_calls": self.unsynced_calls,
                "peak_rss_kb": self.peak_rss_kb,
                "gc_seconds": self.gc_seconds,
            }
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PeerRun:
        return cls(
            peer=raw["peer"],
            steps=raw["steps"],
            wall=raw["wall"],
            model=raw["model"],
            windows={int(k): v for k, v in raw["windows"].items()},
            disk_bytes=raw["disk_bytes"],
            persisted=raw["persisted"],
            ok=raw["ok"],
            problem=raw["problem"],
            durable_rows=raw["durable_rows"],
            unsynced_calls=raw.get("unsynced_calls", 0),
            peak_rss_kb=raw["peak_rss_kb"],
            gc_seconds=raw["gc_seconds"],
        )


def finish(
    peer: str,
    clock: StepClock,
    wall: float,
    disk: int,
    persisted: dict[str, int],
    problem: str,
    durable_rows: list[int],
    gc_time: GcTime,
) -> PeerRun:
    histories = (50, 200, 500)
    if len(clock.calls) != clock.steps + 1 and not problem:
        problem = f"expected {clock.steps + 1} model calls, saw {len(clock.calls)}"
    return PeerRun(
        peer=peer,
        steps=clock.steps,
        wall=wall,
        model=sum(clock.model),
        windows={h: clock.window_ms(h) for h in histories},
        disk_bytes=disk,
        persisted=persisted,
        ok=not problem,
        problem=problem,
        durable_rows=durable_rows,
        gc_seconds=gc_time.seconds,
    )
