"""The Harness Engine's HTTP routes: ``engine_router(engine, asker_of=...)``.

    POST /v1/harness/calls                     start or re-attach (token callers only) → 202 + the call
    GET  /v1/harness/calls/{id}                the call's state
    GET  /v1/harness/calls/{id}/stream         its visible events (SSE; resume with Last-Event-ID or ?after=)
    GET  /v1/harness/calls/{id}/wait           the call once terminal, or as it is after ?timeout= (≤ 60 s)
    POST /v1/harness/calls/{id}/cancel         ask it to stop → 202 + the call
    POST /v1/harness/calls/{id}/gates/{gate}   {"answer": "approve" | "always" | "deny"}; only the asker (403)

Who may start a call: the admin, and an operator or harness for a Task addressed to it (``task_id`` required; the
destination conversation or message must belong to that Task; 403 otherwise). A call may name its own
``workspace`` (a relative id) and ``tools`` profile (none | read | write): the id resolves under the engine's
workspaces root *per caller*, ``<kind>/<key>/<id>`` (``operator/longhorizon/<id>``; the admin's own calls under
``user/<admin key>/``), so a caller reaches only its own workspaces. The unattended gate policy of such calls is
`loopd.harness.standard.profile_access`; see docs/longhorizon.md. With ``"output": "work"`` the call's
visible output is a ``harness`` message the engine opens in the Task's work conversation (created on first use),
in the call's own transaction, so a replay of the same identity returns the same call and message. Who may see,
wait for or cancel one: the
admin, the call's asker, and the responder of the Task its output message belongs to; anyone else gets 404.
The asker of a call started here is the user who asked the Task (``asker_of(task_id)``), never a value from the
body. The stream is AgentUE over SSE: ``id:`` is the message event seq; a resumed stream starts with a
``start`` holding the snapshot at the cursor; it ends (with ``end``) once the call is terminal. Closing it
never touches the call.
Must not do: business rules (the engine has them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Final, Literal, Protocol

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from loopd._infra.tasks import cancel_and_wait
from loopd.agentue import StartEvent, fold
from loopd.harness.standard import ToolsProfile
from loopd.server.http import (
    ERROR_RESPONSES,
    HEARTBEAT,
    ApiError,
    EventStreamResponse,
    Identity,
    current_identity,
    sse_frame,
    trusted_identity,
)
from loopd.server.storage import Conflict, HarnessCall, HarnessPhase, MessageEvent, NotFound, StorageError

from ._adapter import HistoryEntry
from ._engine import HarnessEngine
from ._errors import HarnessEngineError
from ._requests import DEFAULT_TIMEOUT, MAX_HISTORY, MAX_TEXT, CallRequest, workspace_of

AskerOf = Callable[[str], Awaitable[Identity]]


class TaskAccess(Protocol):
    """What the routes ask of the chat service (``TaskApi`` is one) to keep a responder to its own Tasks."""

    async def check_task_access(
        self, actor: Identity, task_id: str, *, conversation_id: str | None = None, message_id: str | None = None
    ) -> Identity:
        """Raise unless ``actor`` may act for the Task; the Task's asker."""
        ...

    async def task_of_message(self, message_id: str) -> str | None: ...

    async def work_conversation_state(self, task_id: str) -> tuple[str | None, bool]:
        """The Task's work conversation id (None before its first use) and whether its completion has begun."""
        ...

    async def checked_work_state(self, actor: Identity, task_id: str) -> tuple[Identity, str | None, bool]:
        """`check_task_access` and `work_conversation_state` in one read: (asker, work conversation, completing)."""
        ...

    async def work_conversation_id(self, task_id: str, *, create: bool = True) -> str | None: ...


MAX_NAME: Final = 500
MAX_WORKSPACE: Final = 255
MAX_WAIT: Final = 60.0
FIND_LIMIT: Final = 100
DEFAULT_WAIT: Final = 30.0
CallId = Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HistoryItem(_Body):
    kind: Literal["user", "harness", "operator"]
    key: str = Field(min_length=1, max_length=MAX_NAME)
    text: str = Field(max_length=MAX_TEXT)


