"""`create_app`: the harness's HTTP/SSE API over one rig (routes, error mapping, lifespan).

The app owns a `ServedSessions` (its live sessions) and an idempotency key store; both live exactly as long as
the app's lifespan and are shut down with it (sessions drained and stopped, so the journal can be closed after).

Must not do: bind sockets or choose hosts (see `loopd.harness.serve._server`), own the rig (the caller does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Body, FastAPI, Header, Query, Response
from fastapi import Path as PathParam

from loopd import __version__
from loopd._infra.docs import install_docs
from loopd._infra.http import EventStreamResponse
from loopd._infra.http_errors import ApiError, drop_validation_responses, error_responses, install_error_handlers
from loopd._infra.redaction import Redactor
from loopd.harness._errors import HarnessError, NoSuchQuestionError
from loopd.harness.actors import RecoveryMode, Rig
from loopd.harness.core import codec
from loopd.harness.serve._errors import from_harness
from loopd.harness.serve._guard import Guard
from loopd.harness.serve._idempotency import (
    IdempotencyStore,
    IdempotencyStoreError,
    MemoryIdempotencyStore,
    SqliteIdempotencyStore,
)
from loopd.harness.serve._model_calls import (
    MAX_PAGE,
    ModelCallStoreError,
    ServedModelCalls,
    SqliteModelCallStore,
    recording_rig,
)
from loopd.harness.serve._operations import answer_gate, cancel_queued_input
from loopd.harness.serve._sessions import ServedSessions, SessionView
from loopd.harness.serve._streaming import event_frames
from loopd.harness.serve._wire import (
    MAX_NAME,
    ActiveLoopRequest,
    CancelResult,
    CreatedSession,
    CreateSessionRequest,
    EventItem,
    ForkedSession,
    ForkSessionRequest,
    GateAnswerRequest,
    GateAnswerResult,
    Health,
    InputAccepted,
    InputRequest,
    InterruptRequest,
    InterruptResult,
    JournalPage,
    LoopInferenceRequest,
    LoopModeRequest,
    LoopSettingResult,
    ModelCallPage,
    RestoredSession,
    SessionBody,
    SessionList,
    SessionSummary,
    UserInputRequest,
    UserInputResult,
    event_item,
    session_body,
)
from loopd.harness.serve._workspaces import SessionWorkspaces

IDEMPOTENCY_FILE: Final = "serve-idempotency.db"
MAX_JOURNAL_PAGE: Final = 1000
MAX_SEQ: Final = 2**62  # journal seqs are SQLite integers; larger cursors are refused, not overflowed

_ERRORS: Final = error_responses()  # every framework status but 422 (a wrong method is 405 invalid_request)

_GATE_ANSWERS: Final[dict[str, Literal["approve", "approve_always", "deny"]]] = {
    "approve": "approve",
    "always": "approve_always",
    "approve_always": "approve_always",
    "deny": "deny",
}

SessionId = Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)]
LoopName = Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)]


def create_app(
    rig: Rig,
    *,
    token: str | None,
    max_body_bytes: int = 1_048_576,
    heartbeat: float = 15.0,
    idempotency_path: Path | None = None,
    idempotency: IdempotencyStore | None = None,
    max_live_sessions: int = 256,
    restore_mode: RecoveryMode = "interrupt",
    stream_queue: int = 256,
    command_timeout: float = 10.0,
    model_calls: bool = True,
    redactor: Redactor | None = None,
    workspaces: SessionWorkspaces | None = None,
    model_calls_path: Path | None = None,
) -> FastAPI:
    """The API for ``rig``. ``token`` (if given) is required as a bearer token on every route but /healthz and
    /openapi.json. Idempotency keys live in ``idempotency_path`` (a SQLite file, kept across restarts), or in
    ``idempotency``, or in memory. The caller keeps the rig (and its journal) open for the app's lifespan.

    ``model_calls``: record each session's model calls (request and attempts) for ``GET
    /v1/sessions/{id}/model-calls``, redacted by ``redactor`` (default: the built-in secret shapes and the token)
    before they are kept: in ``model_calls_path`` (a SQLite file, kept across restarts), or in memory.

    ``workspaces``: each session works in its own directory (`SessionWorkspaces`); None: all in the rig's.
    """
    if heartbeat <= 0:
        raise ValueError("heartbeat must be positive")
    keys: IdempotencyStore
    if idempotency is not None:
        keys = idempotency
    elif idempotency_path is not None:
        keys = SqliteIdempotencyStore(idempotency_path)
    else:
        keys = MemoryIdempotencyStore()
    recorded: ServedModelCalls | None = None
    if model_calls:
        rig = recording_rig(rig)
        store = SqliteModelCallStore(model_calls_path) if model_calls_path is not None else None
        recorded = ServedModelCalls(rig.clock, redactor or Redactor(literals=[token] if token else ()), store)
    sessions = ServedSessions(
        rig, keys, max_live=max_live_sessions, restore_mode=restore_mode, model_calls=recorded, workspaces=workspaces
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            async with asyncio.TaskGroup() as tasks:
                writer = tasks.create_task(recorded.run()) if recorded is not None else None  # model-call records
                try:
                    yield
                finally:
                    await sessions.aclose()
                    if writer is not None:
                        writer.cancel()
        finally:
            if recorded is not None:
                await recorded.aclose()  # writes the records of the last calls
            await keys.aclose()

    app = _HarnessApi(
        bearer=token is not None,
        title="loopd harness",
        version=__version__,
        summary="Sessions, inputs, gates and a resumable event stream over one loopd rig.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.sessions = sessions
    app.state.begin_shutdown = sessions.begin_shutdown  # `open_http_server` ends the streams before it stops
    install_error_handlers(
        app,
        translators={
            HarnessError: from_harness,
            IdempotencyStoreError: _unavailable,
            ModelCallStoreError: _unavailable,
            codec.CodecError: _unavailable,
        },
    )
    app.include_router(_routes(sessions, heartbeat=heartbeat, stream_queue=stream_queue, timeout=command_timeout))
    install_docs(app)  # Swagger UI at /docs from bundled assets (FastAPI's own page loads them from a CDN)
    app.add_middleware(Guard, token=token, max_body_bytes=max_body_bytes)
    return app


class _HarnessApi(FastAPI):
    """FastAPI whose OpenAPI document says what the app does: invalid requests are 400 (never 422), and the
    bearer scheme is declared when a token is required."""

    def __init__(self, *, bearer: bool, **options: Any) -> None:
        super().__init__(**options)
        self._bearer = bearer

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is not None:
            return self.openapi_schema
        schema = super().openapi()
        drop_validation_responses(schema)
        if self._bearer:
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
        self.openapi_schema = schema
        return schema


def sessions_of(app: FastAPI) -> ServedSessions:
    sessions = app.state.sessions
    assert isinstance(sessions, ServedSessions)
    return sessions


# --- errors ----------------------------------------------------------------------------------------------------


def _unavailable(exc: Exception) -> ApiError:
    return ApiError("service_unavailable", str(exc))


# --- routes ----------------------------------------------------------------------------------------------------


def _body(view: SessionView) -> dict[str, Any]:
    return session_body(
        view.state, status=view.status, live=view.live, created_at=view.created_at, session_id=view.session_id
    )


def _routes(sessions: ServedSessions, *, heartbeat: float, stream_queue: int, timeout: float) -> APIRouter:
    router = APIRouter(responses=_ERRORS)

    @router.get("/healthz", tags=["server"])
    async def healthz() -> Health:
        """Liveness; needs no token."""
        return Health(status="ok", live_sessions=sessions.live_count)

    @router.post("/v1/sessions", status_code=201, tags=["sessions"])
    async def create_session(
        response: Response,
        body: Annotated[CreateSessionRequest | None, Body()] = None,
        idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
    ) -> CreatedSession:
        """Start a session (and submit its optional first input).

        With ``Idempotency-Key`` the same key returns the same session: 201 the first time, 200 after (also across
        restarts); the same key with a different body is 409.
        """
        created = await sessions.create(body or CreateSessionRequest(), key=idempotency_key)
        response.status_code = 201 if created.created else 200
        response.headers["Location"] = f"/v1/sessions/{created.session_id}"
        view = await sessions.view(created.session_id)
        return CreatedSession(**_body(view), input_command_id=created.command_id)

    @router.get("/v1/sessions", tags=["sessions"])
    async def list_sessions(limit: Annotated[int, Query(ge=1, le=500)] = 100) -> SessionList:
        """Sessions in the journal, newest first, with their status on this server."""
        infos = await sessions.io(sessions.rig.journal.sessions(limit=limit))
        items = [
            SessionSummary(
                id=info.session_id,
                created_at=info.created_at,
                last_seq=info.last_seq,
                live=sessions.live(info.session_id) is not None,
                status=await sessions.status_of(info.session_id, info.last_seq),
            )
            for info in infos
        ]
        return SessionList(items=items)

    @router.get("/v1/sessions/{session_id}", tags=["sessions"])
    async def get_session(session_id: SessionId) -> SessionBody:
        """Status, last journal seq, usage, loops (running turn, queued inputs) and open gates."""
        return SessionBody(**_body(await sessions.view(session_id)))

    @router.post("/v1/sessions/{session_id}/restore", tags=["sessions"])
    async def restore_session(session_id: SessionId) -> RestoredSession:
        """Bring a dormant or faulted session back (an open turn is interrupted); a live one is left as it is."""
        _session, restored = await sessions.restore(session_id)
        return RestoredSession(**_body(await sessions.view(session_id)), restored=restored)

    @router.post("/v1/sessions/{session_id}/fork", status_code=201, tags=["sessions"])
    async def fork_session(
        session_id: SessionId,
        body: ForkSessionRequest,
        response: Response,
        idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255)] = None,
    ) -> ForkedSession:
        """Fork a session at journal seq ``at_seq``: a new live session whose history is this one's up to there
        (shared in the journal, not copied), with its own journal after it. The seq must be a settled point (every
        loop idle): one inside a turn is 400, naming the last settled seq before it. With ``Idempotency-Key`` the
        same key returns the same fork (201, then 200); another body with it is 409.

        ``workspace``: ``keep`` (default) the workspace as it is now; ``new`` / ``overwrite`` restore the parent's
        workspace snapshot at ``at_seq`` into the fork's own new directory / over the parent's (a server started
        with ``--snapshots``; 400 when it cannot be done, and then no fork is made).
        """
        forked = await sessions.fork(session_id, body, key=idempotency_key)
        response.status_code = 201 if forked.created else 200
        response.headers["Location"] = f"/v1/sessions/{forked.session_id}"
        view = await sessions.view(forked.session_id)
        info = await sessions.io(sessions.rig.journal.session(forked.session_id))
        parent = (info.parent_id or session_id, info.parent_seq) if info is not None else (session_id, body.at_seq)
        return ForkedSession(**_body(view), parent_id=parent[0], parent_seq=parent[1], workspace=body.workspace)

    @router.post("/v1/sessions/{session_id}/inputs", status_code=202, tags=["inputs"])
    async def submit_input(session_id: SessionId, body: InputRequest) -> InputAccepted:
        """Queue a user input; its turn's events arrive on the event stream. Restores a dormant session."""
        session = await sessions.ensure_live(session_id)
        command_id = await sessions.submit(session, body.text, loop=body.loop)
        return InputAccepted(session_id=session.id, command_id=command_id, loop=body.loop or session.default_loop)

    @router.delete("/v1/sessions/{session_id}/inputs/{command_id}", tags=["inputs"])
    async def cancel_input(
        session_id: SessionId, command_id: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)]
    ) -> CancelResult:
        """Cancel an input that is still queued (409 once it started, 404 for an unknown id)."""
        session = await sessions.ensure_live(session_id)
        await cancel_queued_input(sessions, session, command_id, timeout=timeout)
        return CancelResult(command_id=command_id, status="cancelled")

    @router.post("/v1/sessions/{session_id}/interrupt", tags=["inputs"])
    async def interrupt(
        session_id: SessionId, body: Annotated[InterruptRequest | None, Body()] = None
    ) -> InterruptResult:
        """Stop the running turn (of one loop, or of all) and cancel queued inputs."""
        request = body or InterruptRequest()
        session = await sessions.ensure_live(session_id)
        if request.loop is not None and request.loop not in session.loops:
            raise ApiError("invalid_request", f"session {session.id} has no loop {request.loop!r}")
        stopped = await session.interrupt(loop=request.loop, reason=request.reason)
        return InterruptResult(session_id=session.id, interrupted=stopped)

    @router.post(
        "/v1/sessions/{session_id}/gates/{gate_id:path}",
        tags=["gates"],
        responses={202: {"model": GateAnswerResult, "description": "answer accepted, not resolved yet"}},
    )
    async def answer(
        session_id: SessionId,
        gate_id: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)],
        body: GateAnswerRequest,
        response: Response,
    ) -> GateAnswerResult:
        """Answer an open gate: approve (once), always (remember for this workspace), or deny. An answer binds once."""
        session = await sessions.ensure_live(session_id)
        wire = _GATE_ANSWERS[body.answer]
        outcome = await answer_gate(sessions, session, gate_id, wire, timeout=timeout)
        resolved = outcome.resolved
        if resolved is None:
            response.status_code = 202
            return GateAnswerResult(gate_id=gate_id, status="pending")
        return GateAnswerResult(
            gate_id=gate_id, status="resolved", answer=resolved.answer, granted=resolved.granted, reason=resolved.reason
        )

    @router.post(
        "/v1/sessions/{session_id}/questions/{request_id:path}",
        tags=["gates"],
        status_code=202,
        responses={202: {"model": UserInputResult, "description": "answer accepted; the turn goes on"}},
    )
    async def provide_user_input(
        session_id: SessionId,
        request_id: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)],
        body: UserInputRequest,
    ) -> UserInputResult:
        """Answer an open ask_user question: the text becomes the question's tool result (the first answer binds)."""
        session = await sessions.ensure_live(session_id)
        try:
            await session.provide_user_input(request_id, body.text)
        except NoSuchQuestionError as exc:
            raise ApiError("not_found", f"{exc} (answered already, past its deadline, or never asked)") from exc
        return UserInputResult(request_id=request_id, status="accepted")

    @router.post("/v1/sessions/{session_id}/active-loop", tags=["loops"])
    async def set_active_loop(session_id: SessionId, body: ActiveLoopRequest) -> LoopSettingResult:
        """Make a loop the session's active loop: inputs that name no loop go there (journaled, kept on restore)."""
        session = await sessions.ensure_live(session_id)
        await session.set_active_loop(body.loop)
        return LoopSettingResult(
            session_id=session.id, loop=body.loop, setting="active_loop", value=body.loop, status="set"
        )

    @router.post("/v1/sessions/{session_id}/loops/{loop}/mode", status_code=202, tags=["loops"])
    async def set_loop_mode(session_id: SessionId, loop: LoopName, body: LoopModeRequest) -> LoopSettingResult:
        """Switch a loop to one of its modes (400 for a mode it does not declare); the running step keeps its mode,
        the next one uses the new mode (e.g. ``plan``: only read-only tools are offered and may run)."""
        session = await sessions.ensure_live(session_id)
        await session.set_loop_mode(body.mode, loop=loop)
        return LoopSettingResult(session_id=session.id, loop=loop, setting="mode", value=body.mode, status="accepted")

    @router.post("/v1/sessions/{session_id}/loops/{loop}/inference", status_code=202, tags=["loops"])
    async def change_loop_inference(
        session_id: SessionId, loop: LoopName, body: LoopInferenceRequest
    ) -> LoopSettingResult:
        """Switch a loop's model from its next model call on (400 for a model outside the loop's allowed ones)."""
        session = await sessions.ensure_live(session_id)
        await session.change_loop_inference(body.model, loop=loop)
        return LoopSettingResult(session_id=session.id, loop=loop, setting="model", value=body.model, status="accepted")

    @router.get("/v1/sessions/{session_id}/journal", tags=["events"])
    async def journal_page(
        session_id: SessionId,
        from_seq: Annotated[int, Query(ge=1, le=MAX_SEQ)] = 1,
        limit: Annotated[int, Query(ge=1, le=MAX_JOURNAL_PAGE)] = 100,
    ) -> JournalPage:
        """A page of stored events from ``from_seq``; continue with ``next_from_seq``."""
        records = await sessions.read(session_id, from_seq, limit + 1)
        info = await sessions.io(sessions.rig.journal.session(session_id))
        page = records[:limit]
        items: list[EventItem] = [event_item(r.seq, codec.decode(r.kind, r.version, r.data)) for r in page]
        return JournalPage(
            items=items,
            next_from_seq=page[-1].seq + 1 if page else from_seq,
            has_more=len(records) > limit,
            last_seq=info.last_seq if info is not None else (page[-1].seq if page else 0),
        )

    @router.get("/v1/sessions/{session_id}/model-calls", tags=["events"])
    async def model_calls(
        session_id: SessionId,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    ) -> ModelCallPage:
        """The session's model calls with an index above ``after`` (continue with ``next_after``): each one's
        request (model, system prompt, parameters, tools, messages) and attempts (every provider failure, retry or
        fallback step, then the reply: text, tool calls, usage, finish reason, provider request id), redacted.
        ``after_seq``: the journal's last seq when the call ended. Within a page, ``request.extends`` = how many of
        the previous item's messages this request starts with (``messages`` holds the rest). Kept bounded (the oldest
        calls of a session are dropped first), across restarts by ``loopd harness serve``; none when recording is
        off.
        """
        if not await sessions.exists(session_id):
            raise ApiError("not_found", f"no session {session_id!r}")
        if sessions.model_calls is None:
            return ModelCallPage(items=[], next_after=after, has_more=False)
        return ModelCallPage(**await sessions.model_calls.page(session_id, after, limit))

    @router.get(
        "/v1/sessions/{session_id}/events",
        status_code=200,
        tags=["events"],
        response_class=EventStreamResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
    )
    async def events(
        session_id: SessionId,
        from_seq: Annotated[int | None, Query(ge=1, le=MAX_SEQ)] = None,
        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    ) -> EventStreamResponse:
        """Server-sent events: stored events carry ``id:`` = journal seq; resume with ``Last-Event-ID``.

        Without ``Last-Event-ID`` or ``from_seq`` the stream starts after the session's current last seq.
        """
        start = await _start_seq(sessions, session_id, from_seq, last_event_id)
        frames = event_frames(sessions, session_id, from_seq=start, heartbeat=heartbeat, queue_size=stream_queue)
        return EventStreamResponse(frames, wait_for_first_frame=True)  # answer once attached: see `event_frames`

    return router


