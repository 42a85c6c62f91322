"""Small builders shared by the storage tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loopd.server.storage import Conversation, Message, NewMessage, Transaction
from loopd.server.storage._tx import TransactionCore


def record_statements(tx: TransactionCore, *, writes: bool = False) -> list[str]:
    """The SQL of every statement ``tx`` runs from now on through ``fetch`` / ``fetch_one`` (and ``execute`` with
    ``writes``), in order: for tests that count what an operation reads or writes."""
    statements: list[str] = []
    fetch_one, fetch, execute = tx.fetch_one, tx.fetch, tx.execute

    async def one(sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        statements.append(sql)
        return await fetch_one(sql, params)

    async def rows(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        statements.append(sql)
        return await fetch(sql, params)

    async def run(sql: str, params: Sequence[Any] = ()) -> int:
        statements.append(sql)
        return await execute(sql, params)

    tx.fetch_one, tx.fetch = one, rows  # type: ignore[method-assign]
    if writes:
        tx.execute = run  # type: ignore[method-assign]
    return statements


def text_content(text: str) -> dict[str, Any]:
    return {"version": "1.1", "biz": "chat", "meta": {}, "blocks": [{"id": "q", "type": "text", "content": text}]}


async def user_conversation(tx: Transaction, owner: str = "alice", name: str = "chat") -> Conversation:
    return await tx.conversations.create(actor_kind="user", actor_key=owner, name=name)


async def question(
    tx: Transaction, conversation: Conversation, task_id: str, text: str = "hi"
) -> tuple[Message, Message]:
    """The chat-create pair: a user input and an empty operator response, sharing one task id."""
    input_ = await tx.messages.insert(
        NewMessage(conversation.id, "user", conversation.actor_key, "input", text_content(text), task_id=task_id)
    )
    response = await tx.messages.insert(
        NewMessage(
            conversation.id,
            "operator",
            "router",
            "response",
            {"version": "1.1", "biz": "chat", "meta": {}, "blocks": []},
            task_id=task_id,
            reply_to_message_id=input_.id,
            status="streaming",
        )
    )
    return input_, response
