"""``/v1/ledger``: the audit trail, read-only: events (``""``), the usage roll-up (``/usage``), the trail as a tree
of lanes → turns → actions → attempts (``/tree``), a conversation's cost over time (``/series``), one model attempt's
full request and reply (``/attempt``, the stored artifacts resolved) and spend grouped by conversation, target or
model (``/cost``, admin only)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict

from loopd.server.http import ERROR_RESPONSES, ApiError, Identity, current_identity
from loopd.server.ledger import (
    ATTEMPT_TERMINAL_EVENTS,
    Action,
    Attempt,
    CostRow,
    Event,
    Lane,
    LedgerStore,
    LedgerStructure,
    Scope,
    Turn,
    UsageTotals,
    parse_duration,
    ref_from_payload,
    ref_payload,
)
from loopd.server.storage import InvalidRecord, NotFound, loads

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


class _Message(Protocol):
    @property
    def task_id(self) -> str | None: ...

    @property
    def id(self) -> str: ...


class ConversationReadCheck(Protocol):
    """Who may read a conversation's trail (``loopd.server.chat.ConversationReader`` is one)."""

    async def check_readable(self, caller: Identity, conversation_id: str) -> int: ...

    async def messages(
        self, reader: Identity, conversation_id: str, *, after: str | None = None, limit: int = 100
    ) -> Sequence[_Message]: ...


# --- the tree and the series (typed: the web UI's ledger view reads them) ------------------------------------------

MAX_SERIES_TASKS = 200
"""The series covers at most this many Tasks of a conversation (the latest)."""
_Status = Literal["running", "completed", "failed"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AttemptUsage(_Body):
    input_tokens: int
    output_tokens: int
    cost_usd: float


class AttemptError(_Body):
    code: str | None
    message: str | None


class ArtifactRefBody(_Body):
    uri: str
    sha256: str
    size: int
    content_type: str


class AttemptNode(_Body):
    id: str
    attempt_no: int | None
    status: Literal["requested", "completed", "failed"]
    resolved: bool
    requested_at: datetime | None
    ended_at: datetime | None
    usage: AttemptUsage | None
    usage_estimated: bool
    error: AttemptError | None
    model: str | None = None
    provider: str | None = None
    request: ArtifactRefBody | None = None
    reply: ArtifactRefBody | None = None
    finish_reason: str | None = None
    provider_request_id: str | None = None
    duration_ms: float | None = None


class ActionNode(_Body):
    id: str
    type: str
    name: str | None
    parent_action_id: str | None
    effect_kind: str
    idempotency: str
    created_at: datetime | None
    status: _Status
    attempts: list[AttemptNode]


class TurnNode(_Body):
    id: str
    created_at: datetime | None
    status: _Status
    actions: list[ActionNode]


class LaneNode(_Body):
    id: str
    name: str
    task_id: str | None
    conversation_id: str | None
    harness_call_id: str | None
    attributes: dict[str, Any]
    created_at: datetime | None
    turns: list[TurnNode]


class LedgerTree(_Body):
    task_id: str | None
    lanes: list[LaneNode]
    usage: dict[str, Any]


class CostPoint(_Body):
    at: datetime
    task_id: str | None
    call_id: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    usage_estimated: bool


class CostSeries(_Body):
    conversation_id: str
    points: list[CostPoint]


def _status_of(events: Sequence[Event], kind: str, parts: Sequence[str] = ()) -> _Status:
    """``failed`` / ``completed`` from the subject's own terminal event; without one, from its ``parts`` (an action's
    attempts, a turn's actions) once they have all ended: the last one's outcome. Else ``running``."""
    names = {event.event_type for event in events}
    if f"{kind}.failed" in names:
        return "failed"
    if f"{kind}.completed" in names:
        return "completed"
    ended = [part for part in parts if part in {"completed", "failed"}]
    if parts and len(ended) == len(parts):
        return "failed" if ended[-1] == "failed" else "completed"
    return "running"


def _usage_of(payload: dict[str, Any]) -> AttemptUsage | None:
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    return AttemptUsage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cost_usd=float(usage.get("cost_usd") or 0.0),
    )


