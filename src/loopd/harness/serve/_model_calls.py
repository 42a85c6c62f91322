"""Each served session's model calls, for its caller's ledger: ``GET /v1/sessions/{id}/model-calls``.

The app wraps the rig's models in `RecordingModel` (`recording_rig`) and binds one `SessionModelCalls` per session
around starting, forking or restoring it (`loopd.harness.models.record_model_calls`), so the session's loop tasks
report every ``stream()`` call there: its request and its attempts (each provider failure, retry or fallback step,
then the reply or the final error). A caller (loop-server's remote adapter) pages through them by ``index`` and
stores them like the calls of its in-process harness.

- Each record carries ``after_seq``: the session's last journal seq when the call ended. The call's own
  `ModelCalled` event comes later, so a reader replaying the journal can tell the records of a call it sees from
  those of calls made after it.
- Redacted when recorded, before anything is kept (`loopd._infra.redaction.Redactor.value`: key shapes, bearer
  credentials, secret-named fields, the literal secrets the server was given, e.g. its model's API key): the
  reader stores it redacted again.
- Within one page an item's messages may continue the previous item's: ``extends`` = how many of the previous
  item's messages it starts with, and ``messages`` holds only the rest (a growing conversation does not resend its
  whole history per call). The first item of a page is always whole.
- Kept in a `ModelCallStore`: `SqliteModelCallStore` (``loopd harness serve``: ``<data dir>/serve-model-calls.db``
  beside the journal, so a reader that comes back after the server restarted still finds the calls made before)
  or `MemoryModelCallStore` (an app given no file: they die with the process). Bounded either way:
  ``MAX_RECORDS`` per session (the oldest dropped: a reader that fell that far behind misses them) and
  ``MAX_SESSIONS`` sessions (the least recently written dropped). The file stores each record as the messages it
  adds to the session's previous record (the oldest kept record of a session is always whole).
- ``record`` runs in the session's own task and does no I/O: it redacts the call and queues it (at most
  ``MAX_PENDING`` across sessions; beyond that the oldest queued is dropped). `ServedModelCalls.run` (the app's
  lifespan runs it) writes the queue as it fills; a page read writes it first, and `aclose` writes what is left.
  A crash (not a shutdown) can lose the calls of its last moments: those queued but not yet written.

Must not do: block the harness (``record`` only queues).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Protocol

from loopd._infra.clock import Clock
from loopd._infra.database import Connection
from loopd._infra.migrations import Migration, Schema
from loopd._infra.redaction import Redactor
from loopd.harness._errors import HarnessError
from loopd.harness.actors import Rig, Session
from loopd.harness.core import Message
from loopd.harness.foreign import ForeignEngine
from loopd.harness.models import ModelAttemptRecord, ModelCallRecord, recording
from loopd.harness.serve._sqlite_file import PrivateSqliteFile

_log = logging.getLogger(__name__)

MODEL_CALLS_FILE: Final = "serve-model-calls.db"
"""The file in ``loopd harness serve``'s data directory that keeps the sessions' model calls across restarts."""
MAX_RECORDS: Final = 256
"""Model calls kept per session (the oldest are dropped first)."""
MAX_SESSIONS: Final = 1024
"""Sessions whose model calls are kept (the least recently written session's calls are dropped first)."""
MAX_PAGE: Final = 100
MAX_PENDING: Final = 4096
"""Recorded calls waiting to be written, across sessions (the oldest dropped beyond)."""
_TIMEOUT: Final = 10.0
_RETRY_AFTER: Final = 1.0


class ModelCallStoreError(HarnessError):
    """The model-call store could not be read or written."""


@dataclass(frozen=True, slots=True)
class StoredCall:
    """One kept model call: its ``index`` in the session, ``after_seq``, its redacted wire ``body`` (``request``
    without its messages, ``attempts``) and its request's whole ``messages`` (redacted)."""

    index: int
    after_seq: int
    body: dict[str, Any]
    messages: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A recorded call on its way to the store. ``serial`` is unique in the app; ``base`` is the serial of the
    session's call before it (0: none), whose messages this call's first ``extends`` are."""

    session_id: str
    serial: int
    base: int
    extends: int
    after_seq: int
    body: dict[str, Any]
    messages: tuple[Any, ...]


class ModelCallStore(Protocol):
    """Where the recorded calls are kept (see the module docstring)."""

    async def append(self, calls: Sequence[PendingCall]) -> None:
        """Keep ``calls`` (in order; each gets the next index of its session), then apply the bounds."""
        ...

    async def calls(self, session_id: str) -> list[StoredCall]:
        """The session's kept calls, oldest first."""
        ...

    async def aclose(self) -> None: ...


class MemoryModelCallStore:
    """The calls in this process's memory (an app given no file)."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, tuple[int, deque[StoredCall]]] = OrderedDict()

    async def append(self, calls: Sequence[PendingCall]) -> None:
        for call in calls:
            entry = self._sessions.pop(call.session_id, None)
            last, kept = entry if entry is not None else (0, deque(maxlen=MAX_RECORDS))
            kept.append(StoredCall(last + 1, call.after_seq, call.body, call.messages))
            self._sessions[call.session_id] = (last + 1, kept)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)

    async def calls(self, session_id: str) -> list[StoredCall]:
        entry = self._sessions.get(session_id)
        return list(entry[1]) if entry is not None else []

    async def aclose(self) -> None:
        self._sessions.clear()


_SCHEMA = Schema(
    "model_calls",
    (
        Migration(
            1,
            "served model calls",
            (
                """CREATE TABLE model_calls (
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    after_seq INTEGER NOT NULL,
    extends INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
)""",
                """CREATE TABLE model_call_sessions (
    session_id TEXT PRIMARY KEY,
    touched INTEGER NOT NULL
)""",
                "CREATE INDEX model_call_sessions_touched ON model_call_sessions (touched)",
            ),
        ),
    ),
)


def _fold(rows: Sequence[tuple[Any, ...]]) -> list[StoredCall]:
    """Stored rows ``(idx, after_seq, extends, body)`` (oldest first) as whole calls: each row's messages are the
    first ``extends`` of the row before it, then its own."""
    out: list[StoredCall] = []
    previous: tuple[Any, ...] = ()
    for index, after_seq, extends, text in rows:
        body = json.loads(text)
        added = tuple(body["request"].pop("messages", ()))
        messages = previous[: int(extends)] + added
        out.append(StoredCall(int(index), int(after_seq), body, messages))
        previous = messages
    return out


def _row_body(body: dict[str, Any], messages: Sequence[Any]) -> str:
    return json.dumps({**body, "request": {**body["request"], "messages": list(messages)}}, separators=(",", ":"))


class SqliteModelCallStore:
    """The calls in a SQLite file (WAL, 0600 in a 0700 directory when it makes the directory) through the floor's
    SQLite database: one connection on its own thread, opened (and migrated) by the first call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = PrivateSqliteFile(
            path,
            _SCHEMA,
            error=lambda message: ModelCallStoreError(f"model calls in {path}: {message}"),
            thread_name="loopd-model-calls",
            label=f"the model-call store {path}",
            timeout=_TIMEOUT,
        )
        self._written: dict[str, int] = {}
        """Per session, the serial of the last call written in this process (a later call may extend it)."""

    async def append(self, calls: Sequence[PendingCall]) -> None:
        if not calls:
            return
        db = await self._file.database()
        written = dict(self._written)
        async with db.transaction(read_only=False) as conn:
            last: dict[str, int] = {}
            for call in calls:
                sid = call.session_id
                if sid not in last:
                    rows = await conn.fetch("SELECT MAX(idx) FROM model_calls WHERE session_id = ?", (sid,))
                    last[sid] = int(rows[0][0] or 0)
                # Only the messages past the previous call's when that call is the row before this one.
                delta = call.base != 0 and written.get(sid) == call.base and last[sid] > 0
                extends = call.extends if delta else 0
                last[sid] += 1
                await conn.execute(
                    "INSERT INTO model_calls (session_id, idx, after_seq, extends, body) VALUES (?, ?, ?, ?, ?)",
                    (sid, last[sid], call.after_seq, extends, _row_body(call.body, call.messages[extends:])),
                )
                written[sid] = call.serial
            rows = await conn.fetch("SELECT COALESCE(MAX(touched), 0) FROM model_call_sessions")
            touched = int(rows[0][0])
            for sid in last:
                touched += 1
                await conn.execute(
                    "INSERT INTO model_call_sessions (session_id, touched) VALUES (?, ?) "
                    "ON CONFLICT (session_id) DO UPDATE SET touched = excluded.touched",
                    (sid, touched),
                )
                await self._keep_last(conn, sid, last[sid])
            stale = await conn.fetch(
                "SELECT session_id FROM model_call_sessions ORDER BY touched DESC LIMIT -1 OFFSET ?", (MAX_SESSIONS,)
            )
            for (sid,) in stale:
                await conn.execute("DELETE FROM model_calls WHERE session_id = ?", (sid,))
                await conn.execute("DELETE FROM model_call_sessions WHERE session_id = ?", (sid,))
                written.pop(sid, None)
        self._written = written

    @staticmethod
    async def _keep_last(conn: Connection, session_id: str, last: int) -> None:
        """Drop the session's calls before its last ``MAX_RECORDS``; the oldest kept one is rewritten whole."""
        first_kept = last - MAX_RECORDS + 1
        if first_kept <= 1:
            return
        rows = await conn.fetch(
            "SELECT idx, after_seq, extends, body FROM model_calls WHERE session_id = ? AND idx <= ? ORDER BY idx",
            (session_id, first_kept),
        )
        if len(rows) < 2:
            return
        head = _fold(rows)[-1]
        await conn.execute(
            "UPDATE model_calls SET extends = 0, body = ? WHERE session_id = ? AND idx = ?",
            (_row_body(head.body, head.messages), session_id, head.index),
        )
        await conn.execute("DELETE FROM model_calls WHERE session_id = ? AND idx < ?", (session_id, first_kept))

    async def calls(self, session_id: str) -> list[StoredCall]:
        db = await self._file.database()
        async with db.transaction(read_only=True) as conn:
            rows = await conn.fetch(
                "SELECT idx, after_seq, extends, body FROM model_calls WHERE session_id = ? ORDER BY idx",
                (session_id,),
            )
        return _fold(rows)

    async def aclose(self) -> None:
        await self._file.aclose()


class SessionModelCalls:
    """One session's call recorder (a `loopd.harness.models.ModelCallLog`): redacts each call and queues it."""

    def __init__(self, served: ServedModelCalls, session_id: str) -> None:
        self._served = served
        self._session_id = session_id
        self._previous: tuple[tuple[Message, ...], tuple[Any, ...], int] | None = None
        """The last call's messages, as recorded and redacted, and its serial."""
        self.session: Session | None = None
        """The session reporting here (set once it exists): each record notes its last seq."""

    def now(self) -> float:
        return self._served.clock.time()

    def record(self, call: ModelCallRecord) -> None:
        try:
            after = self.session.last_seq if self.session is not None else 0
            messages = tuple(call.request.messages)
            shared, base, kept = 0, 0, ()
            if self._previous is not None:
                shared = _shared_prefix(self._previous[0], messages)
                base, kept = self._previous[2], self._previous[1][:shared]
            redact = self._served.redactor.value
            added = tuple(redact([m.model_dump(mode="json", exclude_none=True) for m in messages[shared:]]))
            serial = self._served.next_serial()
            whole = kept + added
            pending = PendingCall(self._session_id, serial, base, shared, after, redact(_body(call)), whole)
            self._previous = (messages, whole, serial)
            self._served.queue(pending)
        except Exception:  # a recorder must not fail the model call it watches
            _log.exception("could not record a model call of session %s", self._session_id)


class ServedModelCalls:
    """The model-call records of one app's sessions (see the module docstring)."""

    def __init__(self, clock: Clock, redactor: Redactor, store: ModelCallStore | None = None) -> None:
        self.clock = clock
        self.redactor = redactor
        self._store: ModelCallStore = store if store is not None else MemoryModelCallStore()
        self._logs: OrderedDict[str, SessionModelCalls] = OrderedDict()
        self._pending: deque[PendingCall] = deque()
        self._serial = 0
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()
        self.dropped = 0
        """Recorded calls dropped unwritten (the queue was full)."""

    def log(self, session_id: str) -> SessionModelCalls:
        """The recorder of ``session_id`` (created on first use; a restored session keeps reporting to the same
        one while it is among the ``MAX_SESSIONS`` most recently used)."""
        log = self._logs.get(session_id)
        if log is None:
            log = self._logs[session_id] = SessionModelCalls(self, session_id)
            while len(self._logs) > MAX_SESSIONS:
                self._logs.popitem(last=False)
        self._logs.move_to_end(session_id)
        return log

    def next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def queue(self, call: PendingCall) -> None:
        """Queue a recorded call for the store (the oldest queued is dropped past ``MAX_PENDING``)."""
        self._pending.append(call)
        while len(self._pending) > MAX_PENDING:
            self._pending.popleft()
            self.dropped += 1
        self._wake.set()

    async def flush(self) -> None:
        """Write every queued call (`ModelCallStoreError` when the store fails: they stay queued)."""
        async with self._writing:
            calls = list(self._pending)
            self._pending.clear()
            try:
                await self._store.append(calls)
            except BaseException:
                self._pending.extendleft(reversed(calls))
                while len(self._pending) > MAX_PENDING:
                    self._pending.popleft()
                    self.dropped += 1
                raise

    async def run(self) -> None:
        """Write queued calls as they come, until cancelled; a failed write is logged and tried again shortly."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except ModelCallStoreError as exc:
                _log.warning("could not keep model-call records: %s", exc)
                await asyncio.sleep(_RETRY_AFTER)
                self._wake.set()

    async def page(self, session_id: str, after: int, limit: int) -> dict[str, Any]:
        """The wire page of ``session_id``'s records after index ``after`` (queued ones written first)."""
        await self.flush()
        kept = [call for call in await self._store.calls(session_id) if call.index > after]
        calls, more = kept[: min(limit, MAX_PAGE)], len(kept) > min(limit, MAX_PAGE)
        items: list[Any] = []
        previous: tuple[Any, ...] | None = None
        for call in calls:
            shared = _shared_prefix(previous, call.messages)
            request = {**call.body["request"], "extends": shared, "messages": list(call.messages[shared:])}
            items.append({"index": call.index, "after_seq": call.after_seq, **call.body, "request": request})
            previous = call.messages
        return {"items": items, "next_after": calls[-1].index if calls else after, "has_more": more}

    async def aclose(self) -> None:
        """Write what is queued (a failure is logged), then close the store."""
        try:
            await self.flush()
        except ModelCallStoreError as exc:
            _log.warning("model-call records of the last moments were not kept: %s", exc)
        finally:
            await self._store.aclose()


def _shared_prefix(previous: Sequence[Any] | None, messages: Sequence[Any]) -> int:
    if not previous or len(previous) > len(messages):
        return 0
    if all(a is b or a == b for a, b in zip(previous, messages[: len(previous)], strict=True)):
        return len(previous)
    return 0


def _body(call: ModelCallRecord) -> dict[str, Any]:
    request = call.request
    return {
        "request": {
            "model": request.model,
            "system": request.system,
            "temperature": request.temperature,
            "max_output_tokens": request.max_output_tokens,
            "tools": [tool.model_dump(mode="json") for tool in request.tools],
        },
        "attempts": [_attempt(attempt) for attempt in call.attempts],
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
