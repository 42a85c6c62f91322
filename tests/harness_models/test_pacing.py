"""Pacing a reply whose text came whole (`pace_whole_replies`): the first model call through `RecordingModel` under a
binding, when its text and end arrived together, awaits the bound pacer after handing on the text and before handing
on the end; a reply that streams in pieces, calls a tool, a later call or one with no pacer bound is never paced, and
what the consumer sees is unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from loopd.harness.core import Usage
from loopd.harness.models import (
    AttemptFailed,
    ModelCallRecord,
    ModelChunk,
    ModelRequest,
    RecordingModel,
    ReplyInfo,
    TextDelta,
    ToolCallDelta,
    UsageReport,
    pace_whole_replies,
    record_model_calls,
)

_END = ReplyInfo(provider="test", model="m", finish_reason="stop")
_USAGE = UsageReport(usage=Usage(input_tokens=3, output_tokens=2))


class _Chunks:
    """A model that streams the chunks it was given, as they are."""

    name = "chunks"

    def __init__(self, chunks: Sequence[ModelChunk]) -> None:
        self._chunks = chunks

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        for chunk in self._chunks:
            await asyncio.sleep(0)
            yield chunk


class _Log:
    def __init__(self) -> None:
        self.calls: list[ModelCallRecord] = []

    def now(self) -> float:
        return 0.0

    def record(self, call: ModelCallRecord) -> None:
        self.calls.append(call)


async def _consume(chunks: Sequence[ModelChunk], *, log: _Log | None = None) -> list[str]:
    """What happened, in order: each chunk's type as the consumer got it, and ``paced`` when the pacer ran."""
    seen: list[str] = []

    async def pacer() -> None:
        seen.append("paced")

    request = ModelRequest(model="m", messages=(), tools=())
    with pace_whole_replies(pacer), record_model_calls(log):
        async for chunk in RecordingModel(_Chunks(chunks)).stream(request):
            seen.append(type(chunk).__name__)
    return seen


async def test_a_whole_reply_is_paced_after_its_text_and_before_its_end() -> None:
    for log in (None, _Log()):  # recorded or not: the same pacing
        seen = await _consume([TextDelta(text="Hello there"), _END, _USAGE], log=log)
        assert seen == ["TextDelta", "paced", "ReplyInfo", "UsageReport"]
    # a usage report between the text and the end is bookkeeping: still whole
    assert await _consume([TextDelta(text="Hi"), _USAGE, _END]) == ["TextDelta", "UsageReport", "paced", "ReplyInfo"]


async def test_a_streamed_reply_a_tool_call_or_no_text_is_not_paced() -> None:
    streamed = await _consume([TextDelta(text="Hel"), TextDelta(text="lo"), _END, _USAGE])
    tool = await _consume([TextDelta(text="Let me look"), ToolCallDelta(index=0, id="c1", name="ls"), _END])
    silent = await _consume([ToolCallDelta(index=0, id="c1", name="ls"), _END])
    assert "paced" not in streamed + tool + silent


async def test_an_attempt_that_failed_starts_the_watch_over() -> None:
    failed = AttemptFailed(attempt=0, model="m", provider="test", error_type="ModelRetryableError", message="busy")
    seen = await _consume([TextDelta(text="Hal"), failed, TextDelta(text="Hello"), _END])
    assert seen == ["TextDelta", "AttemptFailed", "TextDelta", "paced", "ReplyInfo"]


async def test_without_a_pacer_nothing_waits_and_the_call_is_recorded_as_before() -> None:
    log = _Log()
    request = ModelRequest(model="m", messages=(), tools=())
    with record_model_calls(log):
        got = [chunk async for chunk in RecordingModel(_Chunks([TextDelta(text="Hi"), _END, _USAGE])).stream(request)]
    assert got == [TextDelta(text="Hi"), _END, _USAGE]
    assert [(a.text, a.finish_reason) for a in log.calls[0].attempts] == [("Hi", "stop")]


async def test_only_the_first_call_under_a_binding_is_paced() -> None:
    paced: list[str] = []

    async def pacer() -> None:
        paced.append("paced")

    request = ModelRequest(model="m", messages=(), tools=())
    with pace_whole_replies(pacer):
        for _ in range(3):  # the answer's first reply; the ones after it (a retry, the next step) go on at once
            async for _chunk in RecordingModel(_Chunks([TextDelta(text="Hi"), _END])).stream(request):
                pass
    assert paced == ["paced"]


async def test_the_pacer_is_the_one_bound_where_the_call_runs() -> None:
    """Tasks created inside the block inherit the pacer (the server binds it around starting a harness run)."""
    paced: list[str] = []

    async def pacer() -> None:
        paced.append("outer")

    request = ModelRequest(model="m", messages=(), tools=())

    async def call() -> None:
        async for _ in RecordingModel(_Chunks([TextDelta(text="Hi"), _END])).stream(request):
            pass

    with pace_whole_replies(pacer):
        inside = asyncio.create_task(call())
    outside = asyncio.create_task(call())
    await asyncio.gather(inside, outside)
    assert paced == ["outer"]
