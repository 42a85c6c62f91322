"""A deterministic, in-process model for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loopd.harness._errors import ModelError, ModelPermanentError
from loopd.harness.core import ToolCall, Usage
from loopd.harness.models._protocol import ModelChunk, ModelRequest, TextDelta, ToolCallDelta, UsageReport


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted model reply.

    ``tool_calls`` accepts `ToolCall`s or ``(name, arguments)`` pairs (ids are generated per call).
    ``delay`` waits before the first chunk; ``chunk_delay`` between chunks; ``chunk_size`` splits the text
    (0: one chunk). ``error`` makes the call fail after ``fail_after_chunks`` chunks.
    """

    text: str = ""
    tool_calls: Sequence[ToolCall | tuple[str, dict[str, Any]]] = ()
    delay: float = 0.0
    chunk_delay: float = 0.0
    chunk_size: int = 0
    usage: Usage | None = None
    error: ModelError | None = None
    fail_after_chunks: int = 0


Script = Sequence[Reply] | Callable[[ModelRequest], Reply]


@dataclass
class ScriptedModel:
    """Plays `Reply`s in order (or asks a function for each one). Records every request in ``requests``."""

    script: Script
    model_name: str = "scripted"
    default: Reply | None = None
    requests: list[ModelRequest] = field(default_factory=list)
    _queue: deque[Reply] = field(init=False)
    _counter: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._queue = deque(self.script) if not callable(self.script) else deque()

    @property
    def name(self) -> str:
        return self.model_name

    def extend(self, replies: Iterable[Reply]) -> None:
        self._queue.extend(replies)

    def _next(self, request: ModelRequest) -> Reply:
        if callable(self.script):
            return self.script(request)
        if self._queue:
            return self._queue.popleft()
        if self.default is not None:
            return self.default
        raise ModelPermanentError("the scripted model has no reply left")

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        reply = self._next(request)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        chunks = _chunks(reply.text, reply.chunk_size)
        for emitted, piece in enumerate(chunks):
            if reply.error is not None and emitted >= reply.fail_after_chunks:
                raise reply.error
            if reply.chunk_delay and emitted:
                await asyncio.sleep(reply.chunk_delay)
            yield TextDelta(text=piece)
        if reply.error is not None:
            raise reply.error
        for index, call in enumerate(reply.tool_calls):
            self._counter += 1
            if isinstance(call, ToolCall):
                call_id, name, args = call.id, call.name, call.arguments
            else:
                call_id, (name, args) = f"call_{self._counter}", call
            yield ToolCallDelta(index=index, id=call_id, name=name, arguments=json.dumps(args))
        usage = reply.usage or Usage(
            input_tokens=sum(len(m.content) for m in request.messages) // 4 + 1,
            output_tokens=len(reply.text) // 4 + len(reply.tool_calls) * 8,
            calls=1,
        )
        yield UsageReport(usage=usage)


def _chunks(text: str, size: int) -> list[str]:
    if not text:
        return []
    if size <= 0:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)]