class StartCallBody(_Body):
    """A harness call. Identity: (``owner_uid``, ``effect_key``); the rest are its parameters."""

    owner_uid: str = Field(min_length=1, max_length=MAX_NAME, description="UID of the owning resource.")
    effect_key: str = Field(min_length=1, max_length=MAX_NAME)
    target: str = Field(min_length=1, max_length=MAX_NAME, description="The harness adapter key.")
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    conversation_id: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    message_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME, description="A streaming message to write into."
    )
    task_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME, description="The Task whose asker may answer gates."
    )
    history: list[HistoryItem] = Field(default_factory=list, max_length=MAX_HISTORY)
    params: dict[str, Any] = Field(default_factory=dict)
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, description="Seconds; the deadline is fixed at first start.")
    output: Literal["work"] | None = Field(
        default=None,
        description="``work``: the output goes to a new harness message in the Task's work conversation (needs "
        "task_id; no conversation_id or message_id). Null: to conversation_id / message_id.",
    )
    workspace: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_WORKSPACE,
        description="The call's own workspace: a relative id (parts of letters, digits, '.', '_', '-'; no '..'), "
        "resolved under the engine's workspaces root for the caller (<kind>/<key>/<id>) and created on demand.",
    )
    tools: ToolsProfile | None = Field(
        default=None,
        description="none: no tools; read: read_file, list_dir, glob, grep; write: those plus write_file, edit_file "
        "and bash. Allowed without asking inside the workspace (bash only under a confining sandbox). read and "
        "write need a workspace; with a workspace the default is read.",
    )
    wait: float = Field(
        default=0.0,
        ge=0,
        le=MAX_WAIT,
        allow_inf_nan=False,
        description="Seconds to wait for the call to end before answering (0: at once), like GET .../wait right "
        "after the start, in one request; not one of the call's parameters. The call runs on either way.",
    )


class GateAnswerBody(_Body):
    answer: Literal["approve", "always", "deny"]


class CallBody(_Body):
    id: str
    owner_uid: str
    effect_key: str
    target: str
    conversation_id: str | None
    message_id: str | None
    phase: HarnessPhase
    result: Any
    error: dict[str, Any] | None
    deadline_at: datetime
    checkpoint: int
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    workspace: str | None = None
    """Where the call works, relative to the workspaces root (``<kind>/<key>/<id>``); None: its target's own."""
    tools: ToolsProfile | None = None


class CallList(_Body):
    data: list[CallBody]


class QuestionAnswerBody(_Body):
    text: str = Field(min_length=1, max_length=MAX_TEXT)


class QuestionAnswered(_Body):
    call_id: str
    request_id: str
    text: str


class GateAnswered(_Body):
    call_id: str
    gate_id: str
    answer: Literal["approve", "always", "deny"]


def call_body(call: HarnessCall) -> CallBody:
    workspace, tools = workspace_of(call.params)
    return CallBody(
        id=call.id,
        owner_uid=call.owner_uid,
        effect_key=call.effect_key,
        target=call.target,
        conversation_id=call.conversation_id,
        message_id=call.message_id,
        phase=call.phase,
        result=call.result,
        error=call.error,
        deadline_at=call.deadline_at,
        checkpoint=call.checkpoint,
        cancel_requested=call.cancel_requested,
        created_at=call.created_at,
        updated_at=call.updated_at,
        workspace=workspace,
        tools=tools,
    )


