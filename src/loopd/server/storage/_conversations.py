"""Conversations: user conversations (listed per owner) and at most one work conversation per Task.

Table ``conversations`` (id, name, actor_kind, actor_key, task_id UNIQUE NULL, created_at, updated_at, and the
title, summary, title_state and title_run a background run writes, see ``loopd.server.chat._titles``, and the
``mode`` its built-in harness calls start in) plus one
``conversation_cursors`` row per conversation (the counter behind its event cursor, see ``_message_events``).
Must not do: message rules (``_messages``).
"""

from __future__ import annotations

from typing import Any, cast

from ._errors import Conflict, InvalidRecord, NotFound
from ._forks import FORK_COLUMNS, ConversationFork, fork_of_row
from ._records import CONVERSATION_ACTOR_KINDS, Conversation, ConversationActorKind
from ._tx import SeenRows, TransactionCore
from ._values import page_limit, parse_time, require_choice, require_text, time_text

_COLUMNS = (
    "id, name, actor_kind, actor_key, task_id, created_at, updated_at, title, summary, title_state, title_run, mode"
)
_COLUMN_COUNT = len(_COLUMNS.split(","))
_WITH_FORK = (
    "SELECT "
    + ", ".join(
        [*(f"c.{c.strip()}" for c in _COLUMNS.split(",")), *(f"f.{c.strip()}" for c in FORK_COLUMNS.split(","))]
    )
    + " FROM conversations c LEFT JOIN conversation_forks f ON f.conversation_id = c.id WHERE c.id = ?"
)
"""A conversation and where it was forked from (`Conversations.get_with_fork`)."""
_INSERT_COLUMNS = "id, name, actor_kind, actor_key, task_id, created_at, updated_at"
TITLE_STATES = frozenset({"", "running", "done", "failed"})


def _conversation(row: tuple[Any, ...]) -> Conversation:
    return Conversation(
        id=str(row[0]),
        name=str(row[1]),
        actor_kind=cast(ConversationActorKind, row[2]),
        actor_key=str(row[3]),
        task_id=None if row[4] is None else str(row[4]),
        created_at=parse_time(row[5]),
        updated_at=parse_time(row[6]),
        title=str(row[7]),
        summary=str(row[8]),
        title_state=str(row[9]),
        title_run=str(row[10]),
        mode=str(row[11]),
    )


