"""Helpers for the message-stream tests."""

from __future__ import annotations

from loopd.server.storage import Database, NewMessage
from loopd.server.streams import empty_model, open_message


async def streaming_answer(db: Database) -> str:
    """The id of a new, empty harness answer (status streaming) in a new conversation of alice's."""
    async with db.transaction() as tx:
        cid = (await tx.conversations.create(actor_kind="user", actor_key="alice")).id
        new = NewMessage(
            conversation_id=cid, kind="harness", key="assistant", purpose="response", content=empty_model(),
            task_id="t1", status="streaming",
        )  # fmt: skip
        return (await open_message(tx, new)).id
