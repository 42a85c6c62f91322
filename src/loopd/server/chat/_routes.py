"""The chat routes: conversations, chat requests (JSON or SSE), the conversation stream and snapshot (`chat_router`);
the Task API for responders (`task_router`).

Must not do: business rules (``ConversationReader``, ``ChatRequests`` and ``TaskApi`` own them); this module
translates HTTP to service calls and back.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi import Path as PathParam

from loopd._infra.http import DirectChannel
from loopd._infra.http_errors import ApiError
from loopd.server.chat._reader import ConversationReader
from loopd.server.chat._records import ChatRequest, StreamPage
from loopd.server.chat._requests import ChatRequests, text_content
from loopd.server.chat._stream import conversation_frames
from loopd.server.chat._tasks import OutputSpec, TaskApi, check_responder
from loopd.server.chat._wire import (
    MAX_KEY,
    ChatAccepted,
    ChatRequestBody,
    CompleteRequest,
    CompletionBody,
    ConversationBody,
    ConversationList,
    ConversationModeRequest,
    CreateConversationRequest,
    EmitAccepted,
    EmitRequest,
    MessageList,
    OutputCreated,
    OutputEnded,
    OutputEndRequest,
    OutputRequest,
    RenameConversationRequest,
    SnapshotBody,
    TaskContextBody,
    TaskList,
    conversation_body,
    message_body,
    task_summary,
)
from loopd.server.http import ERROR_RESPONSES, EventStreamResponse, Identity, current_identity, trusted_identity

MAX_CURSOR: Final = 2**62
TASK_ID_HEADER: Final = "X-Loopd-Task-ID"

Id = Annotated[str, PathParam(min_length=1, max_length=MAX_KEY)]
After = Annotated[str | None, Query(min_length=1, max_length=MAX_KEY, description="Last id of the previous page.")]
Caller = Annotated[Identity, Depends(current_identity)]
Responder = Annotated[Identity, Depends(trusted_identity)]


Limit = Annotated[int, Query(ge=1, le=1000, description="Page size.")]


def parse_cursor(last_event_id: str | None, after: int | None) -> int | None:
    """The resume cursor: ``Last-Event-ID`` wins over ``?after=``; None when neither was sent."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not text.isdigit() or int(text) > MAX_CURSOR:
            raise ApiError("invalid_request", f"Last-Event-ID must be a conversation cursor (an integer), not {text!r}")
        return int(text)
    return after


def check_cursor(resume: int, last_cursor: int) -> None:
    """A resume cursor past the conversation's last stored event is ``cursor_ahead``: it was not issued for this
    conversation (or this server), and following it would silently skip the events that take those cursors."""
    if resume > last_cursor:
        raise ApiError(
            "cursor_ahead",
            f"cursor {resume} is past the conversation's last event ({last_cursor}); "
            "load the snapshot and resume from its cursor",
        )


def _wants_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "").lower()


def _accepted(chat: ChatRequest) -> ChatAccepted:
    return ChatAccepted(
        task_id=chat.task_id,
        conversation_id=chat.conversation.id,
        input=message_body(chat.input),
        response=message_body(chat.response),
        cursor=chat.cursor,
    )


