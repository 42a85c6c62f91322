"""Replay: stored records → session state, refusing records that are not a journal (`JournalCorruptError`).

Owns: the checks every reader of a whole journal needs before it trusts the fold — seqs start at 1 (or right
after the state replayed so far) and grow by exactly 1, every record decodes (known kind, a version this build
reads, a payload that parses), and every event can follow the state before it. These checks are input
validation of stored data, so they raise typed errors, never ``assert`` (gone under ``python -O``). Restore and
the transport's read-only view both replay through here. Must not do: I/O (the caller reads the records).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from loopd.harness._errors import InvalidTransitionError, JournalCorruptError
from loopd.harness.core import codec
from loopd.harness.core.apply import fold
from loopd.harness.core.events import LoopEvent, SessionEvent
from loopd.harness.core.state import SessionState
from loopd.harness.journal._protocol import Record

__all__ = ["last_settled_seq", "replay", "unsettled_loops"]


def replay(records: Sequence[Record], state: SessionState | None = None) -> SessionState:
    """Fold ``records`` (read in seq order) onto ``state`` (default: an empty session).

    Raises `JournalCorruptError` (the cause chained) when a seq is out of order, a record cannot be decoded, or
    an event cannot follow the state before it.
    """

    def events() -> Iterator[tuple[int, SessionEvent | LoopEvent]]:
        expected = (state.last_seq if state is not None else 0) + 1
        for record in records:
            if record.seq != expected:
                raise JournalCorruptError(f"session {record.session_id!r}: expected seq {expected}, found {record.seq}")
            try:
                event = codec.decode(record.kind, record.version, record.data)
            except codec.CodecError as exc:
                raise JournalCorruptError(f"session {record.session_id!r} seq {record.seq}: {exc}") from exc
            yield record.seq, event
            expected += 1

    try:
        return fold(events(), state)
    except InvalidTransitionError as exc:
        where = records[0].session_id if records else "?"
        raise JournalCorruptError(f"session {where!r}: {exc}") from exc


def unsettled_loops(state: SessionState) -> dict[str, str]:
    """The loops of ``state`` that are inside a turn or hold queued input (stopped agents excluded): loop name →
    what it is doing. Empty means the state is *settled*: a point a session can be forked at."""
    busy: dict[str, str] = {}
    for name, loop in state.loops.items():
        agent = state.agents.get(name)
        if agent is not None and agent.stopped:
            continue
        if loop.turn is not None:
            busy[name] = f"turn {loop.turn.turn_id}"
        elif loop.queued:
            busy[name] = f"{len(loop.queued)} queued input(s)"
    return busy


def last_settled_seq(records: Sequence[Record]) -> int:
    """The last seq among ``records`` (a journal's first records, in seq order) after which every loop is settled
    (see `unsettled_loops`); 0 when there is none. Raises `JournalCorruptError` like `replay`."""
    state = SessionState(session_id="")
    settled = 0
    for record in records:
        state = replay([record], state)
        if not unsettled_loops(state):
            settled = record.seq
    return settled
