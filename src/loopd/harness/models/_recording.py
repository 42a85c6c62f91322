"""Recording model calls for the ledger: `RecordingModel` wraps a model and reports each call to a `ModelCallLog`.

Which log hears a call is carried by a context variable (`record_model_calls`): the server's built-in harness
adapter binds one log per harness session around opening it, so the session's loop tasks — created in that
context — inherit it, while other sessions of the same rig (and every caller without a log) see none and the
wrapper passes chunks straight through.

One ``stream()`` call is one `ModelCallRecord`: its request and its attempts — one failed attempt per
`AttemptFailed` chunk the inner model yields (its own retries or a fallback chain moving on) and the final attempt
(the reply: text, tool calls, usage, `ReplyInfo`; or the error it raised, or ``Cancelled`` when the consumer closed
the stream). The runtime's own retries (a new ``stream()`` after ``model_retrying``) are further records with the
same request.

Pacing (`pace_whole_replies`, another context variable the server's harness calls bind): the first call made under a
binding, when its reply text came whole — one text chunk, then the reply's end, nothing streamed in between — awaits the
bound `Pacer` before it hands on that end (the calls after it, a retry included, are never paced). The text is out; what
the loop does with the reply (its journal write, the turn's end) waits. The server uses it to spend a burst's CPU on the
answers that show nothing yet (`loopd.server.streams.FirstOutputs`). A reply that streams in pieces, calls a tool or
fails is never paced. Must not do: I/O, or change what the consumer sees (pacing changes only when).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from loopd.harness.core import ToolCall, Usage

from ._protocol import (
    AttemptFailed,
    Model,
    ModelChunk,
    ModelRequest,
    ReplyInfo,
    TextDelta,
    ToolCallDelta,
    UsageReport,
    tool_calls_from_deltas,
)


@dataclass(frozen=True, slots=True)
class ModelAttemptRecord:
    """One try at a provider within a model call: the reply (``error_type`` None) or why it failed."""

    model: str
    started_at: float
    """Epoch seconds on the log's clock."""
    ended_at: float
    provider: str | None = None
    error_type: str | None = None
    message: str | None = None
    status_code: int | None = None
    retry_after: float | None = None
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    request_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_type is None


@dataclass(frozen=True, slots=True)
class ModelCallRecord:
    """One ``stream()`` call: the request and its attempts, oldest first (only the last one can have succeeded)."""

    request: ModelRequest
    attempts: tuple[ModelAttemptRecord, ...]

    @property
    def ok(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].ok


class ModelCallLog(Protocol):
    """Where recorded calls go (the server's engine keeps one per harness session)."""

    def now(self) -> float:
        """Epoch seconds on the log's clock (attempt timings)."""
        ...

    def record(self, call: ModelCallRecord) -> None:
        """Take one finished call; must not block or raise."""
        ...


_LOG: ContextVar[ModelCallLog | None] = ContextVar("loopd_model_call_log", default=None)


@contextmanager
def record_model_calls(log: ModelCallLog | None) -> Iterator[None]:
    """Calls through a `RecordingModel` made in this context — and in tasks created inside it — report to ``log``."""
    token = _LOG.set(log)
    try:
        yield
    finally:
        _LOG.reset(token)


Pacer = Callable[[], Awaitable[None]]
"""Awaited by a model call whose reply text came whole, before the reply's end goes on (see `pace_whole_replies`)."""


class _Pacing:
    """One binding of `pace_whole_replies`: its pacer, until the first call under it claims it."""

    __slots__ = ("pacer",)

    def __init__(self, pacer: Pacer) -> None:
        self.pacer: Pacer | None = pacer

    def claim(self) -> Pacer | None:
        pacer, self.pacer = self.pacer, None
        return pacer


_PACER: ContextVar[_Pacing | None] = ContextVar("loopd_model_pacer", default=None)


@contextmanager
def pace_whole_replies(pacer: Pacer | None) -> Iterator[None]:
    """The first call through a `RecordingModel` made in this context — or in a task created inside it — awaits
    ``pacer`` before it hands on its reply's end when its text came whole (see the module docstring)."""
    token = _PACER.set(_Pacing(pacer) if pacer is not None else None)
    try:
        yield
    finally:
        _PACER.reset(token)


