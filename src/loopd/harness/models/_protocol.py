"""The Model seam: one streaming call per step.

A model streams `ModelChunk`s; cancelling the consuming task closes the stream (the adapter's async generator
is closed, which must release the underlying connection).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from loopd.harness.core import Frozen, Message, ToolCall, Usage


class ToolSpec(Frozen):
    """What the model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


class ModelRequest(Frozen):
    """Everything a model call needs. Built by the runtime from loop state; never mutated."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    system: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None


class TextDelta(Frozen):
    kind: Literal["text"] = "text"
    text: str


class ToolCallDelta(Frozen):
    """A fragment of a streamed tool call; fragments with the same index belong together."""

    kind: Literal["tool_call"] = "tool_call"
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class UsageReport(Frozen):
    kind: Literal["usage"] = "usage"
    usage: Usage


class AttemptFailed(Frozen):
    """One attempt of a call failed and another follows (a retry of the same provider, or the next provider of a
    fallback chain). Yielded before the next attempt starts; it is never output: text and tool calls come only from
    the attempt that succeeds. A call whose last attempt fails raises that `ModelError` instead (no chunk).

    ``attempt`` is the 0-based number of the failed attempt within this call; ``provider`` is ``openai`` or
    ``anthropic``; ``model`` the id sent to it; ``next`` what happens now.
    """

    kind: Literal["attempt_failed"] = "attempt_failed"
    attempt: int
    provider: str
    model: str
    error_type: str
    message: str
    status_code: int | None = None
    retry_after: float | None = None
    next: Literal["retry", "fallback"] = "retry"


class ReplyInfo(Frozen):
    """What the provider said about a successful attempt besides its content: why it stopped (``finish_reason``)
    and its own id for the request (``request_id``, for support tickets and the ledger). Yielded at most once, after
    the attempt's last text / tool-call chunk; never output."""

    kind: Literal["reply_info"] = "reply_info"
    provider: str
    model: str
    finish_reason: str | None = None
    request_id: str | None = None


ModelChunk = TextDelta | ToolCallDelta | UsageReport | AttemptFailed | ReplyInfo


class ModelReply(Frozen):
    """A completed model call."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage


@runtime_checkable
class Model(Protocol):
    """A chat model. `stream` yields chunks until the reply is complete; errors are `ModelError`s."""

    @property
    def name(self) -> str: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...


def tool_calls_from_deltas(deltas: Sequence[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """Assemble streamed fragments into complete tool calls (arguments must be a JSON object)."""
    import json

    from loopd.harness._errors import ModelPermanentError

    by_index: dict[int, dict[str, Any]] = {}
    for d in deltas:
        slot = by_index.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
        if d.id:
            slot["id"] = d.id
        if d.name:
            slot["name"] += d.name
        slot["arguments"] += d.arguments
    calls: list[ToolCall] = []
    for index in sorted(by_index):
        slot = by_index[index]
        raw = slot["arguments"] or "{}"
        try:
            args = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ModelPermanentError(f"tool call {slot['name']!r} has malformed JSON arguments") from exc
        if not isinstance(args, dict):
            raise ModelPermanentError(f"tool call {slot['name']!r} arguments are not a JSON object")
        calls.append(ToolCall(id=slot["id"] or f"call_{index}", name=slot["name"], arguments=args))
    return tuple(calls)
