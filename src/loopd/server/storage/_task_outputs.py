"""Keyed outputs of a Task: the client-chosen key of every output an operator opened over HTTP.

Table ``task_outputs`` ((task_id, output_key) PRIMARY KEY, params_hash, message_id UNIQUE, end_intent JSON,
created_at). The row is inserted in the same transaction as its message, so a key names at most one message, even
across a crash or under concurrent duplicate requests (the primary key refuses the second insert: its transaction
rolls back and the caller reads the first one's row). ``end_intent`` is the one end the output was given
(``{"error": null}`` or ``{"error": {code, message}}``), fixed by the first end.
Must not do: write message content (``loopd.server.streams`` does) or decide who may write (the chat layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._errors import Conflict, NotFound
from ._tx import TransactionCore
from ._values import dumps, loads, parse_time, require_object, require_text, time_text

_COLUMNS = "task_id, output_key, params_hash, message_id, end_intent, created_at"


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """A keyed output: which message a Task's output key names, the digest of its parameters, its end."""

    task_id: str
    key: str
    params_hash: str
    message_id: str
    end_intent: dict[str, Any] | None
    created_at: datetime


def _output(row: tuple[Any, ...]) -> TaskOutput:
    return TaskOutput(
        task_id=str(row[0]),
        key=str(row[1]),
        params_hash=str(row[2]),
        message_id=str(row[3]),
        end_intent=loads(row[4]),
        created_at=parse_time(row[5]),
    )


class TaskOutputs:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def find(self, task_id: str, key: str) -> TaskOutput | None:
        """The output stored under (``task_id``, ``key``), if any."""
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM task_outputs WHERE task_id = ? AND output_key = ?", (task_id, key)
        )
        return None if row is None else _output(row)

    async def by_message(self, message_id: str) -> TaskOutput:
        """The keyed output whose message is ``message_id`` (``NotFound`` for any other message)."""
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM task_outputs WHERE message_id = ?", (message_id,))
        if row is None:
            raise NotFound(f"message {message_id} is not a keyed output")
        return _output(row)

    async def insert(self, task_id: str, key: str, params_hash: str, message_id: str) -> TaskOutput:
        """Record the key of a new output message; a key already stored is a ``Conflict``."""
        require_text(task_id, "output task_id")
        require_text(key, "output key")
        require_text(params_hash, "output params_hash")
        require_text(message_id, "output message_id")
        inserted = await self._tx.execute(
            f"INSERT INTO task_outputs ({_COLUMNS}) VALUES (?, ?, ?, ?, NULL, ?) ON CONFLICT DO NOTHING",
            (task_id, key, params_hash, message_id, time_text(self._tx.now())),
        )
        if inserted != 1:
            raise Conflict(f"task {task_id} already has an output with key {key!r}")
        found = await self.find(task_id, key)
        assert found is not None
        return found

    async def set_end(self, message_id: str, intent: dict[str, Any]) -> TaskOutput:
        """Store the end given to the output, once (a stored end is never replaced)."""
        require_object(intent, "output end intent")
        await self._tx.execute(
            "UPDATE task_outputs SET end_intent = ? WHERE message_id = ? AND end_intent IS NULL",
            (dumps(intent), message_id),
        )
        return await self.by_message(message_id)
