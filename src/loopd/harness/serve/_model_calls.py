"""Each served session's model calls, for its caller's ledger: ``GET /v1/sessions/{id}/model-calls``.

The app wraps the rig's models in `RecordingModel` (`recording_rig`) and binds one `SessionModelCalls` per session
around starting, forking or restoring it (`loopd.harness.models.record_model_calls`), so the session's loop tasks
report every ``stream()`` call there: its request and its attempts (each provider failure, retry or fallback step,
then the reply or the final error). A caller (loop-server's remote adapter) pages through them by ``index`` and
stores them like the calls of its in-process harness.

- Each record carries ``after_seq``: the session's last journal seq when the call ended. The call's own
  `ModelCalled` event comes later, so a reader replaying the journal can tell the records of a call it sees from
  those of calls made after it.
- Everything leaves redacted (`loopd._infra.redaction.Redactor.value`: key shapes, bearer credentials, secret-named
  fields, the literal secrets the server was given, e.g. its model's API key): the reader stores it redacted again.
- Within one page an item's messages may continue the previous item's: ``extends`` = how many of the previous
  item's messages it starts with, and ``messages`` holds only the rest (a growing conversation does not resend its
  whole history per call). The first item of a page is always whole.
- Memory is bounded: ``MAX_RECORDS`` per session (the oldest dropped: a reader that fell that far behind misses
  them) and ``MAX_SESSIONS`` logs (least recently used dropped). Records are kept in memory only: a server restart
  loses them (the journal keeps the calls' usage).

Must not do: I/O, or block the harness (``record`` only appends).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, replace
from typing import Any, Final

from loopd._infra.clock import Clock
from loopd._infra.redaction import Redactor
from loopd.harness.actors import Rig, Session
from loopd.harness.core import Message
from loopd.harness.foreign import ForeignEngine
from loopd.harness.models import ModelAttemptRecord, ModelCallRecord, recording

MAX_RECORDS: Final = 256
"""Model calls kept per session (the oldest are dropped first)."""
MAX_SESSIONS: Final = 1024
"""Sessions whose model calls are kept (the least recently used session's log is dropped first)."""
MAX_PAGE: Final = 100


@dataclass(frozen=True, slots=True)
class _Entry:
    index: int
    after_seq: int
    call: ModelCallRecord


class SessionModelCalls:
    """One session's recorded model calls (a `loopd.harness.models.ModelCallLog`)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: deque[_Entry] = deque(maxlen=MAX_RECORDS)
        self._next = 1
        self.session: Session | None = None
        """The session reporting here (set once it exists): each record notes its last seq."""

    def now(self) -> float:
        return self._clock.time()

    def record(self, call: ModelCallRecord) -> None:
        after = self.session.last_seq if self.session is not None else 0
        self._entries.append(_Entry(self._next, after, call))
        self._next += 1

    def after(self, index: int, limit: int) -> tuple[list[_Entry], bool]:
        """Up to ``limit`` records whose index is above ``index``, oldest first, and whether more follow."""
        found = [entry for entry in self._entries if entry.index > index]
        return found[:limit], len(found) > limit


class ServedModelCalls:
    """The model-call logs of one app's sessions (bounded; see the module docstring)."""

    def __init__(self, clock: Clock, redactor: Redactor) -> None:
        self._clock = clock
        self._redactor = redactor
        self._logs: OrderedDict[str, SessionModelCalls] = OrderedDict()

    def log(self, session_id: str) -> SessionModelCalls:
        """The log of ``session_id`` (created on first use; a restored session keeps reporting to the same one)."""
        log = self._logs.get(session_id)
        if log is None:
            log = self._logs[session_id] = SessionModelCalls(self._clock)
            while len(self._logs) > MAX_SESSIONS:
                self._logs.popitem(last=False)
        self._logs.move_to_end(session_id)
        return log

    def page(self, session_id: str, after: int, limit: int) -> dict[str, Any]:
        """The wire page of ``session_id``'s records after index ``after`` (redacted)."""
        log = self._logs.get(session_id)
        entries, more = log.after(after, min(limit, MAX_PAGE)) if log is not None else ([], False)
        items: list[Any] = []
        previous: tuple[Message, ...] | None = None
        for entry in entries:
            messages = tuple(entry.call.request.messages)
            shared = _shared_prefix(previous, messages)
            items.append(self._redactor.value(_item(entry, messages, shared)))
            previous = messages
        return {"items": items, "next_after": entries[-1].index if entries else after, "has_more": more}


def _shared_prefix(previous: tuple[Message, ...] | None, messages: tuple[Message, ...]) -> int:
    if not previous or len(previous) > len(messages):
        return 0
    if all(a is b or a == b for a, b in zip(previous, messages[: len(previous)], strict=True)):
        return len(previous)
    return 0


def _item(entry: _Entry, messages: tuple[Message, ...], shared: int) -> dict[str, Any]:
    request = entry.call.request
    return {
        "index": entry.index,
        "after_seq": entry.after_seq,
        "request": {
            "model": request.model,
            "system": request.system,
            "temperature": request.temperature,
            "max_output_tokens": request.max_output_tokens,
            "tools": [tool.model_dump(mode="json") for tool in request.tools],
            "extends": shared,
            "messages": [m.model_dump(mode="json", exclude_none=True) for m in messages[shared:]],
        },
        "attempts": [_attempt(attempt) for attempt in entry.call.attempts],
    }


def _attempt(attempt: ModelAttemptRecord) -> dict[str, Any]:
    return {
        "model": attempt.model,
        "provider": attempt.provider,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "error_type": attempt.error_type,
        "message": attempt.message,
        "status_code": attempt.status_code,
        "retry_after": attempt.retry_after,
        "text": attempt.text,
        "tool_calls": [call.model_dump(mode="json") for call in attempt.tool_calls],
        "usage": attempt.usage.model_dump(mode="json") if attempt.usage is not None else None,
        "finish_reason": attempt.finish_reason,
        "request_id": attempt.request_id,
    }


def recording_rig(rig: Rig) -> Rig:
    """``rig`` whose loops' and agents' models report their calls to the context's log (`RecordingModel`)."""

    def wrap(definition: Any) -> Any:
        if isinstance(definition.model, ForeignEngine):  # a foreign CLI runs whole turns: no model calls to record
            return definition
        return replace(definition, model=recording(definition.model))

    return replace(rig, loops=[wrap(loop) for loop in rig.loops], agents=[wrap(agent) for agent in rig.agents])