class _WholeText:
    """Watches one call's chunks: `ends_whole` is true at a `ReplyInfo` right behind the reply's only text chunk
    (usage reports aside); a tool call fragment rules the call out, a failed attempt starts over."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = 0  # 0: nothing yet; 1: one text chunk, nothing after it; -1: something else came

    def ends_whole(self, chunk: ModelChunk) -> bool:
        state = self._state
        if isinstance(chunk, TextDelta):
            self._state = 1 if state == 0 else -1
        elif isinstance(chunk, ReplyInfo):
            self._state = -1
            return state == 1
        elif isinstance(chunk, AttemptFailed):
            self._state = 0
        elif not isinstance(chunk, UsageReport):
            self._state = -1
        return False


class RecordingModel:
    """A model that reports each call to ``log``, else to the context's `ModelCallLog` (see the module docstring)."""

    def __init__(self, inner: Model, *, log: ModelCallLog | None = None) -> None:
        self._inner = inner
        self._log = log

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def inner(self) -> Model:
        return self._inner

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        log = self._log or _LOG.get()
        pacing = _PACER.get()
        pacer = pacing.claim() if pacing is not None else None
        whole = _WholeText() if pacer is not None else None
        if log is None:
            async for chunk in self._inner.stream(request):
                if whole is not None and pacer is not None and whole.ends_whole(chunk):
                    await pacer()
                yield chunk
            return
        attempts: list[ModelAttemptRecord] = []
        started = log.now()
        text: list[str] = []
        deltas: list[ToolCallDelta] = []
        usage: Usage | None = None
        info: ReplyInfo | None = None
        try:
            async for chunk in self._inner.stream(request):
                match chunk:
                    case TextDelta(text=piece):
                        text.append(piece)
                    case ToolCallDelta():
                        deltas.append(chunk)
                    case UsageReport(usage=reported):
                        usage = reported if usage is None else usage + reported
                    case ReplyInfo():
                        info = chunk
                    case AttemptFailed():
                        now = log.now()
                        attempts.append(
                            ModelAttemptRecord(
                                model=chunk.model,
                                provider=chunk.provider,
                                started_at=started,
                                ended_at=now,
                                error_type=chunk.error_type,
                                message=chunk.message,
                                status_code=chunk.status_code,
                                retry_after=chunk.retry_after,
                            )
                        )
                        started, text, deltas, usage, info = now, [], [], None, None
                if whole is not None and pacer is not None and whole.ends_whole(chunk):
                    await pacer()
                yield chunk
        except BaseException as exc:  # recorded, then raised on unchanged (cancellation included)
            cancelled = isinstance(exc, GeneratorExit) or type(exc).__name__ == "CancelledError"
            attempts.append(
                ModelAttemptRecord(
                    model=request.model,
                    provider=info.provider if info is not None else None,
                    started_at=started,
                    ended_at=log.now(),
                    error_type="Cancelled" if cancelled else type(exc).__name__,
                    message="the call was closed before the reply ended" if cancelled else str(exc),
                    status_code=getattr(exc, "status_code", None),
                    retry_after=getattr(exc, "retry_after", None),
                    text="".join(text),
                )
            )
            log.record(ModelCallRecord(request, tuple(attempts)))
            raise
        try:
            calls = tool_calls_from_deltas(deltas)
        except Exception:  # the consumer raises its own error on them; the record keeps what arrived
            calls = ()
        attempts.append(
            ModelAttemptRecord(
                model=info.model if info is not None else request.model,
                provider=info.provider if info is not None else None,
                started_at=started,
                ended_at=log.now(),
                text="".join(text),
                tool_calls=calls,
                usage=usage,
                finish_reason=info.finish_reason if info is not None else None,
                request_id=info.request_id if info is not None else None,
            )
        )
        log.record(ModelCallRecord(request, tuple(attempts)))


def recording(model: Model) -> Model:
    """``model`` wrapped in a `RecordingModel` (once: an already recording model is returned as it is)."""
    return model if isinstance(model, RecordingModel) else RecordingModel(model)
