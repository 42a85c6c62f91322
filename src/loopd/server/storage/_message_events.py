"""The durable per-message AgentUE event log, and the per-conversation cursor across it.

Table ``message_events`` (PRIMARY KEY (message_id, seq), conversation_id, event_cursor UNIQUE per conversation,
event JSON, created_at). A message's seqs run 1, 2, 3… without gaps. Every stored event also takes the next value
of its conversation's counter row (``conversation_cursors``), updated in the same transaction: that row lock
serializes appends within one conversation on PostgreSQL, so cursors commit in increasing order and a reader
paging ``cursor > after`` never skips an event that commits later (SSE ``Last-Event-ID`` relies on this).
Must not do: interpret events (the AgentUE reducer does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import Conflict, InvalidRecord, NotFound
from ._records import Message, MessageEvent, MessageHead
from ._tx import TransactionCore
from ._values import canonical_json, dumps, loads, page_limit, parse_time, require_object, time_text

_COLUMNS = "message_id, seq, conversation_id, event_cursor, event, created_at"


def _event(row: tuple[Any, ...]) -> MessageEvent:
    return MessageEvent(
        message_id=str(row[0]),
        seq=int(row[1]),
        conversation_id=str(row[2]),
        cursor=int(row[3]),
        event=loads(row[4]),
        created_at=parse_time(row[5]),
    )


class MessageEvents:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def append(self, message_id: str, seq: int, event: dict[str, Any]) -> tuple[MessageEvent, bool]:
        """Store ``event`` as number ``seq`` of the message; returns ``(stored, appended)``.

        ``seq`` must be the message's last seq + 1 (the first is 1). Repeating a stored seq with the same content
        returns the stored event with ``appended=False``; with different content it is a ``Conflict``, as is any
        gap.
        """
        ((stored, appended),) = await self.append_many(message_id, ((seq, event),))
        return stored, appended

    async def append_many(
        self,
        message_id: str,
        events: Sequence[tuple[int, Mapping[str, Any]]],
        *,
        locked: Message | MessageHead | None = None,
        last_seq: int | None = None,
    ) -> list[tuple[MessageEvent, bool]]:
        """`append` for several events of one message at once, in order: the same results and errors as appending
        them one by one (nothing stored when one is refused), in a handful of statements instead of six per event.

        Each ``(seq, event)`` must continue the one before it (``seq`` = the previous one's + 1); a seq the message
        already holds returns its stored event with ``appended=False`` (different content: ``Conflict``).

        A caller that holds the message's row lock in this transaction (it read it with `Messages.lock` or
        `Messages.lock_head`, or inserted it) gives the row as ``locked`` — its conversation is then not read
        again, and the conversation's counter is locked by the statement that advances it — and may give the
        ``last_seq`` it read under that lock (not read again either)."""
        if not events:
            return []
        bodies: list[str] = []
        expected = events[0][0]
        for seq, event in events:
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
                raise InvalidRecord(f"event seq must be a positive integer, not {seq!r}")
            if seq != expected:
                raise InvalidRecord(f"events appended together must have consecutive seqs: {seq} after {expected - 1}")
            expected += 1
            bodies.append(dumps(require_object(event, "message event")))
        counter: tuple[Any, ...] | None = None
        if locked is not None:
            if locked.id != message_id:
                raise InvalidRecord(f"the locked message {locked.id} is not message {message_id}")
            conversation_id = locked.conversation_id
        else:
            row = await self._tx.fetch_one("SELECT conversation_id FROM messages WHERE id = ?", (message_id,))
            if row is None:
                raise NotFound(f"message {message_id} not found")
            conversation_id = str(row[0])
            # Lock the conversation's counter first: appends to one conversation run one at a time from here on
            # (with the message locked by the caller, they already do for this message).
            counter = await self._tx.fetch_one(
                f"SELECT last_cursor FROM conversation_cursors WHERE conversation_id = ?{self._tx.for_update}",
                (conversation_id,),
            )
            if counter is None:
                raise NotFound(f"conversation {conversation_id} not found")
        last = await self.last_seq(message_id) if last_seq is None else last_seq
        results: list[tuple[MessageEvent, bool]] = []
        first = events[0][0]
        if first <= last:  # a repeat of stored events (a retried write): each must be what is stored
            rows = await self._tx.fetch(
                f"SELECT {_COLUMNS} FROM message_events WHERE message_id = ? AND seq >= ? AND seq <= ? ORDER BY seq",
                (message_id, first, min(last, expected - 1)),
            )
            for (seq, event), existing in zip(events, rows, strict=False):
                stored = _event(existing)
                if stored.seq != seq or canonical_json(stored.event) != canonical_json(event):
                    raise Conflict(f"message {message_id} already has a different event at seq {seq}")
                results.append((stored, False))
        elif first != last + 1:
            raise Conflict(f"message {message_id} is at seq {last}; the next event must be {last + 1}, not {first}")
        fresh = len(events) - len(results)
        if fresh == 0:
            return results
        if counter is not None:
            cursor = int(counter[0])
            await self._tx.execute(
                "UPDATE conversation_cursors SET last_cursor = ? WHERE conversation_id = ?",
                (cursor + fresh, conversation_id),
            )
        else:
            cursor = await self._advance(conversation_id, fresh)
        numbered = [
            (message_id, seq, body)
            for (seq, _), body in zip(events[len(results) :], bodies[len(results) :], strict=True)
        ]
        results.extend((event, True) for event in await self._insert(conversation_id, cursor, numbered))
        return results

    async def _advance(self, conversation_id: str, count: int) -> int:
        """Lock and advance the conversation's counter by ``count`` in one statement; the cursor before them."""
        advanced = await self._tx.fetch(
            "UPDATE conversation_cursors SET last_cursor = last_cursor + ? WHERE conversation_id = ? "
            "RETURNING last_cursor",
            (count, conversation_id),
        )
        if not advanced:
            raise NotFound(f"conversation {conversation_id} not found")
        return int(advanced[0][0]) - count

    async def _insert(
        self, conversation_id: str, cursor: int, numbered: Sequence[tuple[str, int, str]]
    ) -> list[MessageEvent]:
        """Store ``(message id, seq, event JSON)`` rows under the cursors after ``cursor``, in one insert."""
        created = time_text(self._tx.now())
        at = parse_time(created)
        stored: list[MessageEvent] = []
        rows: list[tuple[Any, ...]] = []
        for message_id, seq, body in numbered:
            cursor += 1
            rows.append((message_id, seq, conversation_id, cursor, body, created))
            stored.append(MessageEvent(message_id, seq, conversation_id, cursor, loads(body), at))
        await self._tx.insert_rows("message_events", _COLUMNS, rows)
        return stored

    async def append_openings(
        self, opened: Sequence[tuple[Message | MessageHead, Sequence[tuple[int, Mapping[str, Any]]]]]
    ) -> list[MessageEvent]:
        """The first events of messages this transaction has just inserted (each message's seqs from 1), all of one
        conversation, in the order given: one advance of the conversation's counter and one insert for all of them
        (`append_many` takes that per message). The stored events, in cursor order. A message that already had
        events (it was not inserted in this transaction) makes the insert fail with ``Conflict`` (seq taken)."""
        if not opened:
            return []
        conversation_id = opened[0][0].conversation_id
        rows: list[tuple[str, int, str]] = []  # (message id, seq, body)
        for message, events in opened:
            if message.conversation_id != conversation_id:
                raise InvalidRecord("messages opened together must be of one conversation")
            for expected, (seq, event) in enumerate(events, start=1):
                if isinstance(seq, bool) or seq != expected:
                    raise InvalidRecord(f"a new message's events are numbered from 1 without gaps, not {seq!r}")
                rows.append((message.id, seq, dumps(require_object(event, "message event"))))
        if not rows:
            return []
        return await self._insert(conversation_id, await self._advance(conversation_id, len(rows)), rows)

    async def last_seq(self, message_id: str) -> int:
        """The highest stored seq of a message (0 when it has none)."""
        row = await self._tx.fetch_one("SELECT MAX(seq) FROM message_events WHERE message_id = ?", (message_id,))
        return int(row[0]) if row is not None and row[0] is not None else 0

    async def read(self, message_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[MessageEvent]:
        """A message's events with seq > ``after_seq``, in seq order."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM message_events WHERE message_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (message_id, after_seq, limit),
        )
        return [_event(row) for row in rows]

    async def read_conversation_events(
        self, conversation_id: str, *, after_cursor: int = 0, limit: int = 1000
    ) -> list[MessageEvent]:
        """Events of every message of a conversation with cursor > ``after_cursor``, in commit order."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM message_events WHERE conversation_id = ? AND event_cursor > ? "
            "ORDER BY event_cursor LIMIT ?",
            (conversation_id, after_cursor, limit),
        )
        return [_event(row) for row in rows]

    async def last_cursor(self, conversation_id: str) -> int:
        row = await self._tx.fetch_one(
            "SELECT last_cursor FROM conversation_cursors WHERE conversation_id = ?", (conversation_id,)
        )
        if row is None:
            raise NotFound(f"conversation {conversation_id} not found")
        return int(row[0])
