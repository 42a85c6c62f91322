"""The visible form of a Human question: its ``ask`` / ``confirm`` block, and closing it with its one outcome.

Shared by the Human service (asking, replies, deadlines) and by completion (a failed Task ends its pending
questions with ``failure(task_ended)``). Every change goes through ``loopd.server.streams`` with
``allow_human_blocks``, so the block in ``messages.content`` is always the fold of the question's events.
Must not do: decide who may answer (the Human service does).
"""

from __future__ import annotations

from typing import Any, Final

from loopd.server.storage import HumanOutcome, HumanRequest, Message, Transaction
from loopd.server.streams import ConversationBus, TerminalStatus, emit, finish

QUESTION_BLOCK_ID: Final = "request"
"""The block id of the question in its ``human_request`` message (the same id in every such message)."""

MESSAGE_STATUS_OF: Final[dict[str, TerminalStatus]] = {
    "success": "completed",
    "dismissed": "completed",
    "timeout": "expired",
    "failure": "cancelled",
}
"""The status a question's message ends with, per outcome (none of them is an error)."""


def question_block(request: HumanRequest) -> dict[str, Any]:
    """The block of a question in its current state (an ``ask`` or ``confirm`` block of ``loopd.agentue``)."""
    block: dict[str, Any] = {
        "id": QUESTION_BLOCK_ID,
        "type": request.type,
        "title": request.title,
        "prompt": request.prompt,
        "status": request.outcome,
        "effect_key": request.effect_key,
        "timeout_seconds": request.timeout_seconds,
        "due_at": request.due_at.isoformat().replace("+00:00", "Z"),
    }
    if request.type == "ask":
        if request.choices:
            block["choices"] = [dict(choice) for choice in request.choices]
        block["allow_other"] = request.allow_other
    else:
        if request.confirm_label is not None:
            block["confirm_label"] = request.confirm_label
        if request.decline_label is not None:
            block["decline_label"] = request.decline_label
    if request.outcome == "success" and request.value is not None:
        block["value"] = str(request.value)
    if request.outcome == "failure" and request.reason:
        block["reason"] = request.reason
    return block


async def resolve_question(
    tx: Transaction,
    request: HumanRequest,
    outcome: HumanOutcome,
    *,
    value: str | None = None,
    reason: str | None = None,
    resolved_by: str | None = None,
    reply_message_id: str | None = None,
    bus: ConversationBus | None = None,
) -> tuple[HumanRequest, bool]:
    """Give a pending question its outcome and show it in the block; ``(request, changed)``.

    When the question already has an outcome nothing changes (``changed`` False): the first outcome stays.
    """
    resolved, changed = await tx.human_requests.resolve(
        request.message_id,
        outcome,
        value=value,
        reason=reason,
        resolved_by=resolved_by,
        reply_message_id=reply_message_id,
    )
    if not changed:
        return resolved, False
    await show_outcome(tx, resolved, bus=bus)
    return resolved, True


async def show_outcome(tx: Transaction, request: HumanRequest, *, bus: ConversationBus | None = None) -> Message:
    """Write a resolved question's state into its block and end its message (idempotent once ended)."""
    message = await tx.messages.lock(request.message_id)
    if message.status != "streaming":
        return message
    await emit(tx, message.id, [{"op": "set", "block": question_block(request)}], bus=bus, allow_human_blocks=True)
    return await finish(tx, message.id, MESSAGE_STATUS_OF[request.outcome], bus=bus)
