"""A scripted OpenAI-compatible Chat Completions server: the tests' provider and the ``demo`` model.

Endpoints: ``GET /v1/models`` and ``POST /v1/chat/completions``: a JSON completion, or with
``"stream": true`` SSE chunks in OpenAI's exact shape (a role chunk, content chunks, ``delta.tool_calls``
fragments with index, id, type and function name first and the arguments split across later chunks, a
``finish_reason`` chunk, a usage chunk when ``stream_options.include_usage`` is set, then
``data: [DONE]``).

What it answers comes from its **script**:

* a sequence of `ServerReply`, played in order, one per completion request; when it is exhausted the
  server answers 400 ``script_exhausted`` (a test asked more than it scripted);
* a rule ``(IncomingRequest) -> ServerReply``, e.g. keyed on ``request.last_user_text``;
* nothing: the **demo** rule (`demo_reply`), a deterministic, friendly assistant that echoes the user,
  explains how to configure a real model, and on "list files" / "read <path>" calls the ``list_dir`` /
  ``read_file`` tools (names configurable in `DemoOptions`), then shows the tool result, so a demo
  exercises tools and the gate. It reacts to the current request only: the last user message, and of a
  prompt that carries the conversation before it (loop-server's "Conversation so far: … Current request:", or
  "Said in the conversation since your last answer: …" for a call that goes on from an earlier answer),
  only the part after the last "Current request:" line. Extra **demo rules** (`DemoRule`, in
  ``DemoOptions.rules``) are tried first on that text: a layer above the harness (the Router, which must not
  import the harness) teaches the demo its own prompts this way, through whoever builds the model.

Each reply may inject faults: ``delay`` before the response, ``chunk_delay`` between chunks,
`FailWithStatus` (an HTTP error, optionally with Retry-After) and `DropAfter` (close the connection after
N chunks, without ``[DONE]``). The server records every request and how it ended (`ServerStatistics`),
including a client that went away mid-reply (``disconnected``), so tests can prove that cancellation
closes the stream.

Run it in-process with ``async with open_scripted_server(script) as base_url`` (loopback, port 0 by
default; ``base_url`` ends in ``/v1`` and goes straight to ``openai.AsyncOpenAI(base_url=...)``), or
standalone: ``python -m loopd.harness.models._scripted_server --port 8321``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import re
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring  # a str as JSON (ensure_ascii=False), as json.dumps encodes it
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from loopd._infra.jsontext import compact_lenient, loads
from loopd._infra.sse import sse_message
from loopd._infra.tasks import race
from loopd.harness._errors import HarnessError
from loopd.harness.core import Frozen, Usage

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------
# Script vocabulary


class ServerToolCall(Frozen):
    """A tool call to stream; ``arguments`` given as a ``str`` is sent verbatim (it may be malformed)."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


class FailWithStatus(Frozen):
    """Answer with an HTTP error in OpenAI's error shape (``Retry-After`` when ``retry_after`` is set)."""

    kind: Literal["status"] = "status"
    status: int = Field(ge=400, le=599)
    message: str = "scripted failure"
    error_type: str | None = None
    retry_after: float | None = Field(default=None, ge=0)


class DropAfter(Frozen):
    """Close the connection after ``chunks`` SSE chunks (a non-streamed reply: halfway through its body)."""

    kind: Literal["drop"] = "drop"
    chunks: int = Field(default=0, ge=0)


Fault = FailWithStatus | DropAfter


