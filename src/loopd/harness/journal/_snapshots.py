"""State snapshots over a journal: restore from the newest one plus the records after it; write them while a
session runs, off its commit path.

Owns: `restore_state` (what restore folds), `snapshot_due` (when a live session writes the next snapshot) and
`StateSnapshots` (the one background writer of a session's snapshots). The journal stays the source of truth: a
snapshot only saves folding the records it covers (`loopd.harness.core.snapshot` says what it holds and when it
is stale), and one that is missing, of another schema or unreadable is ignored — restore then folds the whole
journal, and the session writes a new snapshot once it is due. Must not do: decide or apply events (the pure
core does), or run on a session's commit path (a snapshot is written by a task of its own; a large one is encoded in a
thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from loopd._infra.clock import Clock
from loopd.harness._errors import SessionNotFoundError
from loopd.harness.core.apply import apply
from loopd.harness.core.events import LoopEvent, Scope, SessionEvent
from loopd.harness.core.snapshot import SnapshotDecodeError, StateEncoder, decode_state, state_schema
from loopd.harness.core.state import SessionState
from loopd.harness.journal._protocol import Journal, Record
from loopd.harness.journal._replay import replay

__all__ = ["DEFAULT_SNAPSHOT_EVERY", "RestoredState", "StateSnapshots", "restore_state", "snapshot_due"]

_log = logging.getLogger(__name__)

DEFAULT_SNAPSHOT_EVERY = 500
"""Records committed after a session's newest snapshot before it writes the next one (at least)."""
_GROWTH = 16  # ... and at least 1/16 of the records the newest one covers (see `snapshot_due`)
INLINE_ENCODE_MESSAGES = 1000
"""A snapshot that turns at most this many new messages into MessagePack (well under a millisecond) is encoded on
the event loop; a larger one in a worker thread. Handing a small one to a thread costs the session more than the
encode: its steps then wait for the interpreter lock while the thread holds it."""
_SAVE_TIMEOUT = 30.0
RESTORE_FOLD_SNAPSHOT = 100
"""A session brought up by folding at least this many records after its snapshot (or without one) saves a snapshot
at its first commit, however few records are new since: a session that is restored again and again — each fork of a
conversation's chain of sessions restores the state its parent ended in — would otherwise fold the same tail each
time, up to `snapshot_due`'s spacing."""


