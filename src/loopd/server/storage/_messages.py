"""Messages: the visible history. Public roles are only ``user``, ``harness`` and ``operator``.

Table ``messages`` (id UUIDv7 = paging cursor, conversation_id, task_id, kind, actor_key, reply_to_message_id,
purpose, status, revision, content JSON, delivery_state, completion JSON, human_due_at, created_at, updated_at).
Updates are compare-and-set on ``revision`` (each one bumps it); ``lock`` takes the row lock that serializes
output creation, Human transitions and completion of a Task on its response row.

Snapshot and tail: a writer of a long stream may store events without rewriting the whole content each time
(`advance`); the row then names the last event seq its stored content folds (``content_seq``) and the events after
it are its tail. Every read folds the tail in (the AgentUE reducer; the events were checked when they were stored),
so a reader always gets the content as of the message's last event; a content write (`update`, `write_content`)
stores a snapshot with no tail again.
Must not do: validate AgentUE content (the layer above does), or order events (``_message_events``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from loopd.agentue import AgentUEError, Model, StreamState, event_from_json, reduce

from ._errors import Conflict, InvalidRecord, NotFound
from ._records import (
    DELIVERY_STATES,
    MESSAGE_KINDS,
    MESSAGE_PURPOSES,
    MESSAGE_STATUSES,
    DeliveryState,
    Message,
    MessageHead,
    MessageKind,
    MessagePurpose,
    MessageStatus,
    NewMessage,
)
from ._tx import SeenRows, TransactionCore
from ._values import (
    UNSET,
    Unset,
    dumps,
    loads,
    optional_time,
    page_limit,
    parse_time,
    require_choice,
    require_object,
    require_text,
    time_text,
)

_COLUMNS = (
    "id, conversation_id, task_id, kind, actor_key, reply_to_message_id, purpose, status, revision, content, "
    "delivery_state, completion, human_due_at, created_at, updated_at, content_seq"
)
_CONTENT_SEQ = 15  # the index of ``content_seq`` in a row of `_COLUMNS`
_PURPOSE = 6  # the index of ``purpose``
# The purpose is written into the statement, not bound: ``purpose`` is in the WHERE clause of a partial index
# (``messages_open_by_responder``), and SQLite prepares a statement again at every run when a value bound to a
# column its planner matched against a partial index's condition changes (≈ 4× the cost of the lookup itself).
# One statement per purpose, each prepared once. The purposes are a closed set (`MESSAGE_PURPOSES`).
_BY_PURPOSE = {
    purpose: f"SELECT {_COLUMNS} FROM messages WHERE task_id = ? AND purpose = '{purpose}' ORDER BY id LIMIT ?"
    for purpose in MESSAGE_PURPOSES
}


class LockedHeads(dict[str, MessageHead]):
    """The heads of the message rows this transaction holds the lock of (`Messages.lock`, `Messages.lock_head`) or
    wrote (a write takes the row's lock too), as it left them: no other transaction can change such a row before
    this one ends, and every write of a message row goes through `Messages`, which keeps the entry current — so a
    second `lock_head` of the row in the same transaction (a writer's lock, emit and store of one batch) needs no
    statement. Kept with `TransactionCore.memo`; gone with the transaction, whatever its outcome."""

    __slots__ = ()


_HEAD_COLUMNS = "id, conversation_id, status, revision, delivery_state, content_seq, task_id"


def _head(row: tuple[Any, ...]) -> MessageHead:
    return MessageHead(
        id=str(row[0]),
        conversation_id=str(row[1]),
        status=cast(MessageStatus, row[2]),
        revision=int(row[3]),
        delivery_state=cast(DeliveryState, row[4]),
        content_seq=None if row[5] is None else int(row[5]),
        task_id=None if row[6] is None else str(row[6]),
    )


def _head_of_row(row: tuple[Any, ...]) -> MessageHead:
    """The head of a row of `_COLUMNS`."""
    return MessageHead(
        id=str(row[0]),
        conversation_id=str(row[1]),
        status=cast(MessageStatus, row[7]),
        revision=int(row[8]),
        delivery_state=cast(DeliveryState, row[10]),
        content_seq=None if row[_CONTENT_SEQ] is None else int(row[_CONTENT_SEQ]),
        task_id=None if row[2] is None else str(row[2]),
    )


def _message(row: tuple[Any, ...], content: dict[str, Any] | None = None) -> Message:
    """A row of `_COLUMNS` as a `Message`; ``content``: the content just written (the row's text is not decoded)."""
    return Message(
        id=str(row[0]),
        conversation_id=str(row[1]),
        task_id=None if row[2] is None else str(row[2]),
        kind=cast(MessageKind, row[3]),
        key=str(row[4]),
        reply_to_message_id=None if row[5] is None else str(row[5]),
        purpose=cast(MessagePurpose, row[6]),
        status=cast(MessageStatus, row[7]),
        revision=int(row[8]),
        content=loads(row[9]) if content is None else content,
        delivery_state=cast(DeliveryState, row[10]),
        completion=loads(row[11]),
        human_due_at=optional_time(row[12]),
        created_at=parse_time(row[13]),
        updated_at=parse_time(row[14]),
    )


def _folded(message_id: str, content: dict[str, Any], content_seq: int, tail: list[tuple[Any, ...]]) -> dict[str, Any]:
    """``content`` (the snapshot at ``content_seq``) with the ``tail`` rows (seq, event JSON) folded in."""
    try:  # the snapshot was written from a valid model (`write_content`), and its events were checked when stored
        state = StreamState.of(Model.from_stored(content), seq=content_seq)
        for seq, body in tail:
            event = event_from_json(loads(body))
            if event.seq != int(seq):
                raise InvalidRecord(f"message {message_id}: event {seq} is stored with seq {event.seq}")
            state = reduce(state, event)
    except AgentUEError as exc:
        raise InvalidRecord(f"message {message_id}: its stored events do not fold onto its snapshot: {exc}") from exc
    assert state.model is not None
    return state.model.to_json()


class Messages:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    def _locked(self) -> LockedHeads:
        return self._tx.memo(LockedHeads, LockedHeads)

    def _hold(self, head: MessageHead) -> MessageHead:
        self._tx.memo(LockedHeads, LockedHeads)[head.id] = head
        self._tx.memo(SeenRows, SeenRows).message_tasks[head.id] = head.task_id
        return head

    async def task_id_of(self, message_id: str) -> str | None:
        """The Task ``message_id`` belongs to (None: none), fixed when it was stored: known without a statement when
        this transaction read or wrote its row before. ``NotFound`` when there is no such message."""
        tasks = self._tx.memo(SeenRows, SeenRows).message_tasks
        if message_id in tasks:
            return tasks[message_id]
        return (await self.head(message_id)).task_id

    async def _read(self, row: tuple[Any, ...]) -> Message:
        """A row of `_COLUMNS` as a `Message` whose content folds every stored event (its tail, when it has one)."""
        content_seq = row[_CONTENT_SEQ]
        if content_seq is None:
            return _message(row)
        tail = await self._tx.fetch(
            "SELECT seq, event FROM message_events WHERE message_id = ? AND seq > ? ORDER BY seq", (row[0], content_seq)
        )
        return _message(row, _folded(str(row[0]), loads(row[9]), int(content_seq), tail))

    async def _read_all(self, rows: list[tuple[Any, ...]]) -> list[Message]:
        return [await self._read(row) for row in rows]

    async def insert(self, new: NewMessage) -> Message:
        """Store a new message at revision 1 in an existing conversation."""
        require_choice(new.kind, MESSAGE_KINDS, "message kind")
        require_choice(new.purpose, MESSAGE_PURPOSES, "message purpose")
        require_choice(new.status, MESSAGE_STATUSES, "message status")
        require_text(new.key, "message key")
        require_object(new.content, "message content")
        if new.task_id is not None:
            require_text(new.task_id, "message task_id")
        seen = self._tx.memo(SeenRows, SeenRows)
        if new.conversation_id not in seen.conversations:
            if await self._tx.fetch_one("SELECT 1 FROM conversations WHERE id = ?", (new.conversation_id,)) is None:
                raise NotFound(f"conversation {new.conversation_id} not found")
            seen.conversations.add(new.conversation_id)
        replied = new.reply_to_message_id
        if replied is not None and replied not in seen.messages:
            if await self._tx.fetch_one("SELECT 1 FROM messages WHERE id = ?", (replied,)) is None:
                raise NotFound(f"message {replied} not found")
            seen.messages.add(replied)
        message_id = self._tx.new_id() if new.id is None else require_text(new.id, "message id")
        now = time_text(self._tx.now())
        inserted = await self._tx.fetch(
            f"INSERT INTO messages ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, '', NULL, ?, ?, ?, NULL) "
            f"ON CONFLICT DO NOTHING RETURNING {_COLUMNS}",
            (
                message_id,
                new.conversation_id,
                new.task_id,
                new.kind,
                new.key,
                new.reply_to_message_id,
                new.purpose,
                new.status,
                dumps(new.content),
                None if new.human_due_at is None else time_text(new.human_due_at),
                now,
                now,
            ),
        )
        if len(inserted) != 1:
            raise Conflict(f"message {message_id} already exists")
        seen.messages.add(message_id)
        seen.message_tasks[message_id] = new.task_id
        self._hold(_head_of_row(inserted[0]))
        return _message(inserted[0])  # the row as stored (no tail yet), without reading it again

    async def get(self, message_id: str) -> Message:
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM messages WHERE id = ?", (message_id,))
        if row is None:
            raise NotFound(f"message {message_id} not found")
        return await self._read(row)

    async def lock(self, message_id: str) -> Message:
        """Read a message and hold its row lock until the transaction ends (the Task's shared lock)."""
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM messages WHERE id = ?{self._tx.for_update}", (message_id,)
        )
        if row is None:
            raise NotFound(f"message {message_id} not found")
        self._hold(_head_of_row(row))
        return await self._read(row)

    def holds_whole_snapshot(self, message_id: str) -> bool:
        """Whether this transaction holds the row of ``message_id`` (locked or wrote it) and its stored content is a
        whole snapshot, with no tail of events to fold (``content_seq`` unset); False when it does not hold it."""
        head = self._locked().get(message_id)
        return head is not None and head.content_seq is None

    async def lock_head(self, message_id: str) -> MessageHead:
        """`lock` without the content (nothing of a long answer is read or decoded): for a writer that keeps the
        stream's state itself (`loopd.server.streams.StreamStates`). A row this transaction locked or wrote
        before is not read again (`LockedHeads`)."""
        held = self._locked().get(message_id)
        if held is not None:
            return held
        return self._hold(await self._head(message_id, self._tx.for_update))

    async def head(self, message_id: str) -> MessageHead:
        """A message's status and revision without its content, and without a lock (a watcher's cheap look)."""
        held = self._locked().get(message_id)
        return held if held is not None else await self._head(message_id, "")

    async def _head(self, message_id: str, lock: str) -> MessageHead:
        row = await self._tx.fetch_one(f"SELECT {_HEAD_COLUMNS} FROM messages WHERE id = ?{lock}", (message_id,))
        if row is None:
            raise NotFound(f"message {message_id} not found")
        head = _head(row)
        self._tx.memo(SeenRows, SeenRows).message_tasks[message_id] = head.task_id
        return head

    async def write_content(self, message_id: str, *, expected_revision: int, text: str) -> MessageHead:
        """Store ``text``, content the caller has already encoded as compact JSON of an object (an AgentUE model's
        `json_text`), if the stored revision is ``expected_revision``; the revision becomes one larger. A
        different stored revision is a ``Conflict``, as in `update`."""
        rows = await self._tx.fetch(
            "UPDATE messages SET content = ?, content_seq = NULL, revision = revision + 1, updated_at = ? "
            f"WHERE id = ? AND revision = ? RETURNING {_HEAD_COLUMNS}",
            (text, time_text(self._tx.now()), message_id, expected_revision),
        )
        if not rows:
            await self._conflict(message_id, expected_revision)
        return self._hold(_head(rows[0]))

    async def advance(self, message_id: str, *, expected_revision: int, content_seq: int) -> MessageHead:
        """Events were stored without a new content snapshot: the revision becomes one larger (compare-and-set, as
        in `update`), and the row remembers that its stored content folds the events up to ``content_seq`` (kept
        when it already names an earlier one). Reads fold the events after it (the tail) until the next content
        write. Only a row's small columns change: a long answer is not rewritten."""
        if isinstance(content_seq, bool) or not isinstance(content_seq, int) or content_seq < 1:
            raise InvalidRecord(f"content_seq must be a positive integer, not {content_seq!r}")
        rows = await self._tx.fetch(
            "UPDATE messages SET content_seq = COALESCE(content_seq, ?), revision = revision + 1, updated_at = ? "
            f"WHERE id = ? AND revision = ? RETURNING {_HEAD_COLUMNS}",
            (content_seq, time_text(self._tx.now()), message_id, expected_revision),
        )
        if not rows:
            await self._conflict(message_id, expected_revision)
        return self._hold(_head(rows[0]))

    async def _conflict(self, message_id: str, expected_revision: int) -> None:
        current = await self.get(message_id)
        raise Conflict(f"message {message_id} is at revision {current.revision}, not {expected_revision}: re-read it")

    async def list_conversation(
        self, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        """Messages of a conversation in id order, after the id ``after``."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM messages WHERE conversation_id = ? AND id > ? ORDER BY id LIMIT ?",
            (conversation_id, after or "", limit),
        )
        return await self._read_all(rows)

    async def list_through(self, conversation_id: str, through_id: str, *, limit: int = 100) -> list[Message]:
        """The last ``limit`` messages of a conversation with id <= ``through_id``, in id order (history)."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM messages WHERE conversation_id = ? AND id <= ? ORDER BY id DESC LIMIT ?",
            (conversation_id, through_id, limit),
        )
        return await self._read_all(rows[::-1])

    async def list_task(self, task_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """Every message of a task, in both its conversations, in id order."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM messages WHERE task_id = ? AND id > ? ORDER BY id LIMIT ?",
            (task_id, after or "", limit),
        )
        return await self._read_all(rows)

    async def find_by_purpose(self, task_id: str, purpose: MessagePurpose, *, limit: int = 100) -> list[Message]:
        require_choice(purpose, MESSAGE_PURPOSES, "message purpose")
        page_limit(limit)
        rows = await self._tx.fetch(_BY_PURPOSE[purpose], (task_id, limit))
        return await self._read_all(rows)

    async def task_pair(self, task_id: str) -> tuple[Message, Message]:
        """The task's ``input`` and ``response`` messages: ``NotFound`` if either is missing (not committed yet),
        ``Conflict`` if either is ambiguous."""
        input_row, response_row = await self._task_rows(task_id, _COLUMNS)
        return await self._read(input_row), await self._read(response_row)

    async def task_pair_ids(self, task_id: str) -> tuple[str, str]:
        """`task_pair`'s ids only, with the same errors: nothing of either message's content is read or folded
        (for a writer that locks the response next)."""
        input_row, response_row = await self._task_rows(task_id, "id, purpose")
        return str(input_row[0]), str(response_row[0])

    async def _task_rows(self, task_id: str, columns: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        # Both purposes in one index range, inputs first: three rows are enough to tell none, one or two of each
        # (two inputs fill the first two rows; with one input, the next two rows are the responses).
        rows = await self._tx.fetch(
            f"SELECT {columns} FROM messages WHERE task_id = ? AND purpose IN ('input', 'response') "
            "ORDER BY purpose, id LIMIT 3",
            (task_id,),
        )
        purpose_at = _PURPOSE if columns == _COLUMNS else 1
        found: list[tuple[Any, ...]] = []
        purposes: tuple[MessagePurpose, ...] = ("input", "response")
        for purpose in purposes:
            matching = [row for row in rows if row[purpose_at] == purpose]
            if not matching:
                raise NotFound(f"task {task_id} has no {purpose} message")
            if len(matching) > 1:
                raise Conflict(f"task {task_id} has more than one {purpose} message")
            found.append(matching[0])
        return found[0], found[1]

    async def list_open_tasks(
        self, kind: MessageKind, key: str, *, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        """The ``response`` messages of the Tasks addressed to ``kind:key`` whose delivery is not ``closed``, in
        task id order after the task id ``after`` (one per Task: a Task has one response)."""
        require_choice(kind, MESSAGE_KINDS, "message kind")
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM messages WHERE purpose = 'response' AND kind = ? AND actor_key = ? "
            "AND task_id > ? AND delivery_state <> 'closed' ORDER BY task_id LIMIT ?",
            (kind, key, after or "", limit),
        )
        return await self._read_all(rows)

    async def list_open_responses(
        self, *, created_before: datetime, after: str | None = None, limit: int = 100
    ) -> list[Message]:
        """Task ``response`` messages whose delivery is still open (completion not begun), created before
        ``created_before``, in id order after ``after``: answers whose Task may have gone away unanswered."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM messages WHERE delivery_state = '' AND id > ? AND purpose = 'response' "
            "AND task_id IS NOT NULL AND created_at < ? ORDER BY id LIMIT ?",
            (after or "", time_text(created_before), limit),
        )
        return await self._read_all(rows)

    async def list_closing(self, *, limit: int = 100) -> list[Message]:
        """Messages whose delivery is ``closing``: completions to resume after a crash."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM messages WHERE delivery_state = 'closing' ORDER BY id LIMIT ?", (limit,)
        )
        return await self._read_all(rows)

    async def update(
        self,
        message_id: str,
        *,
        expected_revision: int,
        status: MessageStatus | Unset = UNSET,
        content: dict[str, Any] | Unset = UNSET,
        delivery_state: DeliveryState | Unset = UNSET,
        completion: dict[str, Any] | Unset | None = UNSET,
        human_due_at: datetime | Unset | None = UNSET,
    ) -> Message:
        """Change fields if the stored revision is ``expected_revision``; the revision becomes one larger.

        A different stored revision is a ``Conflict`` (re-read and decide again).
        """
        if isinstance(expected_revision, bool) or not isinstance(expected_revision, int):
            raise InvalidRecord("expected_revision must be an integer")
        sets: list[str] = []
        params: list[Any] = []
        if not isinstance(status, Unset):
            sets.append("status = ?")
            params.append(require_choice(status, MESSAGE_STATUSES, "message status"))
        written: dict[str, Any] | None = None
        if not isinstance(content, Unset):
            written = require_object(content, "message content")
            sets.append("content = ?, content_seq = NULL")  # a whole snapshot: no tail
            params.append(dumps(written))
        if not isinstance(delivery_state, Unset):
            sets.append("delivery_state = ?")
            params.append(require_choice(delivery_state, DELIVERY_STATES, "message delivery_state"))
        if not isinstance(completion, Unset):
            sets.append("completion = ?")
            params.append(None if completion is None else dumps(require_object(completion, "completion intent")))
        if not isinstance(human_due_at, Unset):
            sets.append("human_due_at = ?")
            params.append(None if human_due_at is None else time_text(human_due_at))
        sets += ["revision = revision + 1", "updated_at = ?"]
        params += [time_text(self._tx.now()), message_id, expected_revision]
        rows = await self._tx.fetch(
            f"UPDATE messages SET {', '.join(sets)} WHERE id = ? AND revision = ? RETURNING {_COLUMNS}", params
        )
        if not rows:
            await self._conflict(message_id, expected_revision)
        self._hold(_head_of_row(rows[0]))
        # The written content is not read back: the caller's dict is the value (a long answer is not decoded again).
        return _message(rows[0], written) if written is not None else await self._read(rows[0])
