"""`HarnessResponder`: the reconciler that answers Tasks whose target is a harness, through the Harness Engine.

Per reconcile of Task ``default/<task id>`` (it always re-reads; it may run any number of times):

1. the Task is gone, being deleted, or not for a harness → nothing to do;
2. the call (owner = the Task's UID, effect key ``respond``) exists → go to 4;
3. read the Task's context (a storage ``NotFound`` is the commit window: requeue shortly), and start the call
   with the input text, the visible history before it, the response message as its destination and the
   asker as the only one who may answer its gates (`CapacityExceeded` → requeue later; an unknown target →
   complete the Task with that error);
4. while the call runs → ``Result(requeue_after=poll)`` (a harness finishing does not wake the Task watch);
   once it is terminal → ``chat.complete(task_id, error=...)`` (idempotent; ``Conflict`` while Human
   questions are pending → requeue).

The chat side is the small `ChatPort` protocol (``ChatService`` satisfies it), so tests can use any
implementation built on storage and streams.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from loopd.resources import NotFound as ResourceNotFound
from loopd.resources.client import TASKS, ResourceClient
from loopd.resources.reconcile import Request, Result
from loopd.server.engine import (
    DEFAULT_TIMEOUT,
    CallRequest,
    CapacityExceeded,
    HarnessEngine,
    HistoryEntry,
    UnknownTarget,
)
from loopd.server.storage import Conflict, HarnessCall, Message
from loopd.server.storage import NotFound as StorageNotFound

_log = logging.getLogger("loopd.server.responder")

EFFECT_KEY: Final = "respond"


class TaskContextView(Protocol):
    """What the responder reads of a Task's context (``loopd.server.chat.TaskContext`` has it)."""

    @property
    def input(self) -> Message: ...

    @property
    def response(self) -> Message: ...

    @property
    def history(self) -> Sequence[Message]: ...


class ChatPort(Protocol):
    """The two chat operations the responder needs (``ChatService`` has both)."""

    async def task_context(self, task_id: str) -> TaskContextView: ...

    async def complete(self, task_id: str, *, error: Mapping[str, str] | None = None) -> object: ...


def message_text(content: Mapping[str, Any]) -> str:
    """The plain text of a message: its text blocks' ``content`` (or ``text``), joined by blank lines."""
    parts: list[str] = []
    for block in content.get("blocks") or ():
        if not isinstance(block, Mapping) or block.get("type") != "text":
            continue
        text = block.get("content", block.get("text"))
        if isinstance(text, str) and text.strip():
            parts.append(text)
    return "\n\n".join(parts)


def call_error(call: HarnessCall) -> dict[str, str] | None:
    """What a terminal call means for the Task's completion: None for success, else ``{code, message}``."""
    if call.phase == "succeeded":
        return None
    error = call.error or {}
    code = str(error.get("code") or call.phase)
    message = str(error.get("message") or f"the harness call ended {call.phase}")
    return {"code": code, "message": message}


class HarnessResponder:
    """Reconciles Tasks with ``spec.target.kind == "harness"`` (see the module docstring)."""

    def __init__(
        self,
        *,
        client: ResourceClient,
        engine: HarnessEngine,
        chat: ChatPort,
        timeout: float = DEFAULT_TIMEOUT,
        poll: float = 1.0,
        context_retry: float = 0.2,
        capacity_retry: float = 2.0,
    ) -> None:
        self._client = client
        self._engine = engine
        self._chat = chat
        self._timeout = timeout
        self._poll = poll
        self._context_retry = context_retry
        self._capacity_retry = capacity_retry

    async def reconcile(self, request: Request) -> Result:
        try:
            task = await self._client.get(TASKS, request.name, namespace=request.namespace)
        except ResourceNotFound:
            return Result()
        spec = task.get("spec") or {}
        target = spec.get("target") or {}
        metadata = task.get("metadata") or {}
        if target.get("kind") != "harness" or metadata.get("deletionTimestamp"):
            return Result()
        uid, key, task_id = str(metadata.get("uid") or ""), str(target.get("key") or ""), request.name
        if not uid or not key:
            _log.warning("task %s has no uid or no target key; ignoring it", task_id)
            return Result()
        call = await self._engine.find(uid, EFFECT_KEY)
        if call is None:
            started = await self._start(task_id, uid, key)
            if isinstance(started, Result):
                return started
            call = started
        if not call.is_terminal:
            return Result(requeue_after=self._poll)
        return await self._complete(task_id, call_error(call))

    async def _start(self, task_id: str, uid: str, key: str) -> HarnessCall | Result:
        try:
            context = await self._chat.task_context(task_id)
        except StorageNotFound:
            return Result(requeue_after=self._context_retry)  # the question has not committed yet
        if context.response.status != "streaming":
            # Answered before and the completion was interrupted: finish it with the outcome it recorded.
            recorded = (context.response.completion or {}).get("error")
            return await self._complete(task_id, dict(recorded) if isinstance(recorded, Mapping) else None)
        history = tuple(
            HistoryEntry(message.kind, message.key, text)
            for message in context.history
            if message.id not in (context.input.id, context.response.id) and (text := message_text(message.content))
        )
        request = CallRequest(
            owner_uid=uid,
            effect_key=EFFECT_KEY,
            target=key,
            text=message_text(context.input.content) or "(empty message)",
            message_id=context.response.id,
            history=history,
            asker=f"{context.input.kind}:{context.input.key}",
            timeout=self._timeout,
        )
        try:
            return await self._engine.start(request)
        except CapacityExceeded:
            return Result(requeue_after=self._capacity_retry)
        except UnknownTarget as exc:
            return await self._complete(task_id, {"code": "unknown_target", "message": exc.message})
        except Conflict:
            # Started meanwhile with other parameters (the history changed between two reconciles): use that one.
            existing = await self._engine.find(uid, EFFECT_KEY)
            if existing is None:
                raise
            return existing

    async def _complete(self, task_id: str, error: dict[str, str] | None) -> Result:
        try:
            await self._chat.complete(task_id, error=error)
        except Conflict as exc:
            _log.info("task %s cannot complete yet: %s", task_id, exc.message)
            return Result(requeue_after=self._poll)
        except StorageNotFound:
            return Result()  # its messages are gone: nothing left to finish
        return Result()