def chat_router(conversations: ConversationReader, chat: ChatRequests, *, heartbeat: float = 15.0) -> APIRouter:
    """Routes over ``conversations`` (reads, streams) and ``chat`` (new conversations, chat requests); streams
    send a heartbeat comment after ``heartbeat`` quiet seconds."""
    if not (heartbeat > 0):
        raise ValueError("heartbeat must be positive")
    router = APIRouter(responses=ERROR_RESPONSES)

    # -- conversations -------------------------------------------------------------------------------------

    @router.post("/v1/conversations", status_code=201, tags=["conversations"])
    async def create_conversation(
        caller: Caller, body: Annotated[CreateConversationRequest | None, Body()] = None
    ) -> ConversationBody:
        """A new conversation owned by the caller (a user)."""
        created = await chat.create_conversation(caller, name=(body or CreateConversationRequest()).name)
        return conversation_body(created)

    @router.get("/v1/conversations", tags=["conversations"])
    async def list_conversations(
        caller: Caller,
        after: After = None,
        limit: Limit = 50,
        task_id: Annotated[str | None, Query(min_length=1, max_length=MAX_KEY)] = None,
    ) -> ConversationList:
        """The caller's conversations, newest first; with ``task_id``: that Task's work conversation (if any)."""
        if task_id is not None:
            work = await conversations.work_conversation(caller, task_id)
            return ConversationList(data=[] if work is None else [conversation_body(work)], next_after=None)
        page = await conversations.list_conversations(caller, after=after, limit=limit)
        origins = await conversations.fork_origins(page)  # forks name their parent conversation and message
        return ConversationList(
            data=[conversation_body(c, origins.get(c.id)) for c in page],
            next_after=page[-1].id if len(page) == limit else None,
        )

    @router.get("/v1/conversations/{conversation_id}", tags=["conversations"])
    async def get_conversation(caller: Caller, conversation_id: Id) -> ConversationBody:
        found = await conversations.conversation(caller, conversation_id)
        return conversation_body(found, (await conversations.fork_origins([found])).get(found.id))

    @router.patch("/v1/conversations/{conversation_id}", tags=["conversations"])
    async def rename_conversation(
        caller: Caller, conversation_id: Id, body: RenameConversationRequest
    ) -> ConversationBody:
        """Rename one of the caller's conversations (404 for anyone else's; 400 for a Task's work conversation)."""
        return conversation_body(await chat.rename_conversation(caller, conversation_id, name=body.name))

    @router.put("/v1/conversations/{conversation_id}/mode", tags=["conversations"])
    async def set_conversation_mode(
        caller: Caller, conversation_id: Id, body: ConversationModeRequest
    ) -> ConversationBody:
        """Set the mode the conversation's built-in harness calls start in from its next question on (a call
        already answering keeps its mode: a mode never changes mid-turn). Only its owner: 404 for anyone else's
        conversation (as for posting), 403 for an operator, 400 for a Task's work conversation or an unknown mode."""
        changed = await chat.set_mode(caller, conversation_id, mode=body.mode)
        return conversation_body(changed, (await conversations.fork_origins([changed])).get(changed.id))

    @router.get("/v1/conversations/{conversation_id}/messages", tags=["conversations"])
    async def list_messages(
        caller: Caller, conversation_id: Id, after: After = None, limit: Limit = 100
    ) -> MessageList:
        """Messages in id order (ids are UUIDv7, so this is creation order)."""
        page = await conversations.messages(caller, conversation_id, after=after, limit=limit)
        return MessageList(data=[message_body(m) for m in page], next_after=page[-1].id if len(page) == limit else None)

    @router.post(
        "/v1/conversations/{conversation_id}/messages",
        tags=["conversations"],
        status_code=201,
        response_model=None,
        responses={
            201: {"model": ChatAccepted, "description": "The question was stored and its Task created."},
            200: {
                "content": {"text/event-stream": {}},
                "description": "With Accept: text/event-stream: an ack, then the conversation's events until the "
                "response ends.",
            },
        },
    )
    async def post_message(
        caller: Caller,
        conversation_id: Id,
        body: ChatRequestBody,
        request: Request,
        last_event_id: Annotated[str | None, Header(max_length=40)] = None,
    ) -> Response:
        """Ask ``target`` a question (or, with ``task_id``, observe one). The reply header ``X-Loopd-Task-ID``
        names the task; with ``Accept: text/event-stream`` the answer streams in the same response."""
        resume = parse_cursor(last_event_id, None) if _wants_stream(request) else None
        if resume is not None:  # checked before anything is stored: a refused request asks nothing
            check_cursor(resume, await conversations.check_readable(caller, conversation_id))
        if body.task_id is not None:
            asked = await chat.observe(caller, conversation_id, body.task_id)
            status = 200
        else:
            assert body.target is not None  # the body model guarantees it
            content = body.content if body.content is not None else text_content(body.text or "")
            asked = await chat.ask(
                caller, conversation_id, target_kind=body.target.kind, target_key=body.target.key, content=content
            )
            status = 201
        headers = {TASK_ID_HEADER: asked.task_id}
        if not _wants_stream(request):
            return Response(
                _accepted(asked).model_dump_json(), status_code=status, media_type="application/json", headers=headers
            )
        ack = {
            "task_id": asked.task_id,
            "conversation_id": asked.conversation.id,
            "input_message_id": asked.input.id,
            "response_message_id": asked.response.id,
            "cursor": asked.cursor,
        }
        frames = conversation_frames(
            conversations,
            asked.conversation.id,
            after=asked.cursor if resume is None else resume,
            heartbeat=heartbeat,
            until_message_id=asked.response.id,
            ack=ack,
            may_have_ended=status == 200 or resume is not None,  # a question asked now ends after its own cursor
            first=None
            if resume is not None or not asked.opened
            else StreamPage(list(asked.opened), asked.opened[-1].event.cursor),
        )
        return EventStreamResponse(frames, headers=headers)

    @router.get(
        "/v1/conversations/{conversation_id}/stream",
        tags=["conversations"],
        response_model=None,
        responses={200: {"content": {"text/event-stream": {}}, "description": "Every message event, live."}},
    )
    async def stream(
        caller: Caller,
        conversation_id: Id,
        after: Annotated[int | None, Query(ge=0, le=MAX_CURSOR, description="Resume after this cursor.")] = None,
        last_event_id: Annotated[str | None, Header(max_length=40)] = None,
    ) -> Response:
        """Every event of every message of the conversation, from durable state; resume with ``Last-Event-ID``
        (or ``?after=``). Without either, the stream starts at the current end (load the snapshot first)."""
        current = await conversations.check_readable(caller, conversation_id)
        resume = parse_cursor(last_event_id, after)
        if resume is not None:
            check_cursor(resume, current)
        direct = DirectChannel()  # the conversation's feed writes each chunk straight to this connection
        frames = conversation_frames(
            conversations,
            conversation_id,
            after=current if resume is None else resume,
            heartbeat=heartbeat,
            direct=direct,
        )
        return EventStreamResponse(frames, direct=direct)

    @router.get("/v1/conversations/{conversation_id}/snapshot", tags=["conversations"])
    async def snapshot(caller: Caller, conversation_id: Id) -> SnapshotBody:
        """Every message with its current content, and the cursor to resume the stream from."""
        found = await conversations.snapshot(caller, conversation_id)
        return SnapshotBody(
            conversation=conversation_body(found.conversation),
            messages=[message_body(m) for m in found.messages],
            cursor=found.cursor,
        )

    return router