class Conversations:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def create(
        self,
        *,
        actor_kind: ConversationActorKind,
        actor_key: str,
        name: str = "",
        task_id: str | None = None,
        id: str | None = None,
    ) -> Conversation:
        """A user conversation (``actor_kind="user"``, no task) or a Task's work conversation.

        A second work conversation for the same task is a ``Conflict``.
        """
        require_choice(actor_kind, CONVERSATION_ACTOR_KINDS, "conversation actor_kind")
        require_text(actor_key, "conversation actor_key")
        if not isinstance(name, str):
            raise InvalidRecord("conversation name must be a string")
        if (actor_kind == "user") != (task_id is None):
            raise InvalidRecord("a user conversation has no task_id; an operator or harness one needs its task_id")
        if task_id is not None:
            require_text(task_id, "conversation task_id")
        conversation_id = self._tx.new_id() if id is None else require_text(id, "conversation id")
        now = time_text(self._tx.now())
        inserted = await self._tx.execute(
            f"INSERT INTO conversations ({_INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (conversation_id, name, actor_kind, actor_key, task_id, now, now),
        )
        if inserted != 1:
            if task_id is not None and await self.find_work(task_id) is not None:
                raise Conflict(f"task {task_id} already has a work conversation")
            raise Conflict(f"conversation {conversation_id} already exists")
        await self._tx.execute(
            "INSERT INTO conversation_cursors (conversation_id, last_cursor) VALUES (?, 0)", (conversation_id,)
        )
        return await self.get(conversation_id)

    async def get(self, conversation_id: str) -> Conversation:
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,))
        if row is None:
            raise NotFound(f"conversation {conversation_id} not found")
        self._tx.memo(SeenRows, SeenRows).conversations.add(conversation_id)
        return _conversation(row)

    async def get_with_fork(self, conversation_id: str) -> tuple[Conversation, ConversationFork | None]:
        """`get`, and where the conversation was forked from (`ConversationForks.find`), in one read."""
        row = await self._tx.fetch_one(_WITH_FORK, (conversation_id,))
        if row is None:
            raise NotFound(f"conversation {conversation_id} not found")
        self._tx.memo(SeenRows, SeenRows).conversations.add(conversation_id)
        split = _COLUMN_COUNT
        return _conversation(row[:split]), None if row[split] is None else fork_of_row(row[split:])

    async def find_work(self, task_id: str) -> Conversation | None:
        """The work conversation of a Task, if it was created."""
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM conversations WHERE task_id = ?", (task_id,))
        return None if row is None else _conversation(row)

    async def list_for_owner(
        self, owner_key: str, *, after: str | None = None, limit: int = 50, newest_first: bool = True
    ) -> list[Conversation]:
        """User conversations of one owner, paged by id; ``after`` is the last id of the previous page."""
        page_limit(limit)
        sql = f"SELECT {_COLUMNS} FROM conversations WHERE actor_kind = 'user' AND actor_key = ?"
        params: list[Any] = [owner_key]
        if after is not None:
            sql += " AND id < ?" if newest_first else " AND id > ?"
            params.append(after)
        sql += " ORDER BY id DESC" if newest_first else " ORDER BY id"
        sql += " LIMIT ?"
        params.append(limit)
        return [_conversation(row) for row in await self._tx.fetch(sql, params)]

    async def rename(self, conversation_id: str, name: str) -> Conversation:
        if not isinstance(name, str):
            raise InvalidRecord("conversation name must be a string")
        changed = await self._tx.execute(
            "UPDATE conversations SET name = ?, updated_at = ? WHERE id = ?",
            (name, time_text(self._tx.now()), conversation_id),
        )
        if changed != 1:
            raise NotFound(f"conversation {conversation_id} not found")
        return await self.get(conversation_id)

    async def set_mode(self, conversation_id: str, mode: str) -> Conversation:
        """Set the mode its next built-in harness calls start in ("": each harness's own)."""
        if not isinstance(mode, str) or len(mode) > 64:
            raise InvalidRecord("conversation mode must be a string of at most 64 characters")
        changed = await self._tx.execute(
            "UPDATE conversations SET mode = ?, updated_at = ? WHERE id = ?",
            (mode, time_text(self._tx.now()), conversation_id),
        )
        if changed != 1:
            raise NotFound(f"conversation {conversation_id} not found")
        return await self.get(conversation_id)

    async def set_title_state(self, conversation_id: str, state: str, *, run: str | None = None) -> None:
        """Record where the title run of a conversation is (``run``: its id, kept to resume it after a restart)."""
        require_choice(state, TITLE_STATES, "conversation title_state")
        sql, params = "UPDATE conversations SET title_state = ?", [state]
        if run is not None:
            sql += ", title_run = ?"
            params.append(run)
        changed = await self._tx.execute(sql + " WHERE id = ?", (*params, conversation_id))
        if changed != 1:
            raise NotFound(f"conversation {conversation_id} not found")

    async def set_title(self, conversation_id: str, title: str, summary: str) -> None:
        """Store a generated title and summary, and the run that made them as ``done`` (one statement: the title
        run's end; ``updated_at`` is left alone: it is not the users' activity)."""
        changed = await self._tx.execute(
            "UPDATE conversations SET title = ?, summary = ?, title_state = 'done' WHERE id = ?",
            (title, summary, conversation_id),
        )
        if changed != 1:
            raise NotFound(f"conversation {conversation_id} not found")

    async def titles_running(self, *, limit: int = 100) -> list[Conversation]:
        """Conversations whose title run was started and never ended (cut off by a stop or a crash)."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM conversations WHERE title_state = 'running' ORDER BY id LIMIT ?", (limit,)
        )
        return [_conversation(row) for row in rows]

    async def touch(self, conversation_id: str) -> Conversation:
        """Record activity (a new message) in ``updated_at``; returns the conversation as stored now (``RETURNING``:
        no second read)."""
        rows = await self._tx.fetch(
            f"UPDATE conversations SET updated_at = ? WHERE id = ? RETURNING {_COLUMNS}",
            (time_text(self._tx.now()), conversation_id),
        )
        if len(rows) != 1:
            raise NotFound(f"conversation {conversation_id} not found")
        return _conversation(rows[0])