class ServerReply(Frozen):
    """One scripted answer. ``usage=None`` estimates tokens (≈ 4 characters per token)."""

    text: str = ""
    tool_calls: tuple[ServerToolCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    delay: float = Field(default=0.0, ge=0)
    chunk_delay: float = Field(default=0.0, ge=0)
    chunk_size: int = Field(default=16, ge=1)
    fault: Fault | None = None


class IncomingRequest(BaseModel):
    """A Chat Completions request as the server received it (unknown fields are kept)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    model: str
    messages: tuple[dict[str, Any], ...]
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    @property
    def tool_names(self) -> tuple[str, ...]:
        names = (t.get("function", {}).get("name") for t in self.tools if isinstance(t.get("function"), dict))
        return tuple(n for n in names if isinstance(n, str))

    @property
    def last_message(self) -> dict[str, Any] | None:
        return self.messages[-1] if self.messages else None

    @property
    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return content_text(message.get("content"))
        return ""


Rule = Callable[[IncomingRequest], ServerReply]
Script = Sequence[ServerReply] | Rule | None
Outcome = Literal["completed", "failed", "dropped", "disconnected"]


class ServerStatistics(Frozen):
    """Completion requests and how they ended.

    ``requests`` counts valid, authorised requests; ``rejected`` counts invalid, unauthorised and unscripted
    ones (a request beyond the end of a sequence script is counted in both).
    """

    requests: int = 0
    completed: int = 0
    failed: int = 0
    dropped: int = 0
    disconnected: int = 0
    rejected: int = 0


def content_text(content: Any) -> str:
    """The text of a message ``content`` (a string or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


# ----------------------------------------------------------------------------------------------------
# The demo model


DemoRule = Callable[[str], str | Mapping[str, Any] | None]
"""An extra reply rule of the demo model: the current request's text (see `current_request`) → the answer text, a
tool call ``{"tool": name, "arguments": {...}}`` (optionally with ``"text"``: said before the call), or None to leave
the request to the next rule. After a tool result the rules are asked again with the current request followed by
`TOOL_RESULTS_HEADER` and one ``[<tool>] <output>`` block per tool result of this turn (oldest first), so a rule can
answer from what its tool really returned. Rules must be pure and quick (they run in the server's event loop)."""

TOOL_RESULTS_HEADER: Final = "Tool results so far:"
"""The line that separates the current request from the tool results of this turn in what a `DemoRule` is given."""


class DemoOptions(Frozen):
    """How the demo rule names its tools and paces its answer, and the extra ``rules`` tried before its own.

    ``rules`` apply to a request whose last message is the user's (a tool result is always shown as is); the first
    rule that returns text answers, with that text and no tool call.
    """

    list_tool: str = "list_dir"
    read_tool: str = "read_file"
    path_argument: str = "path"
    chunk_delay: float = Field(default=0.0, ge=0)
    chunk_size: int = Field(default=12, ge=1)
    rules: tuple[DemoRule, ...] = ()


_DEMO_NOTE = (
    "I am loopd's demo model: a scripted stand-in that answers without a real LLM. To use a real model, set "
    "LOOPD_MODEL (for example gpt-4o-mini) and OPENAI_API_KEY, plus OPENAI_BASE_URL for another "
    "OpenAI-compatible provider. Try “list files” or “read README.md” to see tools and the permission gate."
)
_LIST_FILES = re.compile(r"\b(?:list|show)\s+(?:the\s+|all\s+)?files\b(?:\s+in\s+[`'\"]?(?P<path>[^\s`'\"]+))?", re.I)
_READ_FILE = re.compile(r"\b(?:read|open)\s+(?:the\s+file\s+)?[`'\"]?(?P<path>[\w./~-]+)", re.I)
_CURRENT_REQUEST = re.compile(r"^Current request:[ \t]*$", re.M)
_MAX_ECHO = 400
_MAX_TOOL_OUTPUT = 2000


def demo_reply(request: IncomingRequest, options: DemoOptions | None = None) -> ServerReply:
    """The demo model's answer to a request. Deterministic: the same request gets the same reply."""
    opts = options or DemoOptions()

    def answer(text: str, *calls: ServerToolCall) -> ServerReply:
        return ServerReply(text=text, tool_calls=calls, chunk_delay=opts.chunk_delay, chunk_size=opts.chunk_size)

    def ruled(text: str) -> ServerReply | None:
        for rule in opts.rules:
            reply = rule(text)
            if reply is None:
                continue
            if isinstance(reply, str):
                return answer(reply)
            return _rule_tool_call(request, reply, answer)
        return None

    last = request.last_message or {}
    said = current_request(request.last_user_text)
    if last.get("role") == "tool":
        if opts.rules and (reply := ruled(_with_tool_results(said, request))) is not None:
            return reply
        name = last.get("name") or _tool_name_for(request, last.get("tool_call_id")) or "the tool"
        output = content_text(last.get("content")).strip() or "(no output)"
        if len(output) > _MAX_TOOL_OUTPUT:
            output = output[:_MAX_TOOL_OUTPUT] + "\n…"
        text = (
            f"The `{name}` tool returned:\n\n```\n{output}\n```\n\n"
            "(I am the demo model, so I show the result instead of reasoning about it.)"
        )
        return answer(text)

    if opts.rules and (reply := ruled(said)) is not None:
        return reply
    wanted: tuple[str, str] | None = None
    if match := _LIST_FILES.search(said):
        wanted = (opts.list_tool, (match.group("path") or "").rstrip(".") or ".")
    elif path := _path_to_read(said):
        wanted = (opts.read_tool, path)
    if wanted is not None:
        tool, path = wanted
        if tool in request.tool_names:
            call = ServerToolCall(name=tool, arguments={opts.path_argument: path})
            return answer(f"Let me call `{tool}` for `{path}`.", call)
        offered = "offered: " + (", ".join(f"`{n}`" for n in request.tool_names) or "none")
        return answer(f"I would call `{tool}` for `{path}`, but this request offers no such tool ({offered}).")

    if not said:
        return answer(f"Hello! {_DEMO_NOTE}")
    echo = said if len(said) <= _MAX_ECHO else said[:_MAX_ECHO] + "…"
    return answer(f"You said: “{echo}”\n\n{_DEMO_NOTE}")


def _rule_tool_call(
    request: IncomingRequest, reply: Mapping[str, Any], answer: Callable[..., ServerReply]
) -> ServerReply:
    """A rule's ``{"tool", "arguments", "text"?}``: that tool call when the request offers the tool, else a note."""
    tool = reply.get("tool")
    arguments = reply.get("arguments")
    if not isinstance(tool, str) or not isinstance(arguments, Mapping):
        return answer(f"(a demo rule answered with something that is not a tool call: {dict(reply)!r})")
    if tool not in request.tool_names:
        offered = ", ".join(f"`{n}`" for n in request.tool_names) or "none"
        return answer(f"I would call `{tool}`, but this request offers no such tool (offered: {offered}).")
    text = reply.get("text")
    said = text if isinstance(text, str) else f"Let me call `{tool}`."
    return answer(said, ServerToolCall(name=tool, arguments=dict(arguments)))


def _with_tool_results(said: str, request: IncomingRequest) -> str:
    """``said`` followed by `TOOL_RESULTS_HEADER` and the tool results after the last user message, oldest first."""
    results: list[str] = []
    for message in reversed(request.messages):
        role = message.get("role")
        if role == "user":
            break
        if role == "tool":
            name = message.get("name") or _tool_name_for(request, message.get("tool_call_id")) or "tool"
            results.append(f"[{name}] {content_text(message.get('content')).strip()}")
    return "\n".join([said, "", TOOL_RESULTS_HEADER, *reversed(results)])


def current_request(text: str) -> str:
    """What the user asks now: ``text`` without the conversation a prompt may carry before it (everything up to
    its last "Current request:" line), so a tool asked for earlier in the conversation is not called again."""
    markers = list(_CURRENT_REQUEST.finditer(text))
    return (text[markers[-1].end() :] if markers else text).strip()


def _path_to_read(said: str) -> str | None:
    """The first "read <path>" whose path looks like one (has a dot or a slash): "read a book" is no request."""
    for match in _READ_FILE.finditer(said):
        path = match.group("path").rstrip(".")
        if "." in path or "/" in path:
            return path
    return None


def _tool_name_for(request: IncomingRequest, call_id: Any) -> str | None:
    for message in reversed(request.messages):
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and call.get("id") == call_id:
                name = (call.get("function") or {}).get("name")
                return name if isinstance(name, str) else None
    return None


# ----------------------------------------------------------------------------------------------------
# Wire encoding (pure)


def estimate_usage(request: IncomingRequest, reply: ServerReply) -> Usage:
    """A deterministic token estimate: about four characters per token."""
    prompt_chars = sum(len(content_text(m.get("content"))) for m in request.messages)
    output_chars = len(reply.text) + sum(len(c.name) + len(c.arguments_json()) for c in reply.tool_calls)
    return Usage(input_tokens=max(1, math.ceil(prompt_chars / 4)), output_tokens=max(1, math.ceil(output_chars / 4)))


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _finish_reason(reply: ServerReply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _tool_call_id(call: ServerToolCall, completion_id: str, index: int) -> str:
    return call.id or f"call_{completion_id.rsplit('-', 1)[-1]}_{index}"


def _deltas(reply: ServerReply, completion_id: str) -> Iterator[tuple[dict[str, Any], str | None, str | None]]:
    """The deltas of a streamed reply's chunks in order, each with its ``finish_reason`` and, for a text or argument
    piece (most of them), the key of its shape (None for any other delta): what `stream_chunks` wraps into chunks
    and `stream_frames` splices into templates."""
    yield {"role": "assistant", "content": "", "refusal": None}, None, None
    for piece in _pieces(reply.text, reply.chunk_size):
        yield {"content": piece}, None, "content" if piece else None
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": _tool_call_id(call, completion_id, index),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield {"tool_calls": [head]}, None, None
        for piece in _pieces(call.arguments_json(), reply.chunk_size):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            yield delta, None, f"arguments/{index}" if piece else None
    yield {}, _finish_reason(reply), None


def _chunker(
    completion_id: str, model: str, created: int, include_usage: bool
) -> Callable[[dict[str, Any], str | None], dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if include_usage:
            body["usage"] = None
        return body

    return chunk


def _usage_chunk(completion_id: str, model: str, created: int, usage: Usage) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage_json(usage),
    }


def stream_chunks(
    reply: ServerReply,
    *,
    completion_id: str,
    model: str,
    created: int,
    usage: Usage | None = None,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply (last a usage chunk if ``usage`` is set)."""
    chunk = _chunker(completion_id, model, created, usage is not None)
    chunks = [chunk(delta, finish) for delta, finish, _ in _deltas(reply, completion_id)]
    if usage is not None:
        chunks.append(_usage_chunk(completion_id, model, created, usage))
    return chunks


_PIECE: Final = "\x00piece\x00"
"""A stand-in content of a chunk's template (JSON-escaped it cannot occur in an encoded chunk otherwise)."""


def stream_frames(
    reply: ServerReply,
    *,
    completion_id: str,
    model: str,
    created: int,
    usage: Usage | None = None,
) -> list[bytes]:
    """The SSE frames of `stream_chunks` (the same bytes as `encode_sse` of each), ``[DONE]`` not included.

    The text and argument pieces (most of a reply's chunks) differ from each other only in their piece: their chunk
    is encoded once per reply with a stand-in and each frame splices its piece's JSON string in, instead of
    building and encoding a whole chunk per piece."""
    chunk = _chunker(completion_id, model, created, usage is not None)
    marker = encode_basestring(_PIECE)
    templates: dict[str, tuple[bytes, bytes]] = {}
    frames: list[bytes] = []
    for delta, finish, shape in _deltas(reply, completion_id):
        if shape is None:
            frames.append(encode_sse(chunk(delta, finish)))
            continue
        piece = _piece_of(delta)
        template = templates.get(shape)
        if template is None:
            _set_piece(delta, _PIECE)
            head, tail = _dump(chunk(delta, finish)).split(marker)
            _set_piece(delta, piece)
            template = templates[shape] = (b"data: " + head.encode(), tail.encode() + b"\n\n")
        frames.append(template[0] + encode_basestring(piece).encode() + template[1])
    if usage is not None:
        frames.append(encode_sse(_usage_chunk(completion_id, model, created, usage)))
    return frames


def _dump(value: Any) -> str:
    return compact_lenient(value)


def _piece_of(delta: dict[str, Any]) -> str:
    """The piece of a text or argument delta (one `_deltas` gave a shape key)."""
    if "content" in delta:
        return str(delta["content"])
    return str(delta["tool_calls"][0]["function"]["arguments"])


def _set_piece(delta: dict[str, Any], piece: str) -> None:
    if "content" in delta:
        delta["content"] = piece
    else:
        delta["tool_calls"][0]["function"]["arguments"] = piece


def completion_body(
    reply: ServerReply, *, completion_id: str, model: str, created: int, usage: Usage
) -> dict[str, Any]:
    """The ``chat.completion`` object of a non-streamed reply."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": _tool_call_id(call, completion_id, index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json()},
            }
            for index, call in enumerate(reply.tool_calls)
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}],
        "usage": usage_json(usage),
    }


def encode_sse(data: dict[str, Any] | str) -> bytes:
    """One SSE event carrying ``data`` (JSON-encoded unless it is already a string such as ``[DONE]``)."""
    text = data if isinstance(data, str) else compact_lenient(data)
    return sse_message(text)


_DONE: Final = encode_sse("[DONE]")
"""The stream's last frame."""


def error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


# ----------------------------------------------------------------------------------------------------
# The server


class ScriptedServer:
    """The ASGI app and its state: the script, the request history and the outcome counters.

    ``api_key``, when set, is required as the bearer token (401 otherwise). ``history`` bounds how many
    requests are kept in `requests`.
    """

    def __init__(
        self,
        script: Script = None,
        *,
        demo: DemoOptions | None = None,
        api_key: str | None = None,
        models: Sequence[str] = ("demo",),
        history: int = 256,
        body_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._queue: deque[ServerReply] | None = None
        self._rule: Rule
        if script is None:
            options = demo or DemoOptions()
            self._rule = lambda request: demo_reply(request, options)
        elif callable(script):
            self._rule = script
        else:
            queue = self._queue = deque(script)
            self._rule = lambda _: _next_reply(queue)
        self._api_key = api_key
        self._models = tuple(models)
        self._requests: deque[IncomingRequest] = deque(maxlen=history)
        self._counts: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._ids = itertools.count(1)
        self._body_timeout = body_timeout
        self._clock = clock
        self.app = Starlette(
            routes=[
                Route("/v1/models", self._list_models, methods=["GET"]),
                Route("/v1/chat/completions", _RawEndpoint(self._chat_completions), methods=["POST"]),
            ]
        )

    @property
    def requests(self) -> tuple[IncomingRequest, ...]:
        """The most recent completion requests, oldest first."""
        return tuple(self._requests)

    @property
    def remaining(self) -> int | None:
        """Replies left in a sequence script (None for a rule or the demo)."""
        return None if self._queue is None else len(self._queue)

    def statistics(self) -> ServerStatistics:
        counts = self._counts
        return ServerStatistics(
            requests=counts["requests"],
            completed=counts["completed"],
            failed=counts["failed"],
            dropped=counts["dropped"],
            disconnected=counts["disconnected"],
            rejected=counts["rejected"],
        )

    async def wait_until(
        self, predicate: Callable[[ServerStatistics], bool], *, timeout: float = 5.0
    ) -> ServerStatistics:
        """Wait until ``predicate(statistics())`` holds; `TimeoutError` after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate(stats := self.statistics()):
                await self._changed.wait()
        return stats

    def _count(self, key: str) -> None:
        self._counts[key] += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _list_models(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "loopd"} for m in self._models]
        return JSONResponse({"object": "list", "data": data})

    async def _chat_completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = Request(scope, receive)
        try:
            async with asyncio.timeout(self._body_timeout):
                raw = loads(await http.body())  # the fast decoder (Starlette's `json()` is the standard one)
            request = IncomingRequest.model_validate(raw)
        except (ValueError, ValidationError) as exc:
            self._count("rejected")
            await _json(send, 400, error_body(f"invalid request: {exc}", "invalid_request_error"))
            return
        if self._api_key is not None and http.headers.get("authorization") != f"Bearer {self._api_key}":
            self._count("rejected")
            await _json(send, 401, error_body("invalid API key", "authentication_error", "invalid_api_key"))
            return
        self._requests.append(request)
        self._count("requests")
        try:
            reply = self._rule(request)
        except _ScriptExhaustedError:
            self._count("rejected")
            message = f"scripted server: no reply left for request {self._counts['requests']}"
            await _json(send, 400, error_body(message, "script_exhausted"))
            return
        outcome = await _play(
            reply,
            request,
            completion_id=f"chatcmpl-scripted-{next(self._ids)}",
            created=int(self._clock()),
            receive=receive,
            send=send,
        )
        self._count(outcome)


class _ScriptExhaustedError(HarnessError):
    pass


def _next_reply(queue: deque[ServerReply]) -> ServerReply:
    if not queue:
        raise _ScriptExhaustedError
    return queue.popleft()


class _RawEndpoint:
    """An ASGI callable mounted as a route as is.

    Starlette would wrap a plain method as a request handler; the chat endpoint needs raw ASGI to notice a
    disconnect and to drop a connection.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


async def _play(
    reply: ServerReply,
    request: IncomingRequest,
    *,
    completion_id: str,
    created: int,
    receive: Receive,
    send: Send,
) -> Outcome:
    """Send ``reply`` while watching for the client to go away; return how the exchange ended."""
    if not reply.delay and not reply.chunk_delay and reply.fault is None:
        # Zero latency, no fault: the whole reply goes in one write (`_produce`) with nothing to wait for in
        # between, so there is no "went away mid-reply" to watch for (a client gone by then drops the write).
        return await _produce(reply, request, completion_id, created, send)
    # The first of the two to end decides; the other is cancelled (one TaskGroup, see `race`).
    produced, _ = await race(
        _produce(reply, request, completion_id, created, send),
        _wait_for_disconnect(receive),
        names=("scripted-produce", "scripted-disconnect"),
    )
    if not produced.cancelled:
        return produced.result()  # re-raises what the producer raised
    return "disconnected"


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _produce(
    reply: ServerReply, request: IncomingRequest, completion_id: str, created: int, send: Send
) -> Outcome:
    if reply.delay:
        await asyncio.sleep(reply.delay)
    fault = reply.fault
    if isinstance(fault, FailWithStatus):
        headers: list[tuple[bytes, bytes]] = []
        if fault.retry_after is not None:
            seconds = fault.retry_after
            headers.append((b"retry-after", str(math.ceil(seconds)).encode()))
            headers.append((b"retry-after-ms", str(round(seconds * 1000)).encode()))
        error_type = fault.error_type or _ERROR_TYPES.get(fault.status, "server_error")
        await _json(send, fault.status, error_body(fault.message, error_type), headers)
        return "failed"
    drop_after = fault.chunks if isinstance(fault, DropAfter) else None
    usage = reply.usage or estimate_usage(request, reply)

    if not request.stream:
        body = json.dumps(
            completion_body(reply, completion_id=completion_id, model=request.model, created=created, usage=usage)
        ).encode()
        await _start(send, 200, b"application/json", [(b"content-length", str(len(body)).encode())])
        if drop_after is not None:
            await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
            return "dropped"
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return "completed"

    frames = stream_frames(
        reply,
        completion_id=completion_id,
        model=request.model,
        created=created,
        usage=usage if request.include_usage else None,
    )
    await _start(send, 200, b"text/event-stream; charset=utf-8", [(b"cache-control", b"no-cache")])
    if drop_after is None and not reply.chunk_delay:
        # Zero latency: every frame is ready at once, so they go as one write — what a reader of a server writing
        # them back to back gets in one read anyway — instead of one ASGI message (and, in process, one hand-over
        # to the reader) per frame.
        await send({"type": "http.response.body", "body": b"".join([*frames, _DONE]), "more_body": False})
        return "completed"
    for index, frame in enumerate(frames):
        if drop_after is not None and index >= drop_after:
            return "dropped"
        if index and reply.chunk_delay:
            await asyncio.sleep(reply.chunk_delay)
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    if drop_after is not None:
        return "dropped"
    await send({"type": "http.response.body", "body": _DONE, "more_body": False})
    return "completed"


async def _start(send: Send, status: int, content_type: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), *headers],
        }
    )


async def _json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    await _start(send, status, b"application/json", [(b"content-length", str(len(data)).encode()), *(headers or [])])
    await send({"type": "http.response.body", "body": data, "more_body": False})


# ----------------------------------------------------------------------------------------------------
# Running it


@contextlib.asynccontextmanager
async def open_scripted_server(
    script: Script | ScriptedServer = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout: float = 10.0,
    shutdown_timeout: float = 5.0,
) -> AsyncIterator[str]:
    """Serve ``script`` (or a prepared `ScriptedServer`) on ``host:port`` in this loop; yield the base URL.

    The server stops when the block exits (in-flight replies get up to ``shutdown_timeout`` seconds). It runs on
    the floor's runner with h11 (the parser its faults were written against) and leaves the process's logging and
    signal handlers alone.
    """
    server = script if isinstance(script, ScriptedServer) else ScriptedServer(script)
    from loopd._infra.serving import open_http_server  # the web server only when served on a socket

    async with open_http_server(
        server.app,
        host=host,
        port=port,
        start_timeout=startup_timeout,
        graceful_timeout=max(shutdown_timeout - 1, 1),
        lifespan="off",
        log_level=None,
        http="h11",
    ) as running:
        yield f"{running.url}/v1"


async def _serve_demo(server: ScriptedServer, host: str, port: int) -> None:
    from loopd._infra.serving import open_http_server

    async with open_http_server(
        server.app, host=host, port=port, lifespan="off", http="h11", handle_signals=True
    ) as running:
        print(f"loopd demo model on {running.url}/v1 (LOOPD_MODEL=demo)", flush=True)
        await running.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the demo model as a standalone OpenAI-compatible server."""
    parser = argparse.ArgumentParser(
        prog="python -m loopd.harness.models._scripted_server",
        description="loopd's demo model: a scripted OpenAI-compatible Chat Completions server.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--chunk-delay", type=float, default=0.02, help="seconds between streamed chunks")
    parser.add_argument("--list-tool", default="list_dir")
    parser.add_argument("--read-tool", default="read_file")
    args = parser.parse_args(argv)
    demo = DemoOptions(list_tool=args.list_tool, read_tool=args.read_tool, chunk_delay=args.chunk_delay)
    server = ScriptedServer(demo=demo)
    asyncio.run(_serve_demo(server, args.host, args.port))


if __name__ == "__main__":
    main()