def _attempt_node(attempt: Attempt, events: Sequence[Event]) -> AttemptNode:
    requested = next((e for e in events if e.event_type == "attempt.requested"), None)
    terminal = next((e for e in events if e.event_type in ATTEMPT_TERMINAL_EVENTS), None)
    payload = terminal.payload if terminal is not None else {}
    error = payload.get("error")
    asked = requested.payload if requested is not None else {}
    request_ref, reply_ref = ref_from_payload(asked.get("request")), ref_from_payload(payload.get("reply"))
    duration = payload.get("duration_ms")
    return AttemptNode(
        id=attempt.id,
        attempt_no=attempt.attempt_no,
        status="requested"
        if terminal is None
        else "completed"
        if terminal.event_type == "attempt.completed"
        else "failed",
        resolved=terminal is not None or requested is None,
        requested_at=requested.occurred_at if requested is not None else None,
        ended_at=terminal.occurred_at if terminal is not None else None,
        usage=_usage_of(payload),
        usage_estimated=payload.get("usage_estimated") is True,
        error=(
            AttemptError(code=_text(error.get("code")), message=_text(error.get("message")))
            if isinstance(error, dict)
            else None
        ),
        model=_text(asked.get("model")),
        provider=_text(asked.get("provider")),
        request=ArtifactRefBody(**ref_payload(request_ref)) if request_ref is not None else None,
        reply=ArtifactRefBody(**ref_payload(reply_ref)) if reply_ref is not None else None,
        finish_reason=_text(payload.get("finish_reason")),
        provider_request_id=_text(payload.get("provider_request_id")),
        duration_ms=float(duration) if isinstance(duration, int | float) and not isinstance(duration, bool) else None,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def build_tree(
    task_id: str | None, lanes: Sequence[Lane], structure: LedgerStructure, events: Sequence[Event], usage: UsageTotals
) -> LedgerTree:
    """The trail as lanes → turns → actions → attempts, each with its status from its events."""
    by_subject: dict[str, list[Event]] = {}
    for event in events:
        by_subject.setdefault(event.subject_id, []).append(event)
    attempts: dict[str, list[Attempt]] = {}
    for attempt in structure.attempts:
        attempts.setdefault(attempt.action_id, []).append(attempt)
    actions: dict[str, list[Action]] = {}
    for action in structure.actions:
        actions.setdefault(action.turn_id, []).append(action)
    turns: dict[str, list[Turn]] = {}
    for turn in structure.turns:
        turns.setdefault(turn.lane_id, []).append(turn)

    def action_node(action: Action) -> ActionNode:
        nodes = [_attempt_node(a, by_subject.get(a.id, ())) for a in attempts.get(action.id, ())]
        return ActionNode(
            id=action.id,
            type=str(action.type),
            name=action.name,
            parent_action_id=action.parent_action_id,
            effect_kind=str(action.effect_kind),
            idempotency=str(action.idempotency),
            created_at=action.created_at,
            status=_status_of(by_subject.get(action.id, ()), "action", [a.status for a in nodes]),
            attempts=nodes,
        )

    def turn_node(turn: Turn) -> TurnNode:
        nodes = [action_node(action) for action in actions.get(turn.id, ())]
        return TurnNode(
            id=turn.id,
            created_at=turn.created_at,
            status=_status_of(by_subject.get(turn.id, ()), "turn", [a.status for a in nodes]),
            actions=nodes,
        )

    return LedgerTree(
        task_id=task_id,
        lanes=[
            LaneNode(
                id=lane.id,
                name=lane.name,
                task_id=lane.task_id,
                conversation_id=lane.conversation_id,
                harness_call_id=lane.harness_call_id,
                attributes=_plain(lane.attributes),
                created_at=lane.created_at,
                turns=[turn_node(turn) for turn in turns.get(lane.id, ())],
            )
            for lane in lanes
        ],
        usage=_usage(usage),
    )


def cost_points(lanes: Sequence[Lane], events: Sequence[Event]) -> list[CostPoint]:
    """One point per ended attempt that spent something (or whose spend is unknown), at its terminal event."""
    lane_of = {lane.id: lane for lane in lanes}
    points: list[CostPoint] = []
    for event in events:
        if event.event_type not in ATTEMPT_TERMINAL_EVENTS:
            continue
        usage = _usage_of(event.payload)
        estimated = event.payload.get("usage_estimated") is True
        if usage is None and not estimated:
            continue
        lane = lane_of.get(event.lane_id)
        points.append(
            CostPoint(
                at=event.occurred_at,
                task_id=lane.task_id if lane is not None else None,
                call_id=lane.harness_call_id if lane is not None else None,
                input_tokens=usage.input_tokens if usage is not None else 0,
                output_tokens=usage.output_tokens if usage is not None else 0,
                cost_usd=usage.cost_usd if usage is not None else 0.0,
                usage_estimated=estimated,
            )
        )
    points.sort(key=lambda point: point.at)
    return points


class AttemptDetail(_Body):
    attempt: AttemptNode
    request: dict[str, Any] | None = None
    """The request manifest with ``tools`` and ``messages`` resolved to their lists."""
    reply: dict[str, Any] | None = None
    expired: bool = False
    """The artifacts were removed by the ledger's retention (the attempt's facts remain)."""


CostGrouping = Literal["conversation", "target", "model"]


class CostLine(_Body):
    key: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    attempts: int


class CostTable(_Body):
    since: datetime
    by: CostGrouping
    rows: list[CostLine]
    total: CostLine


MAX_CHAIN = 100_000
"""Message segments a request may chain (a guard against a corrupt, cyclic chain)."""


async def _document(ledger: LedgerStore, sha256: str) -> Any:
    return loads((await ledger.get_artifact(sha256)).body.decode())


async def resolve_request(ledger: LedgerStore, sha256: str) -> dict[str, Any]:
    """A request manifest with its tools list and its message chain (segment by segment, oldest first) resolved."""
    manifest = await _document(ledger, sha256)
    if not isinstance(manifest, dict):
        raise InvalidRecord(f"artifact {sha256} is not a model request")
    tools_sha = manifest.get("tools")
    tools = await _document(ledger, tools_sha) if isinstance(tools_sha, str) else []
    segments: list[list[Any]] = []
    head = (manifest.get("messages") or {}).get("head")
    while isinstance(head, str) and len(segments) < MAX_CHAIN:
        segment = await _document(ledger, head)
        segments.append(list(segment.get("messages") or []))
        head = segment.get("parent")
    messages = [message for segment in reversed(segments) for message in segment]
    return {**manifest, "tools": tools, "messages": messages}


def _since(text: str, now: datetime) -> datetime:
    try:
        return now - timedelta(seconds=parse_duration(text))
    except InvalidRecord:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError("invalid_request", f"since={text!r}: give a duration (7d, 12h, 30m) or an ISO time") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def clock_now() -> datetime:
    """Wall time for ``since`` durations."""
    return datetime.now(UTC)


def cost_table(since: datetime, by: CostGrouping, rows: Sequence[CostRow]) -> CostTable:
    """``rows`` summed per conversation, target or model, largest spend first."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        key = {"conversation": row.conversation_id, "target": row.target, "model": row.model}[by] or "(none)"
        slot = sums.setdefault(key, [0, 0, 0.0, 0])
        slot[0] += row.input_tokens
        slot[1] += row.output_tokens
        slot[2] += row.cost_usd
        slot[3] += row.attempts

    def line(key: str, slot: Sequence[float]) -> CostLine:
        return CostLine(
            key=key,
            input_tokens=int(slot[0]),
            output_tokens=int(slot[1]),
            cost_usd=round(float(slot[2]), 10),
            attempts=int(slot[3]),
        )

    lines = sorted((line(key, slot) for key, slot in sums.items()), key=lambda c: (-c.cost_usd, -c.input_tokens))
    total = [sum(c.input_tokens for c in lines), sum(c.output_tokens for c in lines)]
    return CostTable(
        since=since,
        by=by,
        rows=lines,
        total=line("total", [*total, sum(c.cost_usd for c in lines), sum(c.attempts for c in lines)]),
    )


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

    async def lane_events(lanes: Sequence[Lane]) -> list[Event]:
        events: list[Event] = []
        for lane in lanes:
            events.extend(await ledger.load_lane(lane.id))
        return events

    @router.get("/tree")
    async def tree(
        caller: Annotated[Identity, Depends(current_identity)],
        task_id: _ID = None,
        conversation_id: _ID = None,
        call_id: _ID = None,
    ) -> LedgerTree:
        """The trail as a tree (lanes → turns → actions → attempts) with each attempt's status, timing, tokens and
        USD, and the usage roll-up; same access rules as ``GET /v1/ledger``."""
        scope = await scope_for(caller, task_id, conversation_id, call_id)
        lanes = await ledger.find_lanes(scope)
        return build_tree(
            task_id, lanes, await ledger.structure(scope), await lane_events(lanes), await ledger.usage(scope)
        )

    @router.get("/series")
    async def series(
        caller: Annotated[Identity, Depends(current_identity)],
        conversation_id: Annotated[str, Query(min_length=1, max_length=100)],
    ) -> CostSeries:
        """The cost over time of a user conversation: one point per ended attempt of every Task asked in it (up to
        the latest 200 Tasks, their work calls included), oldest first. Only the conversation's owner reads it (a
        responder or another user: 403 / 404)."""
        if caller.trusted and not caller.admin:
            raise ApiError("forbidden", f"{caller.text} reads the trail of its own Tasks only: name task_id")
        task_ids: dict[str, None] = {}
        after: str | None = None
        while True:
            page = await conversations.messages(caller, conversation_id, after=after, limit=1000)  # 404 if not theirs
            task_ids.update((m.task_id, None) for m in page if m.task_id is not None)
            if len(page) < 1000:
                break
            after = page[-1].id
        lanes: dict[str, Lane] = {
            lane.id: lane for lane in await ledger.find_lanes(Scope(conversation_id=conversation_id))
        }
        for task in list(task_ids)[-MAX_SERIES_TASKS:]:
            lanes.update((lane.id, lane) for lane in await ledger.find_lanes(Scope(task_id=task)))
        ordered = list(lanes.values())
        return CostSeries(conversation_id=conversation_id, points=cost_points(ordered, await lane_events(ordered)))

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

    @router.get("/attempt")
    async def attempt(
        caller: Annotated[Identity, Depends(current_identity)],
        attempt_id: Annotated[str, Query(min_length=1, max_length=100)],
        task_id: _ID = None,
        conversation_id: _ID = None,
        call_id: _ID = None,
    ) -> AttemptDetail:
        """One attempt with its full request (messages, tools, parameters) and reply, resolved from the stored
        artifacts. Same access rules as ``/tree``: name the task, conversation or call the attempt belongs to; an
        attempt outside it is 404 (as is one whose artifacts the retention removed: ``expired`` says so)."""
        scope = await scope_for(caller, task_id, conversation_id, call_id)
        lanes = {lane.id for lane in await ledger.find_lanes(scope)}
        try:
            found = await ledger.get_attempt(attempt_id)
        except NotFound:
            found = None
        if found is None or found.lane_id not in lanes:
            raise ApiError("not_found", f"attempt {attempt_id} not found in that trail")
        assert found.lane_id is not None  # checked above
        events = [e for e in await ledger.load_lane(found.lane_id) if e.subject_id == attempt_id]
        node = _attempt_node(found, events)
        detail = AttemptDetail(attempt=node)
        try:
            if node.request is not None:
                detail.request = await resolve_request(ledger, node.request.sha256)
            if node.reply is not None:
                detail.reply = await _document(ledger, node.reply.sha256)
        except NotFound:
            detail.expired = True
        return detail

    @router.get("/cost")
    async def cost(
        caller: Annotated[Identity, Depends(current_identity)],
        since: Annotated[str, Query(min_length=1, max_length=40, description="7d, 12h… or an ISO timestamp")] = "7d",
        by: Annotated[CostGrouping, Query()] = "conversation",
    ) -> CostTable:
        """Tokens and USD of the attempts that ended since ``since``, grouped ``by`` conversation, harness target or
        model, largest first. Spans every user's trail, so only the admin reads it (others: 403; a user reads one
        conversation's cost with ``/series``)."""
        if not caller.admin:
            raise ApiError("forbidden", "spend across conversations is for the admin token; use /v1/ledger/series")
        start = _since(since, clock_now())
        rows = await ledger.cost_rows(start)
        return cost_table(start, by, rows)

    return router
