"""The live sessions of one server: created, restored on demand, viewed, and shut down with the server.

A session that is in the journal but not live here is *dormant*: reads (view, list, journal pages, the catch-up part
of an event stream) are served from the journal without touching it; a command (input, interrupt, gate answer,
cancel) restores it first (`Rig.restore_session`). A faulted session stays faulted until ``restore`` replaces it.
At the live-session cap the least recently used idle session is shut down (journaled, so it stays restorable) to
make room; when none is idle the answer is 429.

Must not do: HTTP parsing or framing; hold any state outside the instance (the app owns its registry).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Final, TypeVar

from loopd._infra.http_errors import ApiError
from loopd._infra.ids import new_id
from loopd._infra.tasks import TaskSet
from loopd.harness._errors import SessionClosedError, SessionNotFoundError
from loopd.harness.actors import RecoveryMode, Rig, Session
from loopd.harness.core.state import SessionState
from loopd.harness.journal import Record, replay
from loopd.harness.models import record_model_calls
from loopd.harness.serve._idempotency import IdempotencyStore, IdempotencyStoreError, KeyRecord
from loopd.harness.serve._model_calls import ServedModelCalls
from loopd.harness.serve._wire import CreateSessionRequest, ForkSessionRequest, SessionStatus
from loopd.harness.serve._workspaces import SessionWorkspaces

T = TypeVar("T")

_RECENT_INPUTS: Final = 1024
_SHUTDOWN_GRACE: Final = 5.0
_SNAPSHOT_WAIT: Final = 30.0


@dataclass(frozen=True, slots=True)
class SessionView:
    session_id: str
    state: SessionState
    status: SessionStatus
    live: bool
    created_at: float | None


@dataclass(frozen=True, slots=True)
class Created:
    session_id: str
    created: bool
    command_id: str | None


def fingerprint(body: CreateSessionRequest | ForkSessionRequest, *, parent: str | None = None) -> str:
    shown = body.model_dump(mode="json")
    if shown.get("workspace") == "keep":  # the default: keys stored before the field existed still match
        del shown["workspace"]
    if parent is not None:  # a fork's key covers what it forks (never equal to a creation's)
        shown = {"fork_of": parent, **shown}
    canonical = json.dumps(shown, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class ServedSessions:
    """Owns the live `Session` objects of one app; every mutation of the set happens under one lock."""

    def __init__(
        self,
        rig: Rig,
        keys: IdempotencyStore,
        *,
        max_live: int = 256,
        restore_mode: RecoveryMode = "interrupt",
        io_timeout: float = 30.0,
        model_calls: ServedModelCalls | None = None,
        workspaces: SessionWorkspaces | None = None,
    ) -> None:
        if max_live < 1:
            raise ValueError("max_live must be positive")
        self.rig = rig
        self._keys = keys
        self._max_live = max_live
        self._restore_mode: RecoveryMode = restore_mode
        self._io_timeout = io_timeout
        self.model_calls = model_calls
        """Each session's recorded model calls (None: not recorded); see `_model_calls`."""
        self.workspaces = workspaces
        """Each session's own directory (None: every session works in the rig's workspace); see `_workspaces`."""
        self._live: dict[str, Session] = {}
        self._recent_inputs: dict[str, OrderedDict[str, str]] = {}
        self._touched: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self.closing = asyncio.Event()

    # --- observation -------------------------------------------------------------------------------------------

    def live(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    @property
    def live_count(self) -> int:
        return len(self._live)

    def changed(self) -> asyncio.Event:
        """An event set at the next change of the live set (take it *before* looking at the set)."""
        return self._changed

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def io(self, awaitable: Awaitable[T]) -> T:
        """Await a journal call with the registry's I/O timeout."""
        try:
            async with asyncio.timeout(self._io_timeout):
                return await awaitable
        except TimeoutError as exc:
            raise ApiError("service_unavailable", "the journal did not answer in time") from exc

    async def exists(self, session_id: str) -> bool:
        return session_id in self._live or await self.io(self.rig.journal.session(session_id)) is not None

    async def view(self, session_id: str) -> SessionView:
        info = await self.io(self.rig.journal.session(session_id))
        session = self._live.get(session_id)
        if session is not None:
            status: SessionStatus = "faulted" if session.fault is not None else _live_status(session.status)
            return SessionView(session_id, session.state, status, True, info.created_at if info is not None else None)
        if info is None:
            raise ApiError("not_found", f"no session {session_id!r}")
        records = await self.io(self.rig.journal.read(session_id))
        state = replay(records)
        return SessionView(
            session_id, state, "stopped" if state.status == "stopped" else "dormant", False, info.created_at
        )

    async def status_of(self, session_id: str, last_seq: int) -> SessionStatus:
        session = self._live.get(session_id)
        if session is not None:
            return "faulted" if session.fault is not None else _live_status(session.status)
        last = await self.io(self.rig.journal.read(session_id, max(1, last_seq), 1))
        return "stopped" if last and last[-1].kind == "session_stopped" else "dormant"

    async def read(self, session_id: str, from_seq: int, limit: int) -> list[Record]:
        try:
            return await self.io(self.rig.journal.read(session_id, from_seq, limit))
        except SessionNotFoundError as exc:
            raise ApiError("not_found", f"no session {session_id!r}") from exc

    # --- creation and restore ----------------------------------------------------------------------------------

    async def create(self, body: CreateSessionRequest, *, key: str | None) -> Created:
        """Start a session (and submit its first input); with ``key``, the same key returns the same session."""
        if body.loop is not None and body.loop not in {d.name for d in self.rig.loops}:
            raise ApiError("invalid_request", f"this rig has no loop {body.loop!r}")
        async with self._lock:
            self._check_open()
            record: KeyRecord | None = None
            session_id = new_id()
            if key is not None:
                claimed = KeyRecord(key, fingerprint(body), session_id, None, self.rig.clock.time())
                try:
                    record = await self._keys.claim(claimed)
                except IdempotencyStoreError as exc:
                    raise ApiError("service_unavailable", str(exc)) from exc
                if record.fingerprint != claimed.fingerprint:
                    raise ApiError("conflict", "this Idempotency-Key was used with a different request body")
                session_id = record.session_id
                if await self.exists(session_id):
                    return Created(session_id, False, record.command_id)
            await self._make_room()
            rig = self.rig if self.workspaces is None else await self.workspaces.for_new(self.rig, session_id)
            session = await self._recorded(session_id, rig.start_session(session_id))
            self._live[session.id] = session
            self._touch(session.id)
            self._notify()
        command_id: str | None = None
        if body.input is not None:
            command_id = await self.submit(session, body.input, loop=body.loop)
            if key is not None:
                with contextlib.suppress(IdempotencyStoreError):
                    await self._keys.set_command(key, command_id)
        return Created(session.id, True, command_id)

    async def fork(self, parent_id: str, body: ForkSessionRequest, *, key: str | None) -> Created:
        """Fork ``parent_id`` at ``body.at_seq`` into a new live session (`Rig.fork_session`); with ``key``, the
        same key returns the same fork. The parent is not touched (it may be live, dormant or stopped).

        A fork that takes the parent's snapshot (``workspace`` other than ``keep``) of a parent live here first lets
        the snapshot that follows its last turn be journaled (bounded): a client that saw the turn end may fork
        "after it" at once and still find that snapshot."""
        parent = self._live.get(parent_id)
        if parent is not None and body.workspace != "keep":
            with contextlib.suppress(TimeoutError):  # not taken in time: the fork decides without it (and says so)
                await parent.workspace.checkpoints_taken(timeout=_SNAPSHOT_WAIT)
        async with self._lock:
            self._check_open()
            session_id = body.session_id or new_id()
            if key is not None:
                claimed = KeyRecord(key, fingerprint(body, parent=parent_id), session_id, None, self.rig.clock.time())
                try:
                    record = await self._keys.claim(claimed)
                except IdempotencyStoreError as exc:
                    raise ApiError("service_unavailable", str(exc)) from exc
                if record.fingerprint != claimed.fingerprint:
                    raise ApiError("conflict", "this Idempotency-Key was used with a different request body")
                session_id = record.session_id
                if await self.exists(session_id):
                    return Created(session_id, False, None)
            elif body.session_id is not None and await self.exists(body.session_id):
                raise ApiError("conflict", f"session {body.session_id!r} exists; fork under another id")
            await self._make_room()
            session = await self._forked(parent_id, body, session_id)
            self._live[session.id] = session
            self._touch(session.id)
            self._notify()
        return Created(session.id, True, None)

    async def _forked(self, parent_id: str, body: ForkSessionRequest, session_id: str) -> Session:
        """Make the fork on the rig of its workspace (`SessionWorkspaces.for_fork`; the shared one without)."""
        mode = body.workspace
        if self.workspaces is None:
            opening = self.rig.fork_session(parent_id, body.at_seq, session_id, workspace=mode)
            return await self._recorded(session_id, opening)
        if await self.io(self.rig.journal.session(parent_id)) is None:
            raise ApiError("not_found", f"no session {parent_id!r}")
        rig, undo = await self.workspaces.for_fork(self.rig, parent_id, session_id, mode)
        try:
            opening = rig.fork_session(parent_id, body.at_seq, session_id, workspace=mode)
            return await self._recorded(session_id, opening)
        except Exception:
            if await self.io(self.rig.journal.session(session_id)) is None:  # refused: no fork, no directory
                await asyncio.to_thread(undo)
            raise

    async def ensure_live(self, session_id: str) -> Session:
        """The live session, restored from the journal if it is dormant here."""
        session = self._live.get(session_id)
        if session is None:
            async with self._lock:
                session = self._live.get(session_id)
                if session is None:
                    self._check_open()
                    session = await self._restore(session_id)
        if session.fault is not None:
            raise session.fault
        if session.status != "active":
            raise SessionClosedError(f"session {session_id} is shutting down")
        self._touch(session_id)
        return session

    async def restore(self, session_id: str) -> tuple[Session, bool]:
        """Restore explicitly: a no-op for an active live session; replaces a faulted one."""
        async with self._lock:
            self._check_open()
            current = self._live.get(session_id)
            if current is not None and current.fault is None and current.status == "active":
                return current, False
            if current is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_SHUTDOWN_GRACE):
                        await current.shutdown(drain_timeout=0, reason="replaced by restore")
                self._forget(session_id)
            return await self._restore(session_id), True

    async def _restore(self, session_id: str) -> Session:
        if await self.io(self.rig.journal.session(session_id)) is None:
            raise ApiError("not_found", f"no session {session_id!r}")
        await self._make_room()
        rig = self.rig if self.workspaces is None else await self.workspaces.for_stored(self.rig, session_id)
        session = await self._recorded(session_id, rig.restore_session(session_id, mode=self._restore_mode))
        self._live[session_id] = session
        self._touch(session_id)
        self._notify()
        return session

    async def _recorded(self, session_id: str, opening: Awaitable[Session]) -> Session:
        """Await ``opening`` (a session starting, forking or restoring) with its model calls reported to its log: its
        loop tasks are created in this context and keep it."""
        if self.model_calls is None:
            return await opening
        log = self.model_calls.log(session_id)
        with record_model_calls(log):
            session = await opening
        log.session = session
        return session

    def _check_open(self) -> None:
        if self.closing.is_set():
            raise SessionClosedError("the server is shutting down")

    async def _make_room(self) -> None:
        """Below the cap, nothing; at it, shut the least recently used *idle* session down (it stays restorable:
        the next command restores it); with none idle, 429."""
        if len(self._live) < self._max_live:
            return
        idle = [s for s in self._live.values() if _is_idle(s)]
        if not idle:
            raise ApiError(
                "too_many_requests",
                f"this server holds {self._max_live} live sessions, its limit, and none of them is idle",
                headers={"Retry-After": "5"},
            )
        victim = min(idle, key=lambda s: self._touched.get(s.id, 0.0))
        self._forget(victim.id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SHUTDOWN_GRACE):
                await victim.shutdown(drain_timeout=0, reason="idle session unloaded to make room")

    def _touch(self, session_id: str) -> None:
        self._touched[session_id] = time.monotonic()

    def _forget(self, session_id: str) -> None:
        self._live.pop(session_id, None)
        self._touched.pop(session_id, None)
        self._recent_inputs.pop(session_id, None)
        self._notify()

    # --- commands ----------------------------------------------------------------------------------------------

    async def submit(self, session: Session, text: str, *, loop: str | None) -> str:
        name = loop or session.default_loop
        if name not in session.loops:
            raise ApiError("invalid_request", f"session {session.id} has no loop {name!r}")
        command_id = await session.submit(text, loop=name)
        recent = self._recent_inputs.setdefault(session.id, OrderedDict())
        recent[command_id] = name
        while len(recent) > _RECENT_INPUTS:
            recent.popitem(last=False)
        return command_id

    def submitted_loop(self, session_id: str, command_id: str) -> str | None:
        """The loop an input was sent to through this server (recent inputs only)."""
        recent = self._recent_inputs.get(session_id)
        return recent.get(command_id) if recent is not None else None

    # --- shutdown ----------------------------------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Refuse new work and end every event stream (the server then waits for requests to finish)."""
        self.closing.set()
        self._notify()

    async def aclose(self, *, timeout: float | None = None) -> None:
        """Refuse new work, then shut every live session down (draining running turns up to the rig's limit)."""
        self.begin_shutdown()
        sessions = list(self._live.values())
        limit = timeout if timeout is not None else self.rig.drain_timeout + _SHUTDOWN_GRACE
        # Every session shuts down at the same time, owned by one set; bounded: after `limit` the rest are
        # cancelled and aborted, and given `_SHUTDOWN_GRACE` to end (a TaskGroup's exit could not be bounded).
        shutting = TaskSet("served sessions shutdown")
        tasks = [shutting.start(_shut_down(s), name=f"shutdown:{s.id}") for s in sessions]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=limit)
            for session, task in zip(sessions, tasks, strict=True):
                if task in pending:
                    task.cancel()
                    session.abort()
        await shutting.aclose(timeout=_SHUTDOWN_GRACE)
        self._live.clear()
        self._touched.clear()
        self._recent_inputs.clear()


async def _shut_down(session: Session) -> None:
    with contextlib.suppress(Exception):  # a faulted session has nothing more to write; its error is in the journal
        await session.shutdown(reason="server shutdown")


def _is_idle(session: Session) -> bool:
    """Nothing to lose by unloading it: every loop quiescent (no turn, nothing queued or in its mailbox, no effect
    running), nobody watching, not faulted."""
    if session.fault is not None or session.status != "active":
        return False
    return session.statistics().subscribers == 0 and all(actor.quiescent for actor in session.actors.values())


def _live_status(status: str) -> SessionStatus:
    return "active" if status == "active" else "stopped"