def task_router(tasks: TaskApi) -> APIRouter:
    """``/v1/tasks/{task_id}…``: what a Task's responder (an operator or harness with a token) reads and writes."""
    router = APIRouter(responses=ERROR_RESPONSES)

    @router.get("/v1/tasks/{task_id}", tags=["tasks"])
    async def task_context(
        caller: Responder,
        task_id: Id,
        messages: Annotated[
            int,
            Query(
                ge=0,
                le=100,
                description="Also return the first N of the Task's own messages (as GET …/messages would), read in "
                "the same snapshot: a responder's first read then needs no second request.",
            ),
        ] = 0,
    ) -> TaskContextBody:
        """The Task's input, response, conversation and history through the input (and, with ``messages``, the
        first messages of the Task itself). 404 until the question has committed (an operator may see the Task
        first): requeue and retry."""
        context = await tasks.task_context(task_id, messages=messages)
        check_responder(caller, context.response)
        return TaskContextBody(
            task_id=task_id,
            conversation=conversation_body(context.conversation),
            input=message_body(context.input),
            response=message_body(context.response),
            history=[message_body(m) for m in context.history],
            history_from_message_id=context.history[0].id if context.history else None,
            has_earlier=context.has_earlier,
            messages=None if context.messages is None else [message_body(m) for m in context.messages],
            more_messages=context.more_messages,
        )

    @router.get("/v1/tasks/{task_id}/messages", tags=["tasks"])
    async def task_messages(caller: Responder, task_id: Id, after: After = None, limit: Limit = 100) -> MessageList:
        """Every message of the Task (main and work conversation) in id order."""
        check_responder(caller, await tasks.response_of(task_id))
        page = await tasks.task_messages(task_id, after=after, limit=limit)
        return MessageList(data=[message_body(m) for m in page], next_after=page[-1].id if len(page) == limit else None)

    @router.get("/v1/tasks/{task_id}/followups", tags=["tasks"])
    async def task_followups(caller: Responder, task_id: Id, after: After = None, limit: Limit = 100) -> MessageList:
        """User inputs posted to the Task's conversation after its own input (context added while it works)."""
        check_responder(caller, await tasks.response_of(task_id))
        page = await tasks.followups(task_id, after=after, limit=limit)
        return MessageList(data=[message_body(m) for m in page], next_after=page[-1].id if len(page) == limit else None)

    @router.post("/v1/tasks/{task_id}/events", tags=["tasks"])
    async def emit_events(caller: Responder, task_id: Id, body: EmitRequest) -> EmitAccepted:
        """Append ``set`` / ``append`` / ``error`` events to the response (seq assigned by the server). Human
        blocks and ``meta.human`` are refused (400); once completion has begun, 409."""
        emitted = await tasks.emit(task_id, body.events, actor=caller)
        last = emitted.events[-1] if emitted.events else None
        return EmitAccepted(
            message_id=emitted.message.id,
            seq=last.seq if last is not None else 0,
            cursor=last.cursor if last is not None else 0,
            revision=emitted.message.revision,
        )

    @router.post("/v1/tasks/{task_id}/complete", tags=["tasks"])
    async def complete(
        caller: Responder, task_id: Id, body: Annotated[CompleteRequest | None, Body()] = None
    ) -> CompletionBody:
        """Finish the answer and delete the Task. ``events`` (``set`` / ``append``) are the response's last ones,
        stored with the completion in one transaction. Idempotent (a repeat does not apply ``events`` again); 409
        while Human questions are pending (unless ``error`` is given, which ends them with
        ``failure(task_ended)``); 503 when the Task could not be deleted (the completion resumes by itself)."""
        error = None if body is None or body.error is None else body.error.model_dump()
        events = None if body is None else body.events
        response = await tasks.complete(task_id, error=error, events=events, actor=caller)
        return CompletionBody(task_id=task_id, delivery_state=response.delivery_state, response=message_body(response))

    # -- the operator surface ------------------------------------------------------------------------------

    @router.get("/v1/tasks", tags=["tasks"])
    async def list_tasks(
        caller: Responder,
        target_kind: Annotated[Literal["operator", "harness"], Query(description="The responder's kind.")],
        target_key: Annotated[str, Query(min_length=1, max_length=MAX_KEY, description="The responder's key.")],
        after: Annotated[str | None, Query(min_length=1, max_length=MAX_KEY, description="Last task id seen.")] = None,
        limit: Limit = 100,
    ) -> TaskList:
        """The Tasks addressed to a responder whose delivery is not ``closed``, in task id order. Only that
        responder itself (its token, or the admin acting as it) or the admin may list them (403)."""
        page = await tasks.list_tasks(caller, target_kind, target_key, after=after, limit=limit)
        return TaskList(
            data=[task_summary(m) for m in page], next_after=page[-1].task_id if len(page) == limit else None
        )

    @router.post(
        "/v1/tasks/{task_id}/outputs",
        tags=["tasks"],
        status_code=201,
        responses={200: {"model": OutputCreated, "description": "The same key with the same parameters again."}},
    )
    async def put_output(caller: Responder, task_id: Id, body: OutputRequest, response: Response) -> OutputCreated:
        """Speak (``stream`` false: a complete message) or Tell (``stream`` true: a streaming output) as the
        caller in the Task's ``main`` conversation (a reply to the input) or its ``work`` conversation. 201;
        200 with the same message when the key and the parameters repeat; 409 when they differ, or for a new
        key once the Task's completion has begun."""
        spec = OutputSpec(
            key=body.key,
            conversation=body.conversation,
            stream=body.stream,
            text=body.text,
            content=body.content,
            title=body.title,
        )
        message, created = await tasks.put_output(task_id, spec, actor=caller)
        response.status_code = 201 if created else 200
        return OutputCreated(created=created, message=message_body(message))

    @router.post("/v1/tasks/{task_id}/outputs/{message_id}/events", tags=["tasks"])
    async def emit_output(caller: Responder, task_id: Id, message_id: Id, body: EmitRequest) -> EmitAccepted:
        """Append ``set`` / ``append`` / ``error`` events to an output opened by key (no Human blocks); 409 once
        it has ended or the Task's completion has begun."""
        emitted = await tasks.emit_output(task_id, message_id, body.events, actor=caller)
        last = emitted.events[-1] if emitted.events else None
        return EmitAccepted(
            message_id=emitted.message.id,
            seq=last.seq if last is not None else 0,
            cursor=last.cursor if last is not None else 0,
            revision=emitted.message.revision,
        )

    @router.post("/v1/tasks/{task_id}/outputs/{message_id}/end", tags=["tasks"])
    async def end_output(
        caller: Responder,
        task_id: Id,
        message_id: Id,
        body: Annotated[OutputEndRequest | None, Body()] = None,
    ) -> OutputEnded:
        """End an output opened by key: ``completed``, or ``failed`` with ``error``. Once: the same end again is
        answered with the message as it is; a different one is 409."""
        error = None if body is None or body.error is None else body.error.model_dump()
        message = await tasks.end_output(task_id, message_id, error=error, actor=caller)
        return OutputEnded(message=message_body(message))

    return router