async def _start_seq(sessions: ServedSessions, session_id: str, from_seq: int | None, last_event_id: str | None) -> int:
    """The first seq to send; a cursor past the session's last stored seq is ``cursor_ahead`` (it belongs to another
    session or journal, and following it would silently skip the events that take those seqs later)."""
    resume: int | None = None
    if last_event_id is not None:
        value = last_event_id.strip()
        if not value.isdigit() or int(value) >= MAX_SEQ:
            raise ApiError("invalid_request", "Last-Event-ID must be a journal seq (a non-negative integer)")
        resume = int(value) + 1
    else:
        resume = from_seq
    session = sessions.live(session_id)
    if session is not None:
        last_seq = session.last_seq
    else:
        info = await sessions.io(sessions.rig.journal.session(session_id))
        if info is None:
            raise ApiError("not_found", f"no session {session_id!r}")
        last_seq = info.last_seq
    if resume is None:
        return last_seq + 1
    if resume > last_seq + 1:
        sent = f"Last-Event-ID {resume - 1}" if last_event_id is not None else f"from_seq {resume}"
        raise ApiError(
            "cursor_ahead",
            f"{sent} is past the session's last stored event ({last_seq}); "
            "resume from a seq this session sent, or read its journal from from_seq=1",
        )
    return resume