def engine_router(
    engine: HarnessEngine,
    *,
    asker_of: AskerOf | None = None,
    tasks: TaskAccess | None = None,
    heartbeat: float = 15.0,
    stopping: asyncio.Event | None = None,
) -> APIRouter:
    """The engine's routes. ``asker_of(task_id)``: the user who asked a Task (``TaskApi.asker_of``);
    ``tasks``: the Task access checks for operator and harness callers (without it only the admin starts calls);
    ``stopping``: the server's shutdown signal (waits answer at once once it is set)."""
    router = APIRouter(prefix="/v1/harness/calls", tags=["harness"], responses=ERROR_RESPONSES)

    async def responds_for(caller: Identity, call: HarnessCall) -> bool:
        if not caller.trusted or tasks is None or call.message_id is None:
            return False
        try:
            task_id = await tasks.task_of_message(call.message_id)
            if task_id is None:
                return False
            await tasks.check_task_access(caller, task_id)
        except (ApiError, NotFound):
            return False
        return True

    async def visible(call_id: str, caller: Identity) -> HarnessCall:
        call = await engine.get(call_id)
        if not (caller.admin or call.params.get("asker") == caller.text or await responds_for(caller, call)):
            raise NotFound(f"harness call {call_id} not found")
        return call

    @router.post("", status_code=202)
    async def start_call(body: StartCallBody, caller: Annotated[Identity, Depends(trusted_identity)]) -> CallBody:
        """Start a harness call, or get the one with this identity (same parameters); 409 if they differ, 429
        when this server's slots are full (nothing is created then). With ``wait``, answer once the call has
        ended or ``wait`` seconds have passed (check ``phase``)."""
        conversation_id = body.conversation_id
        if body.output == "work":
            if body.task_id is None or body.conversation_id is not None or body.message_id is not None:
                raise ApiError(
                    "invalid_request", 'output "work" needs task_id and takes no conversation_id or message_id'
                )
            if tasks is None:
                raise ApiError("invalid_request", 'this server has no Task API: output "work" is not available')
        checked: Identity | None = None  # the Task's asker, read by the access check (one read, not two)
        work_state: tuple[str | None, bool] | None = None  # read with the access check for output "work"
        if not caller.admin:
            if body.task_id is None or tasks is None:
                raise ApiError("forbidden", f"{caller.text} may start calls only for its own Tasks: send task_id")
            if body.output == "work":
                checked, work_id, completing = await tasks.checked_work_state(caller, body.task_id)
                work_state = (work_id, completing)
            else:
                checked = await tasks.check_task_access(
                    caller, body.task_id, conversation_id=body.conversation_id, message_id=body.message_id
                )
        asker: str | None = None
        if body.task_id is not None:
            if asker_of is None:
                raise ApiError("invalid_request", "this server does not resolve Task askers; leave task_id out")
            asker = (checked or await asker_of(body.task_id)).text
        if body.output == "work":
            assert tasks is not None and body.task_id is not None  # checked above
            # The usual start (the Task's work conversation exists, completion has not begun) needs one read.
            # Otherwise a replay needs no new work conversation (the Task may be completing by now): its identity
            # decides.
            conversation_id, completing = work_state or await tasks.work_conversation_state(body.task_id)
            if conversation_id is None or completing:
                replay = await engine.find(body.owner_uid, body.effect_key) is not None
                conversation_id = await tasks.work_conversation_id(body.task_id, create=not replay)
            if conversation_id is None:
                raise Conflict(
                    f"harness call {body.effect_key!r} of {body.owner_uid} already exists with different parameters"
                )
        request = CallRequest(
            owner_uid=body.owner_uid,
            effect_key=body.effect_key,
            target=body.target,
            text=body.text,
            conversation_id=conversation_id,
            message_id=body.message_id,
            history=tuple(HistoryEntry(item.kind, item.key, item.text) for item in body.history),
            params=body.params,
            asker=asker,
            timeout=body.timeout,
            task_id=body.task_id,
            workspace=None if body.workspace is None else f"{caller.kind}/{caller.key}/{body.workspace}",
            tools=body.tools,
        )
        call = await engine.start(request)
        if body.wait > 0 and not call.is_terminal:
            call = await engine.wait(call.id, body.wait, stop=stopping)
        return call_body(call)

    @router.get("")
    async def find_calls(
        caller: Annotated[Identity, Depends(current_identity)],
        owner_uid: Annotated[str, Query(min_length=1, max_length=MAX_NAME, description="The owner's UID.")],
        effect_key: Annotated[
            str | None, Query(min_length=1, max_length=MAX_NAME, description="Only the call with this key.")
        ] = None,
    ) -> CallList:
        """The calls of an owner that the caller may see (at most 100, in creation order), or its one call with
        ``effect_key``: how a restarted operator finds a step it started before without naming its parameters."""
        if effect_key is not None:
            found = await engine.find(owner_uid, effect_key)
            calls = [] if found is None else [found]
        else:
            calls = await engine.list_by_owner(owner_uid, limit=FIND_LIMIT)
        seen = [
            call
            for call in calls
            if caller.admin or call.params.get("asker") == caller.text or await responds_for(caller, call)
        ]
        return CallList(data=[call_body(call) for call in seen])

    @router.get("/{call_id}")
    async def get_call(call_id: CallId, caller: Annotated[Identity, Depends(current_identity)]) -> CallBody:
        """The call's state (phase, result or error, deadline, checkpoint)."""
        return call_body(await visible(call_id, caller))

    @router.get("/{call_id}/wait")
    async def wait_call(
        call_id: CallId,
        caller: Annotated[Identity, Depends(current_identity)],
        timeout: Annotated[
            float, Query(gt=0, le=MAX_WAIT, allow_inf_nan=False, description="Seconds to wait at most.")
        ] = DEFAULT_WAIT,
    ) -> CallBody:
        """The call as soon as it is terminal, or as it is when ``timeout`` passes (or the server stops): loop
        until ``phase`` is terminal. Ending a wait never cancels the call."""
        await visible(call_id, caller)
        return call_body(await engine.wait(call_id, timeout, stop=stopping))

    @router.post("/{call_id}/cancel", status_code=202)
    async def cancel_call(call_id: CallId, caller: Annotated[Identity, Depends(current_identity)]) -> CallBody:
        """Ask the call to stop (idempotent). The phase becomes ``cancelled`` once the driver has stopped it."""
        await visible(call_id, caller)
        return call_body(await engine.cancel(call_id))

    @router.post("/{call_id}/gates/{gate_id:path}")
    async def answer_gate(
        call_id: CallId,
        gate_id: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)],
        body: GateAnswerBody,
        caller: Annotated[Identity, Depends(current_identity)],
    ) -> GateAnswered:
        """Answer a permission request of the call: approve (once), always (remember), deny. Only the asker."""
        await engine.answer_gate(call_id, gate_id, body.answer, caller.text)
        return GateAnswered(call_id=call_id, gate_id=gate_id, answer=body.answer)

    @router.post("/{call_id}/questions/{request_id:path}")
    async def answer_question(
        call_id: CallId,
        request_id: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)],
        body: QuestionAnswerBody,
        caller: Annotated[Identity, Depends(current_identity)],
    ) -> QuestionAnswered:
        """Answer a question the call's harness asked (its ask_user tool): free text or one of its choices. Only the
        asker, once."""
        await engine.answer_question(call_id, request_id, body.text, caller.text)
        return QuestionAnswered(call_id=call_id, request_id=request_id, text=body.text)

    @router.get(
        "/{call_id}/stream",
        response_class=EventStreamResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "AgentUE events over SSE"}},
    )
    async def stream_call(
        call_id: CallId,
        caller: Annotated[Identity, Depends(current_identity)],
        after: Annotated[int | None, Query(ge=0, le=2**62)] = None,
        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    ) -> Response:
        """The call's visible events: the message's AgentUE events, each with ``id:`` = its seq."""
        await visible(call_id, caller)
        cursor = after or 0
        if last_event_id is not None:
            value = last_event_id.strip()
            if not value.isdigit():
                raise ApiError("invalid_request", "Last-Event-ID must be a message event seq")
            cursor = int(value)
        if cursor > 0 and not await engine.read_events(call_id, after_seq=cursor - 1, limit=1):
            # Seqs are 1..n without gaps: no event at the cursor means it was never issued for this call, and
            # following it would silently skip the events that later take those seqs.
            raise ApiError(
                "cursor_ahead",
                f"cursor {cursor} is past the call's last event; read the call and resume from a seq it has",
            )
        return EventStreamResponse(_frames(engine, call_id, cursor, heartbeat))

    return router


