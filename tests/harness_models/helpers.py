"""Shared helpers for the model adapter tests: requests, stream collection, a recorded sleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from loopd.harness._errors import ModelError
from loopd.harness.core._values import Message, ToolCall, Usage
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.harness.models._protocol import (
    ModelChunk,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageReport,
    tool_calls_from_deltas,
)
from loopd.harness.models._scripted_server import ScriptedServer

LIST_DIR = ToolSpec(
    name="list_dir",
    description="List a directory.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def ask(text: str, *, tools: tuple[ToolSpec, ...] = (), model: str = "") -> ModelRequest:
    return ModelRequest(model=model, messages=(Message(role="user", content=text),), tools=tools)


@dataclass
class Collected:
    chunks: list[ModelChunk] = field(default_factory=list)
    error: ModelError | None = None

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks if isinstance(c, TextDelta))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tool_calls_from_deltas([c for c in self.chunks if isinstance(c, ToolCallDelta)])

    @property
    def usage(self) -> Usage:
        reports = [c for c in self.chunks if isinstance(c, UsageReport)]
        assert len(reports) == 1, reports
        assert self.chunks[-1] is reports[0], "usage must end the stream"
        return reports[0].usage


async def collect(stream: AsyncIterator[ModelChunk]) -> Collected:
    """Drain a stream; a `ModelError` is kept next to the chunks that came before it."""
    out = Collected()
    try:
        async for chunk in stream:
            out.chunks.append(chunk)
    except ModelError as exc:
        out.error = exc
    return out


@dataclass
class RecordedSleep:
    """An injected sleep: records the delay and returns at once (backoff without waiting)."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


@dataclass
class Served:
    server: ScriptedServer
    base_url: str
    model: OpenAICompatibleModel
    sleep: RecordedSleep
