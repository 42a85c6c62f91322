"""`SessionLog`: a session's durable, ordered log — its journal writer, the hub its events are published on, and
the commit lock under which journal seq order == apply order == publish order.

A commit appends the events, then runs the caller's ``apply`` with their seqs, all under the lock, so nothing
commits between an append and its application. A failed append faults the log (fail-closed): the session hears
of it once (``on_fault``), the hub ends every subscription with the `SessionFaultError`, and every later commit
raises it. Must not do: run loops or decide anything (the session's actors do); it stores and publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Sequence

from loopd._infra.clock import Clock
from loopd.harness._errors import SessionFaultError
from loopd.harness.actors._hub import DEFAULT_QUEUE, Envelope, Hub, Subscription
from loopd.harness.core import codec
from loopd.harness.core.events import EphemeralEvent, Lifecycle, LoopEvent, SessionEvent
from loopd.harness.journal import Journal, JournalWriter, NewRecord, StateSnapshots

Committed = SessionEvent | LoopEvent


class SessionLog:
    """The journal writer, hub and commit lock of one session (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        journal: Journal,
        writer: JournalWriter,
        *,
        clock: Clock,
        on_fault: Callable[[SessionFaultError], None],
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self._journal = journal
        self._writer = writer
        self._clock = clock
        self._on_commit = on_commit
        self._on_fault = on_fault
        self._hub = Hub(session_id, self._read_envelopes)
        self._lock = asyncio.Lock()
        self._last_seq = writer.last_seq
        self._fault: SessionFaultError | None = None
        self._held: tuple[tuple[Committed, ...], Callable[[list[int]], None]] | None = None
        self.snapshots: StateSnapshots | None = None
        """The session's state snapshot writer (None: the rig takes none), told of every applied commit."""

    @property
    def writer(self) -> JournalWriter:
        """The session's one journal writer (fenced when another process restores the session)."""
        return self._writer

    @property
    def last_seq(self) -> int:
        """The seq of the last committed event."""
        return self._last_seq

    @property
    def fault(self) -> SessionFaultError | None:
        """Why the log stopped taking commits (an append failed), or None."""
        return self._fault

    @property
    def hub(self) -> Hub:
        """Where committed and ephemeral events go out (its counters feed the session's statistics)."""
        return self._hub

    def subscribe(
        self,
        *,
        from_seq: int | None = None,
        lifecycles: Collection[Lifecycle] | None = None,
        loops: Collection[str] | None = None,
        kinds: Collection[str] | None = None,
        maxsize: int = DEFAULT_QUEUE,
    ) -> Subscription:
        """Live events, or from a journal seq (gap-free catch-up, then live)."""
        return self._hub.subscribe(
            from_seq=from_seq,
            lifecycles=lifecycles,
            loops=loops,
            kinds=kinds,
            maxsize=maxsize,
            committed=self._last_seq,
        )

    def publish(self, seq: int | None, event: SessionEvent | LoopEvent | EphemeralEvent) -> None:
        """Hand a committed (``seq``) or ephemeral (None) event to the subscribers."""
        self._hub.publish(Envelope(self.session_id, seq, event))

    async def commit(self, events: Sequence[Committed], apply: Callable[[list[int]], None]) -> list[int]:
        """Journal ``events``, then ``apply(seqs)``, under the commit lock; their seqs. Raises the fault once the
        log is faulted (this append failing faults it). Events `hold` kept go first, in the same append."""
        async with self._lock:
            if self._fault is not None:
                raise self._fault
            held, self._held = self._held, None
            opening, apply_opening = held if held is not None else ((), None)
            written = [*opening, *events] if opening else events
            if not written:
                return []  # a `flush` whose opening a commit took meanwhile
            seqs = await self._append(written)
            self._last_seq = seqs[-1]
            if apply_opening is not None:
                apply_opening(seqs[: len(opening)])
            own = seqs[len(opening) :]
            if events:
                apply(own)
            if self.snapshots is not None:
                self.snapshots.committed(seqs, written)  # at most starts a task: the snapshot is written aside
            return own

    def hold(self, events: Sequence[Committed], apply: Callable[[list[int]], None]) -> None:
        """Keep ``events`` (a session's opening) to be journaled first in the next `commit`, with ``apply`` run for
        their seqs before that commit's own: one append instead of two when the opening is followed at once by a
        first input. Nothing is stored or published until then (`flush` commits them alone)."""
        if self._held is not None:
            raise RuntimeError(f"session {self.session_id} already holds its opening")
        self._held = (tuple(events), apply)

    async def flush(self) -> None:
        """Commit what `hold` kept, alone, unless a commit took it already."""
        if self._held is not None:
            await self.commit((), lambda _seqs: None)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold the commit lock for the block: nothing commits meanwhile (a consistent view of live and durable
        state, for checks). Must not commit inside the block (it would wait for itself)."""
        async with self._lock:
            yield

    def close(self) -> None:
        """End every subscription (with the fault, if any) and cancel a state snapshot being saved; the writer stays
        as it is."""
        if self.snapshots is not None:
            self.snapshots.abort()
        self._hub.close(self._fault)

    async def aclose(self) -> None:
        """Commit an opening `hold` still keeps, let a state snapshot being saved finish, then `close`, and close the
        writer (a failure to close it is ignored: the log is done either way)."""
        if self._held is not None and self._fault is None:
            with contextlib.suppress(Exception):  # an opening nothing followed: stored now (a failure faults the log)
                await self.flush()
        if self.snapshots is not None:
            await self.snapshots.aclose()
        with contextlib.suppress(Exception):
            await self._writer.aclose()
        self.close()

    async def _append(self, events: Sequence[Committed]) -> list[int]:
        records = [NewRecord(*codec.encode(e), at=self._clock.time()) for e in events]
        began = self._clock.monotonic()
        try:
            seqs = await self._writer.append(records)
            if self._on_commit is not None:
                self._on_commit(self._clock.monotonic() - began)
            return seqs
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            fault = self._fail(exc)
            raise fault from exc

    def _fail(self, exc: BaseException) -> SessionFaultError:
        if self._fault is None:
            self._fault = SessionFaultError(self.session_id, f"journal append failed: {exc}")
            self._on_fault(self._fault)
            self._hub.close(self._fault)
        return self._fault

    async def _read_envelopes(self, from_seq: int, limit: int) -> list[Envelope]:
        records = await self._journal.read(self.session_id, from_seq, limit)
        return [Envelope(self.session_id, r.seq, codec.decode(r.kind, r.version, r.data)) for r in records]
