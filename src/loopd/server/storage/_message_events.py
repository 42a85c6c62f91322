"""The durable per-message AgentUE event log, and the per-conversation cursor across it.

Table ``message_events`` (PRIMARY KEY (message_id, seq), conversation_id, event_cursor UNIQUE per conversation,
event JSON, created_at). A message's seqs run 1, 2, 3… without gaps. Every stored event also takes the next value
of its conversation's counter row (``conversation_cursors``), updated in the same transaction: that row lock
serializes appends within one conversation on PostgreSQL, so cursors commit in increasing order and a reader
paging ``cursor > after`` never skips an event that commits later (SSE ``Last-Event-ID`` relies on this).
Must not do: interpret events (the AgentUE reducer does).
"""

from __future__ import annotations

from typing import Any

from ._errors import Conflict, InvalidRecord, NotFound
from ._records import MessageEvent
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
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise InvalidRecord(f"event seq must be a positive integer, not {seq!r}")
        body = dumps(require_object(event, "message event"))
        row = await self._tx.fetch_one("SELECT conversation_id FROM messages WHERE id = ?", (message_id,))
        if row is None:
            raise NotFound(f"message {message_id} not found")
        conversation_id = str(row[0])
        # Lock the conversation's counter first: appends to one conversation run one at a time from here on.
        counter = await self._tx.fetch_one(
            f"SELECT last_cursor FROM conversation_cursors WHERE conversation_id = ?{self._tx.for_update}",
            (conversation_id,),
        )
        if counter is None:
            raise NotFound(f"conversation {conversation_id} not found")
        existing = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM message_events WHERE message_id = ? AND seq = ?", (message_id, seq)
        )
        if existing is not None:
            stored = _event(existing)
            if canonical_json(stored.event) != canonical_json(event):
                raise Conflict(f"message {message_id} already has a different event at seq {seq}")
            return stored, False
        last = await self.last_seq(message_id)
        if seq != last + 1:
            raise Conflict(f"message {message_id} is at seq {last}; the next event must be {last + 1}, not {seq}")
        cursor = int(counter[0]) + 1
        await self._tx.execute(
            "UPDATE conversation_cursors SET last_cursor = ? WHERE conversation_id = ?", (cursor, conversation_id)
        )
        now = self._tx.now()
        await self._tx.execute(
            f"INSERT INTO message_events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (message_id, seq, conversation_id, cursor, body, time_text(now)),
        )
        return MessageEvent(message_id, seq, conversation_id, cursor, loads(body), parse_time(time_text(now))), True

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
