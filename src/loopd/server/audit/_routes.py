"""``/v1/ledger``: the audit trail, read-only."""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Query

from loopd.server.http import ERROR_RESPONSES, ApiError, Identity, current_identity
from loopd.server.ledger import LedgerStore, Scope, UsageTotals

_ID = Annotated[str | None, Query(min_length=1, max_length=100)]
MAX_EVENTS = 5000
_LIMIT = Annotated[int, Query(ge=1, le=MAX_EVENTS, description="At most this many events.")]


class TaskAccessCheck(Protocol):
    """Who may read a Task's trail (``loopd.server.chat.TaskApi`` is one)."""

    async def asker_of(self, task_id: str) -> Identity: ...

    async def check_task_access(
        self, actor: Identity, task_id: str, *, conversation_id: str | None = None, message_id: str | None = None
    ) -> object: ...


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _usage(totals: UsageTotals) -> dict[str, Any]:
    body = _plain(totals)
    return body if isinstance(body, dict) else {"usage": body}


class ConversationReadCheck(Protocol):
    """Who may read a conversation's trail (``loopd.server.chat.ConversationReader`` is one)."""

    async def check_readable(self, caller: Identity, conversation_id: str) -> int: ...


def ledger_router(ledger: LedgerStore, *, tasks: TaskAccessCheck, conversations: ConversationReadCheck) -> APIRouter:
    router = APIRouter(prefix="/v1/ledger", tags=["ledger"], responses=ERROR_RESPONSES)

    async def scope_for(
        caller: Identity, task_id: str | None, conversation_id: str | None, call_id: str | None
    ) -> Scope:
        if not (task_id or conversation_id or call_id):
            raise ApiError("invalid_request", "name a task_id, conversation_id or call_id")
        scope = Scope(task_id=task_id, conversation_id=conversation_id, harness_call_id=call_id)
        if caller.admin:
            return scope
        if caller.trusted:  # an operator or harness: the trail of Tasks addressed to it, nothing else
            if task_id is None:
                raise ApiError("forbidden", f"{caller.text} reads the trail of its own Tasks only: name task_id")
            await tasks.check_task_access(caller, task_id)
            return scope  # the scope's fields all apply, so task_id bounds it
        if conversation_id is not None:
            await conversations.check_readable(caller, conversation_id)  # 404 unless it is the caller's
        if task_id is not None and (await tasks.asker_of(task_id)).key != caller.key:
            raise ApiError("not_found", f"task {task_id} not found")
        if call_id is not None and conversation_id is None and task_id is None:
            lanes = await ledger.find_lanes(scope)
            for lane in lanes:
                if lane.conversation_id is not None:
                    await conversations.check_readable(caller, lane.conversation_id)
        return scope

    @router.get("")
    async def trail(
        caller: Annotated[Identity, Depends(current_identity)],
        task_id: _ID = None,
        conversation_id: _ID = None,
        call_id: _ID = None,
        limit: _LIMIT = 1000,
    ) -> dict[str, Any]:
        """Lanes, their events (oldest first, up to ``limit``), unresolved attempts and the usage roll-up."""
        scope = await scope_for(caller, task_id, conversation_id, call_id)
        lanes = await ledger.find_lanes(scope)
        events: list[Any] = []
        for lane in lanes:
            if len(events) >= limit:
                break
            events.extend((await ledger.load_lane(lane.id))[: limit - len(events)])
        return {
            "lanes": _plain(lanes),
            "events": _plain(events),
            "unresolved_attempts": _plain(await ledger.unresolved_attempts(scope)),
            "usage": _usage(await ledger.usage(scope)),
        }

    @router.get("/usage")
    async def usage(
        caller: Annotated[Identity, Depends(current_identity)],
        task_id: _ID = None,
        conversation_id: _ID = None,
        call_id: _ID = None,
    ) -> dict[str, Any]:
        """Token and USD totals for a task, a conversation or a call."""
        scope = await scope_for(caller, task_id, conversation_id, call_id)
        return _usage(await ledger.usage(scope))

    return router
