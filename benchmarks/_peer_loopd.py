"""The workload on the loopd harness: one session, one turn, SqliteJournal on a file.

The model is loopd's real OpenAI-compatible adapter (`OpenAICompatibleModel`, on the `openai` SDK and httpx2) sending
every call through an in-process OpenAI-compatible transport (``httpx2.MockTransport``) that answers with a streamed
Chat Completions reply (one tool call, or the final text). So every step pays what a real loopd call pays — the
provider messages built from the whole history, the JSON request, the SSE stream parsed back into chunks — like the
peers pay their own request building. Only the transport's handler (reading nothing, returning pre-encoded bytes) is
the fake model's time, subtracted like the peers' fake models.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import httpx2

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
from loopd.harness import EchoTool, LoopDefinition, Rig, SqliteJournal
from loopd.harness.core.events import TurnDone
from loopd.harness.models import OpenAICompatibleModel

DB = "loopd.db"
MODEL = "bench-model"


def _sse(chunks: list[dict[str, object]]) -> bytes:
    lines = [f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n" for chunk in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def _chunk(index: int, delta: dict[str, object], finish: str | None) -> dict[str, object]:
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _usage(index: int) -> dict[str, object]:
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
    }


def tool_reply(index: int) -> bytes:
    """A streamed reply asking for one echo call (the call id differs per step, like a real provider's)."""
    call = {
        "index": 0,
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": "echo", "arguments": json.dumps(TOOL_ARGUMENTS)},
    }
    return _sse(
        [
            _chunk(index, {"role": "assistant", "tool_calls": [call]}, None),
            _chunk(index, {}, "tool_calls"),
            _usage(index),
        ]
    )


def final_reply(index: int) -> bytes:
    """A streamed final answer."""
    return _sse(
        [_chunk(index, {"role": "assistant", "content": FINAL_TEXT}, None), _chunk(index, {}, "stop"), _usage(index)]
    )


def transport(
    clock: StepClock, probe: list[int] | None, path: Path, unsynced: Callable[[], bool] = lambda: False
) -> tuple[httpx2.MockTransport, list[bool]]:
    """The in-process OpenAI-compatible endpoint: POST /chat/completions → a streamed reply, at once; with a
    ``probe``, also whether each call started while the journal held commits not yet synced."""
    seen_unsynced: list[bool] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        index, started = clock.enter()
        if probe is not None:
            seen_unsynced.append(unsynced())
            probe.append(count_rows(path, "SELECT count(*) FROM journal_records WHERE kind = 'step_done'"))
        body = tool_reply(index) if clock.wants_tool(index) else final_reply(index)
        response = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)
        clock.leave(started)
        return response

    return httpx2.MockTransport(handle), seen_unsynced


async def run(
    steps: int, directory: Path, *, probe: bool = False, synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
) -> PeerRun:
    path = directory / DB
    clock = StepClock(steps)
    durable_rows: list[int] | None = [] if probe else None
    journal = await SqliteJournal.open(path, synchronous=synchronous)
    endpoint, unsynced_calls = transport(clock, durable_rows, path, lambda: journal.unsynced)
    http = httpx2.AsyncClient(transport=endpoint, timeout=60.0)
    model = OpenAICompatibleModel(MODEL, base_url="http://model.invalid/v1", api_key="bench", http_client=http)
    rig = Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),), max_steps=steps + 1)],
        journal=journal,
    )
    try:
        session = await rig.start_session()
        with GcTime().measuring() as gc_time:
            started = time.perf_counter()
            end = await session.ask(USER_TEXT, timeout=3600)
            wall = time.perf_counter() - started
        await session.shutdown()
    finally:
        await model.aclose()
        await http.aclose()
        await journal.aclose()
    disk = directory_bytes(directory, DB)
    problem = "" if isinstance(end, TurnDone) else f"turn ended with {end.kind}"
    persisted = {
        "step_done records": count_rows(path, "SELECT count(*) FROM journal_records WHERE kind = 'step_done'"),
        "tool_completed records": count_rows(
            path, "SELECT count(*) FROM journal_records WHERE kind = 'tool_completed'"
        ),
        "records": count_rows(path, "SELECT count(*) FROM journal_records"),
    }
    if persisted["step_done records"] != steps or persisted["tool_completed records"] != steps:
        problem = problem or f"journal holds {persisted}, expected {steps} steps"
    run = finish(
        f"loopd (synchronous={synchronous})", clock, wall, disk, persisted, problem, durable_rows or [], gc_time
    )
    run.unsynced_calls = sum(unsynced_calls)
    return run
