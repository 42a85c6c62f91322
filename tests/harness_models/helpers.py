"""Shared helpers for the model adapter tests: requests, stream collection, a recorded sleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx2

from loopd.harness._errors import ModelError
from loopd.harness.core._values import Message, ToolCall, Usage
from loopd.harness.models._anthropic import AnthropicModel
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


class Recorder:
    """An in-process endpoint that keeps every request and answers with the next scripted body (a streamed reply)."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.requests: list[httpx2.Request] = []
        self._bodies = bodies
        self.http = httpx2.AsyncClient(transport=httpx2.MockTransport(self._handle), timeout=10.0)

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=self._bodies.pop(0))


def outcome(error: ModelError | None, text: str) -> tuple[object, ...]:
    """What a caller sees of a call's end: its error (type, message, status, Retry-After) and the text shown."""
    if error is None:
        return (None, text)
    return (type(error), str(error), error.status_code, getattr(error, "retry_after", None), text)


def assert_sent_like_the_first(requests: list[httpx2.Request]) -> None:
    """Every request after the first is the first one's (method, URL, headers in order, timeouts) with its own body
    and that body's Content-Length: what a direct send must put on the wire."""
    first, *rest = requests
    kept = [(k, v) for k, v in first.headers.raw if k.lower() != b"content-length"]
    for later in rest:
        assert (later.method, later.url) == (first.method, first.url)
        assert later.headers["content-length"] == str(len(later.content))
        assert later.extensions["timeout"] == first.extensions["timeout"]
        built = httpx2.Request("POST", first.url, headers=kept, content=later.content)
        assert later.headers.raw == built.headers.raw  # what `content=` builds, header for header, in order


async def ended_on_both_paths(
    adapter: Callable[[httpx2.AsyncClient], OpenAICompatibleModel | AnthropicModel], warm: bytes, body: bytes
) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """How a reply of ``body`` ends for the caller through the SDK (a fresh adapter's first call) and through a
    direct send (the call after one that answered ``warm``): two `outcome`s, which must be equal."""
    outcomes: list[tuple[object, ...]] = []
    for direct in (False, True):
        endpoint = Recorder([warm, body] if direct else [body])
        model = adapter(endpoint.http)
        if direct:
            await collect(model.stream(ask("hi")))
        got = await collect(model.stream(ask("hi")))
        assert model.direct_sends == int(direct)
        outcomes.append(outcome(got.error, got.text))
        await model.aclose()
        await endpoint.http.aclose()
    return outcomes[0], outcomes[1]
