"""Small builders shared by the storage tests."""

from __future__ import annotations

from typing import Any

from loopd.server.storage import Conversation, Message, NewMessage, Transaction


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