async def _frames(engine: HarnessEngine, call_id: str, cursor: int, heartbeat: float) -> AsyncGenerator[bytes, None]:
    """SSE frames: a snapshot ``start`` when resuming, the stored events, then ``end`` once the call is over."""
    last = cursor
    ended = False
    try:
        if cursor > 0:
            covered: list[dict[str, Any]] = []
            while len(covered) < cursor:
                page = await engine.read_events(call_id, after_seq=len(covered), limit=min(500, cursor - len(covered)))
                covered.extend(event.event for event in page)
                if not page:
                    break
            state = fold(covered)
            if state.model is not None and state.seq is not None:
                yield sse_frame(StartEvent(seq=state.seq, model=state.model).to_json())
                last = state.seq
        async with contextlib.aclosing(engine.stream(call_id, after_seq=last)) as events:
            async for item in _with_heartbeat(events, heartbeat):
                if item is None:
                    yield HEARTBEAT
                    continue
                last = item.seq
                ended = item.event.get("op") == "end"
                yield sse_frame(item.event, id=item.seq)
    except (StorageError, HarnessEngineError) as exc:
        yield sse_frame({"error": {"type": exc.type, "message": exc.message}}, event="error")
        return
    if not ended:
        yield sse_frame({"op": "end", "seq": last})


async def _with_heartbeat(
    events: AsyncGenerator[MessageEvent, None], heartbeat: float
) -> AsyncGenerator[MessageEvent | None, None]:
    """The events, with ``None`` after each ``heartbeat`` seconds of silence."""
    pending: asyncio.Future[MessageEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=heartbeat)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None and not pending.done():  # this generator's own: ended here, the reader's
            with contextlib.suppress(StopAsyncIteration):  # cancellation passed on
                await cancel_and_wait(pending)
