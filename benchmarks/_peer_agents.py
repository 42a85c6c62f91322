"""The workload on the OpenAI Agents SDK: ``Runner.run`` with an ``SQLiteSession`` on a file and a fake ``Model``.

``synchronous`` sets SQLite's ``PRAGMA synchronous`` of every connection the session opens (it opens one per
worker thread and configures it in ``_configure_connection``; a subclass adds the pragma there and records what
each connection reads back, so a run proves it wrote at the level it claims).

The fake model implements the SDK's ``Model`` interface without any network: each call returns one
``function_call`` output item (or, at the end, one assistant message). Tracing is disabled.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from agents import Agent, ModelResponse, RunConfig, Runner, SQLiteSession, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from benchmarks._workload import (
    FINAL_TEXT,
    TOOL_ARGUMENTS,
    USER_TEXT,
    GcTime,
    PeerRun,
    StepClock,
    count_rows,
    directory_bytes,
    finish,
)

DB = "agents.db"
SESSION = "bench"


@function_tool
async def echo(text: str) -> str:
    """Echo the given text back."""
    return text


class FakeModel(Model):
    """Answers every call at once: a tool call while steps remain, then a final message."""

    def __init__(self, clock: StepClock, probe: list[int] | None, path: Path) -> None:
        self._clock = clock
        self._probe = probe
        self._path = path
        self._arguments = json.dumps(TOOL_ARGUMENTS)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        index, started = self._clock.enter()
        if self._probe is not None:
            self._probe.append(count_rows(self._path, "SELECT count(*) FROM agent_messages"))
        output: list[Any]
        if self._clock.wants_tool(index):
            output = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{index}",
                    call_id=f"call_{index}",
                    name="echo",
                    arguments=self._arguments,
                    status="completed",
                )
            ]
        else:
            text = ResponseOutputText(type="output_text", text=FINAL_TEXT, annotations=[])
            output = [
                ResponseOutputMessage(
                    type="message", id=f"msg_{index}", role="assistant", status="completed", content=[text]
                )
            ]
        usage = Usage(requests=1, input_tokens=50, output_tokens=20, total_tokens=70)
        response = ModelResponse(output=output, usage=usage, response_id=None)
        self._clock.leave(started)
        return response

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the benchmark does not stream")


SYNCHRONOUS_LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class TunedSQLiteSession(SQLiteSession):
    """`SQLiteSession` whose connections write at ``PRAGMA synchronous=<level>``."""

    def __init__(self, session_id: str, path: Path, synchronous: Literal["FULL", "NORMAL"]) -> None:
        self.synchronous = synchronous
        self.seen_levels: set[str] = set()
        super().__init__(session_id, path)

    def _configure_connection(self, conn: sqlite3.Connection) -> None:  # type: ignore[override]  # static upstream
        SQLiteSession._configure_connection(conn)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        level = conn.execute("PRAGMA synchronous").fetchone()[0]
        self.seen_levels.add(SYNCHRONOUS_LEVELS.get(level, str(level)))


async def run(
    steps: int, directory: Path, *, probe: bool = False, synchronous: Literal["FULL", "NORMAL"] = "FULL"
) -> PeerRun:
    set_tracing_disabled(True)
    path = directory / DB
    clock = StepClock(steps)
    durable_rows: list[int] | None = [] if probe else None
    agent = Agent(name="bench", model=FakeModel(clock, durable_rows, path), tools=[echo])
    session = TunedSQLiteSession(SESSION, path, synchronous)
    try:
        with GcTime().measuring() as gc_time:
            started = time.perf_counter()
            result = await Runner.run(
                agent, USER_TEXT, session=session, max_turns=steps + 5, run_config=RunConfig(tracing_disabled=True)
            )
            wall = time.perf_counter() - started
    finally:
        session.close()
    disk = directory_bytes(directory, DB)
    problem = "" if result.final_output == FINAL_TEXT else f"final output {str(result.final_output)[:40]!r}"
    persisted = {"session items": count_rows(path, "SELECT count(*) FROM agent_messages")}
    if persisted["session items"] != 2 * steps + 2:
        problem = problem or f"session holds {persisted['session items']} items, expected {2 * steps + 2}"
    if session.seen_levels != {synchronous}:
        problem = problem or f"connections wrote at synchronous {sorted(session.seen_levels)}, not {synchronous}"
    return finish(
        f"OpenAI Agents SDK (synchronous={synchronous})",
        clock,
        wall,
        disk,
        persisted,
        problem,
        durable_rows or [],
        gc_time,
    )
