"""`SessionLog`: a session's durable, ordered log — its journal writer, the hub its events are published on, and
the commit lock under which journal seq order == apply order == publish order.

A commit appends the events, then runs the caller's ``apply`` with their seqs, all under the lock, so nothing
commits between an append and its application. A failed append faults the log (fail-closed): the session hears
of it once (``on_fault``), the hub ends every subscription with the `SessionFaultError`, and every later commit
raises it.

Seen only once stored: on a journal that `defers_sync` (SQLite at ``synchronous=FULL``), a commit made with
``wait=False`` — the loop's steps whose next effects are safe to run again (a model call, read-only tools) — returns
once its records are committed, before their fdatasync, so those effects start while the disk works; the log's
syncer task then calls the writer's ``sync``. Until that sync covers a record, nothing outside the session sees it:
its envelope, and every envelope published after it (ephemeral ones too, so the order holds), waits in
``_unseen`` (bounded: `MAX_UNSEEN`), and subscriptions catch up only to the last synced seq. A power loss can take
back only records nobody saw and no unrepeatable effect followed. Any other commit (``wait=True``, the default) is
synced before it returns, which also makes every earlier record durable. A failed sync faults the log like a failed
append. Must not do: run loops or decide anything (the session's actors do); it stores and publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Sequence

from loopd._infra.clock import Clock
from loopd._infra.tasks import cancel_and_wait
from loopd.harness._errors import SessionFaultError
from loopd.harness.actors._hub import DEFAULT_QUEUE, Envelope, Hub, Subscription
from loopd.harness.core import codec
from loopd.harness.core.events import EphemeralEvent, Lifecycle, LoopEvent, SessionEvent
from loopd.harness.journal import Journal, JournalWriter, NewRecord, StateSnapshots

Committed = SessionEvent | LoopEvent

SYNC_WINDOW = 0.005
"""Seconds the log's syncer lets lazy commits gather before it syncs them, so one fdatasync covers the steps of a
fast loop (each waits at most this long, plus the sync, to be seen; with a real model a step takes far longer)."""
MAX_UNSEEN = 1024
"""Envelopes that may wait for a sync (see the module docstring). Past it, a commit syncs before it returns, and
ephemeral events published meanwhile are dropped (counted in ``unseen_dropped``), as a full subscription drops them."""


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
        self._defers = writer.defers_sync
        self._seen_seq = self._last_seq  # the last seq on the disk and handed to the hub
        self._unseen: deque[Envelope] = deque()
        self._sync_wanted = asyncio.Event()
        self._syncer: asyncio.Task[None] | None = None
        self.unseen_dropped = 0
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
            committed=self._seen_seq,
        )

    def publish(self, seq: int | None, event: SessionEvent | LoopEvent | EphemeralEvent) -> None:
        """Hand a committed (``seq``) or ephemeral (None) event to the subscribers — once every record up to it is
        on the disk (see the module docstring)."""
        envelope = Envelope(self.session_id, seq, event)
        if self._unseen or (seq is not None and seq > self._seen_seq):
            if seq is None and len(self._unseen) >= MAX_UNSEEN:
                self.unseen_dropped += 1
                return
            self._unseen.append(envelope)
            return
        self._hub.publish(envelope)

    @property
    def synced_seq(self) -> int:
        """The last seq known to be on the disk, and so visible to subscribers (`last_seq` unless a commit made
        with ``wait=False`` still waits for its sync)."""
        return self._seen_seq

    async def commit(
        self, events: Sequence[Committed], apply: Callable[[list[int]], None], *, wait: bool = True
    ) -> list[int]:
        """Journal ``events``, then ``apply(seqs)``, under the commit lock; their seqs. Raises the fault once the
        log is faulted (this append failing faults it). Events `hold` kept go first, in the same append.
        ``wait=False``: return before the records are synced, when the journal `defers_sync` (the module
        docstring says what then waits for the sync instead)."""
        async with self._lock:
            if self._fault is not None:
                raise self._fault
            held, self._held = self._held, None
            opening, apply_opening = held if held is not None else ((), None)
            written = [*opening, *events] if opening else events
            if not written:
                return []  # a `flush` whose opening a commit took meanwhile
            lazy = not wait and self._defers and len(self._unseen) < MAX_UNSEEN
            seqs = await self._append(written, sync=not lazy)
            self._last_seq = seqs[-1]
            if not lazy:
                self._seen(seqs[-1])  # synced: so is every record before it
            if apply_opening is not None:
                apply_opening(seqs[: len(opening)])
            own = seqs[len(opening) :]
            if events:
                apply(own)
            if self.snapshots is not None:
                self.snapshots.committed(seqs, written)  # at most starts a task: the snapshot is written aside
            if lazy:
                self._want_sync()
            return own

    def _seen(self, seq: int) -> None:
        """Records up to ``seq`` are on the disk: hand the envelopes that waited for them to the hub, in order."""
        if seq <= self._seen_seq:
            return
        self._seen_seq = seq
        unseen = self._unseen
        while unseen and (unseen[0].seq is None or unseen[0].seq <= seq):
            self._hub.publish(unseen.popleft())

    def _want_sync(self) -> None:
        if self._syncer is None:
            self._syncer = asyncio.get_running_loop().create_task(
                self._sync_loop(), name=f"loopd-session-sync-{self.session_id}"
            )
        self._sync_wanted.set()

    async def _sync_loop(self) -> None:
        """The log's syncer (owned: `close` cancels it, `aclose` awaits it): syncs what lazy commits left, one sync
        for as many commits as came meanwhile."""
        while True:
            await self._sync_wanted.wait()
            await asyncio.sleep(SYNC_WINDOW)  # real time: a batching window, as the journal's own rounds are
            self._sync_wanted.clear()
            target = self._last_seq
            if target <= self._seen_seq or self._fault is not None:
                continue
            try:
                await self._writer.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fail(exc, "journal sync failed")
                return
            self._seen(target)

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
        if self._syncer is not None:
            self._syncer.cancel()  # (`aclose` awaits it; a bare `close` leaves it to end at its next step)
        self._unseen.clear()  # never synced: nobody may see them
        self._hub.close(self._fault)

    async def aclose(self) -> None:
        """Commit an opening `hold` still keeps, let a state snapshot being saved finish, then `close`, and close the
        writer (a failure to close it is ignored: the log is done either way)."""
        if self._held is not None and self._fault is None:
            with contextlib.suppress(Exception):  # an opening nothing followed: stored now (a failure faults the log)
                await self.flush()
        if self._last_seq > self._seen_seq and self._fault is None:
            target = self._last_seq
            try:  # the last lazy commits: synced, then seen, before the subscriptions end
                await self._writer.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fail(exc, "journal sync failed")
            else:
                self._seen(target)
        if self._syncer is not None:
            await cancel_and_wait(self._syncer)
            self._syncer = None
        if self.snapshots is not None:
            await self.snapshots.aclose()
        with contextlib.suppress(Exception):
            await self._writer.aclose()
        self.close()

    async def _append(self, events: Sequence[Committed], *, sync: bool = True) -> list[int]:
        records = [NewRecord(*codec.encode(e), at=self._clock.time()) for e in events]
        began = self._clock.monotonic()
        try:
            seqs = await self._writer.append(records, sync=sync)
            if self._on_commit is not None:
                self._on_commit(self._clock.monotonic() - began)
            return seqs
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            fault = self._fail(exc)
            raise fault from exc

    def _fail(self, exc: BaseException, what: str = "journal append failed") -> SessionFaultError:
        if self._fault is None:
            self._fault = SessionFaultError(self.session_id, f"{what}: {exc}")
            self._on_fault(self._fault)
            self._hub.close(self._fault)
        return self._fault

    async def _read_envelopes(self, from_seq: int, limit: int) -> list[Envelope]:
        records = await self._journal.read(self.session_id, from_seq, limit)
        return [Envelope(self.session_id, r.seq, codec.decode(r.kind, r.version, r.data)) for r in records]
