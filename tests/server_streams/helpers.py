"""Helpers for the message-stream tests."""

from __future__ import annotations

from loopd.server.storage import Database, MessagePurpose, NewMessage
from loopd.server.streams import ConversationBus, empty_model, open_message


async def streaming_answer(
    db: Database, *, bus: ConversationBus | None = None, purpose: MessagePurpose = "response", task_id: str = "t1"
) -> str:
    """The id of a new, empty harness message (an answer unless ``purpose`` says otherwise; status streaming) in a
    new conversation of alice's; its start handed to ``bus`` when one is given."""
    async with db.transaction() as tx:
        cid = (await tx.conversations.create(actor_kind="user", actor_key="alice")).id
        new = NewMessage(
            conversation_id=cid, kind="harness", key="assistant", purpose=purpose, content=empty_model(),
            task_id=task_id, status="streaming",
        )  # fmt: skip
        return (await open_message(tx, new, bus=bus)).id
