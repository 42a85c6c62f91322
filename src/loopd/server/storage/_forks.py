"""Conversation forks: where a forked conversation came from ("retry from here", "edit and resend").

Table ``conversation_forks`` (conversation_id PK = the fork, parent_conversation_id, parent_message_id = the
message the user chose, source_message_id = the answer whose harness session the fork's first answer starts from,
mode ``retry`` | ``edit``, created_at). One row per forked conversation, written with it.
Must not do: copy messages or ask questions (``loopd.server.chat._forks`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, cast

from ._errors import Conflict, NotFound
from ._tx import TransactionCore
from ._values import parse_time, require_choice, require_text, time_text

ForkMode = Literal["retry", "edit"]
FORK_MODES: Final = frozenset({"retry", "edit"})


@dataclass(frozen=True, slots=True)
class ConversationFork:
    """Where a forked conversation came from."""

    conversation_id: str
    parent_conversation_id: str
    parent_message_id: str
    """The message the user chose: the answer to retry, or the question to edit."""
    source_message_id: str
    """The answer whose harness call the fork's first answer starts from (a fork of its session)."""
    mode: ForkMode
    created_at: datetime


_COLUMNS = "conversation_id, parent_conversation_id, parent_message_id, source_message_id, mode, created_at"
FORK_COLUMNS: Final = _COLUMNS
"""The columns `fork_of_row` reads, in order (for a read that joins the table)."""


def fork_of_row(row: Sequence[Any]) -> ConversationFork:
    """A fork from a row of `FORK_COLUMNS`."""
    return ConversationFork(
        conversation_id=str(row[0]),
        parent_conversation_id=str(row[1]),
        parent_message_id=str(row[2]),
        source_message_id=str(row[3]),
        mode=cast(ForkMode, row[4]),
        created_at=parse_time(row[5]),
    )


class ConversationForks:
    """The fork origin of conversations (see the module docstring)."""

    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def insert(
        self,
        conversation_id: str,
        *,
        parent_conversation_id: str,
        parent_message_id: str,
        source_message_id: str,
        mode: ForkMode,
    ) -> ConversationFork:
        """Record that ``conversation_id`` was forked (a second record for it is a ``Conflict``)."""
        require_choice(mode, FORK_MODES, "fork mode")
        for value, name in (
            (conversation_id, "fork conversation_id"),
            (parent_conversation_id, "fork parent_conversation_id"),
            (parent_message_id, "fork parent_message_id"),
            (source_message_id, "fork source_message_id"),
        ):
            require_text(value, name)
        inserted = await self._tx.execute(
            f"INSERT INTO conversation_forks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                conversation_id,
                parent_conversation_id,
                parent_message_id,
                source_message_id,
                mode,
                time_text(self._tx.now()),
            ),
        )
        if inserted != 1:
            raise Conflict(f"conversation {conversation_id} already has a fork origin")
        return await self.get(conversation_id)

    async def get(self, conversation_id: str) -> ConversationFork:
        found = await self.find(conversation_id)
        if found is None:
            raise NotFound(f"conversation {conversation_id} is not a fork")
        return found

    async def find(self, conversation_id: str) -> ConversationFork | None:
        """The fork origin of a conversation; None when it was not forked."""
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM conversation_forks WHERE conversation_id = ?", (conversation_id,)
        )
        return None if row is None else fork_of_row(row)

    async def find_many(self, conversation_ids: Sequence[str]) -> dict[str, ConversationFork]:
        """The fork origins of those of ``conversation_ids`` that are forks (one query per 500 ids)."""
        found: dict[str, ConversationFork] = {}
        ids = list(dict.fromkeys(conversation_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            rows = await self._tx.fetch(
                f"SELECT {_COLUMNS} FROM conversation_forks WHERE conversation_id IN ({marks})", tuple(chunk)
            )
            found.update((origin.conversation_id, origin) for origin in map(fork_of_row, rows))
        return found