def snapshot_due(snapshot_seq: int, seq: int, every: int = DEFAULT_SNAPSHOT_EVERY) -> bool:
    """Whether a session whose newest snapshot covers records ``1..snapshot_seq`` (0: none) writes one at ``seq``.

    Once ``max(every, snapshot_seq / 16)`` records were committed since: a restore then folds at most that many, and
    since each snapshot holds the whole state (growing with the history), spacing them in proportion keeps their
    total cost over a session's life linear in its length rather than quadratic.
    """
    return seq - snapshot_seq >= max(every, snapshot_seq // _GROWTH)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a snapshot decodes or records fold (no await inside): both build
    many objects that all stay alive, so the collections they would trigger find nothing to free, and each scans a
    heap that keeps growing (with 10k events about 15% of a restore). The collector's previous setting is put back
    on exit."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True, slots=True)
class RestoredState:
    """What `restore_state` rebuilt: the state, the records it folded onto the snapshot (all of them without
    one), the seq the snapshot covered (0: none used) and why a stored snapshot was ignored (None: it was not)."""

    state: SessionState
    records: list[Record]
    snapshot_seq: int
    ignored: str | None = None


async def restore_state(
    journal: Journal, session_id: str, *, snapshots: bool = True, upto: int | None = None
) -> RestoredState:
    """The state of ``session_id``: its newest usable snapshot (when ``snapshots``) with the records after it
    folded on, else the fold of its whole journal. Equal either way (a property test checks it). ``upto``: the
    state after that seq instead of the last one (a snapshot taken after it is not used; a fork point, say).

    Raises `SessionNotFoundError` for a session without records and `JournalCorruptError` for records that do not
    replay. A snapshot that does not decode, or that does not hold the seq it is stored under, is ignored.
    """
    stored = await journal.load_snapshot(session_id, state_schema(), upto=upto) if snapshots else None
    base: SessionState | None = None
    ignored: str | None = None
    if stored is not None:
        try:
            with collector_paused():
                base = decode_state(stored.data)
            if base.last_seq != stored.seq:
                raise SnapshotDecodeError(f"it holds seq {base.last_seq}, stored as seq {stored.seq}")
        except SnapshotDecodeError as exc:
            ignored = f"state snapshot at seq {stored.seq} ignored: {exc}"
            _log.warning("session %s: %s; replaying its whole journal", session_id, ignored)
            base = None
    first = 1 if base is None else base.last_seq + 1
    limit = None if upto is None else max(upto - first + 1, 0)
    records = await journal.read(session_id, first, limit) if limit != 0 else []
    if base is None and not records:
        raise SessionNotFoundError(session_id)
    with collector_paused():
        state = replay(records, base)
    return RestoredState(state, records, 0 if base is None else base.last_seq, ignored)


def _header_of(state: SessionState) -> SessionState:
    """Only what `StateSnapshots` takes from its own fold (no loops to copy on every session event)."""
    return SessionState(session_id=state.session_id, rig=state.rig, status=state.status, last_seq=state.last_seq)


class StateSnapshots:
    """Writes a live session's state snapshots: after a commit (`committed`), when one is due (`snapshot_due`),
    it takes the state then (an immutable value, so it needs no lock) and a task of its own encodes it (in a worker
    thread when it has more than `INLINE_ENCODE_MESSAGES` new messages) and saves it; one at a time, a failure only
    logged (the next due commit tries again). Its `StateEncoder` keeps the compressed histories of the previous
    snapshot, so each one encodes only the messages added since.

    The live state's loops, agents, workspace, hustles and settings are the fold's (a property test holds them
    to it); its header (``session_id``, ``rig``, ``status``) is the running session's view, which may differ from
    what the journal says (a rig of another name restored it; ``stopped`` is set after the record). So the header
    of a snapshot is folded here from the session-scoped events committed (``header``: the restored state's, or
    an empty one for a new session), with the core's own `apply`.

    ``every`` is `snapshot_due`'s minimum spacing; ``saved_seq`` the seq the newest snapshot covers (the restored
    one's at first); ``folded``: how many records the restore folded after it (`RESTORE_FOLD_SNAPSHOT` or more: the
    first commit after `release` saves one). Nothing is saved before `release`: while a session is being brought
    up, its live state is not yet the fold (a restore journals `SessionRestored` before it hands the open background
    runs back), so the rig releases it once the session is up. `aclose` waits for the save in flight (bounded);
    `abort` cancels it.
    """

    def __init__(
        self,
        journal: Journal,
        session_id: str,
        state: Callable[[], SessionState],
        clock: Clock,
        *,
        every: int = DEFAULT_SNAPSHOT_EVERY,
        saved_seq: int = 0,
        header: SessionState | None = None,
        folded: int = 0,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self._soon = folded >= RESTORE_FOLD_SNAPSHOT
        self._header = _header_of(header or SessionState(session_id=""))
        self._journal = journal
        self._session_id = session_id
        self._state = state
        self._clock = clock
        self.every = every
        self.saved_seq = saved_seq
        self._encoder = StateEncoder()  # reuses the compressed history of the previous snapshot
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._held = True
        self.saves = 0
        self.failures = 0

    def committed(self, seqs: Sequence[int], events: Sequence[SessionEvent | LoopEvent]) -> None:
        """``events`` were committed as ``seqs`` and applied (the live state is at ``seqs[-1]`` now): fold the
        session-scoped ones into the header, and start a save if one is due."""
        for seq, event in zip(seqs, events, strict=True):
            if event.scope is Scope.SESSION:
                self._header = _header_of(apply(self._header, event, seq))
        if self._held or self._closed or (self._task is not None and not self._task.done()):
            return
        if not self._soon and not snapshot_due(self.saved_seq, seqs[-1], self.every):
            return
        self._soon = False
        live = self._state()
        header = self._header
        state = replace(live, session_id=header.session_id, rig=header.rig, status=header.status)
        self._task = asyncio.create_task(self._save(state), name=f"loopd-state-snapshot-{self._session_id}")

    def release(self) -> None:
        """The session is up (its live state is the fold of its journal): saves may start from the next commit."""
        self._held = False

    async def _save(self, state: SessionState) -> None:
        try:
            async with asyncio.timeout(_SAVE_TIMEOUT):
                if self._encoder.new_messages(state) <= INLINE_ENCODE_MESSAGES:
                    data = self._encoder.encode(state)
                else:
                    data = await asyncio.to_thread(self._encoder.encode, state)
                await self._journal.save_snapshot(
                    self._session_id, state.last_seq, state_schema(), data, at=self._clock.time()
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a cache: the session goes on, the next due commit tries again
            self.failures += 1
            _log.warning("session %s: state snapshot at seq %d not saved: %s", self._session_id, state.last_seq, exc)
            return
        self.saved_seq = max(self.saved_seq, state.last_seq)
        self.saves += 1

    async def wait(self) -> None:
        """Wait for the save in flight, if any (tests and benchmarks)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def aclose(self) -> None:
        """No more saves; let the one in flight finish (bounded by its own timeout)."""
        self._closed = True
        if self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):  # _save logs its own failures
                await self._task

    def abort(self) -> None:
        """No more saves; cancel the one in flight (a crash loses it, which costs only a longer next restore)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
