"""The AgentUE reducer: `reduce(state, event) -> state`, `fold(events)`, and resumed deliveries. Pure.

A `StreamState` is one stream's snapshot: its model (None before the first `start`), the highest seq applied and
whether the delivery has ended. `reduce` never mutates anything; a refused event raises `AgentUERejectedError` and
the caller keeps the state it passed in.

Sequence rules (protocol: persisted non-ping events strictly increase, ping repeats the latest seq, a resumed
`start` covers everything through its seq):

- `start` always applies: it is a whole snapshot, so it replaces model and seq (even a lower seq: a producer that
  lost its counter starts over) and reopens an ended stream. This is how first and resumed deliveries are handled
  identically.
- Any other event whose seq is at or below the applied seq is a duplicate and a no-op: redelivery after a reconnect
  is idempotent. (One exception: an `end` at exactly the applied seq marks the stream ended, since `end` changes no
  content; a producer may close at the seq of its last change.)
- Gaps are allowed: seq must increase, not be contiguous.
- `ping` never changes state and is never refused.
- Before the first `start` (or an initial model) every other op is refused (`NOT_STARTED`); after `end` every new
  change is refused (`ENDED`) until a new `start`.
- An update that would leave an invalid model (an empty block `type`, a malformed `meta.error`, ...) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loopd._infra.errors import LoopdError
from loopd.agentue._errors import AgentUERejectedError, AgentUEValidationError, RejectCode
from loopd.agentue._events import (
    AppendEvent,
    EndEvent,
    ErrorEvent,
    Event,
    PingEvent,
    SetEvent,
    StartEvent,
    as_event,
)
from loopd.agentue._json import JsonObject, PathConflict, clone, describe, set_path
from loopd.agentue._model import VERSION_1_0, Block, InlineBlock, Model, RefBlock, check_inline, check_meta


@dataclass(frozen=True, slots=True)
class StreamState:
    """One stream's snapshot. `StreamState()` is an unnamed stream that has not started."""

    stream_id: str = ""
    model: Model | None = None
    seq: int | None = None
    """The highest seq applied (None: nothing applied yet, e.g. a state made from a stored model)."""
    ended: bool = False

    @classmethod
    def of(cls, model: Model | Mapping[str, Any], *, stream_id: str = "", seq: int | None = None) -> StreamState:
        """A started stream holding `model` (a stored snapshot, for example)."""
        return cls(stream_id=stream_id, model=model if isinstance(model, Model) else Model.from_json(model), seq=seq)

    @property
    def started(self) -> bool:
        return self.model is not None


class _Rejected(LoopdError):
    def __init__(self, code: RejectCode, reason: str) -> None:
        self.code = code
        self.reason = reason


def reduce(state: StreamState, event: Event | Mapping[str, Any]) -> StreamState:
    """Apply one event; returns the new state (the same object when the event changes nothing)."""
    try:
        parsed = as_event(event)
    except AgentUEValidationError as exc:
        op = event.get("op") if isinstance(event, Mapping) else None
        seq = event.get("seq") if isinstance(event, Mapping) else None
        raise AgentUERejectedError(
            RejectCode.INVALID_EVENT,
            str(exc),
            op=op if isinstance(op, str) else "event",
            seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            stream_id=state.stream_id,
        ) from exc
    try:
        return _reduce(state, parsed)
    except _Rejected as exc:
        raise AgentUERejectedError(
            exc.code, exc.reason, op=parsed.op.value, seq=parsed.seq, stream_id=state.stream_id
        ) from None


def fold(events: Iterable[Event | Mapping[str, Any]], initial: StreamState | None = None) -> StreamState:
    """Reduce `events` in order, from `initial` or else from an empty state of the first event's stream."""
    state = initial
    for event in events:
        if state is None:
            state = StreamState(stream_id=_stream_key(event))
        state = reduce(state, event)
    return state if state is not None else StreamState()


def _stream_key(event: Event | Mapping[str, Any]) -> str:
    if isinstance(event, Mapping):
        stream_id = event.get("stream_id")
        return stream_id if isinstance(stream_id, str) else ""
    return event.stream_key


def _reduce(state: StreamState, event: Event) -> StreamState:
    if event.stream_key != state.stream_id:
        raise _Rejected(
            RejectCode.WRONG_STREAM, f"the event addresses stream {event.stream_key!r}, not {state.stream_id!r}"
        )
    if isinstance(event, StartEvent):
        return StreamState(stream_id=state.stream_id, model=event.model, seq=event.seq, ended=False)
    if isinstance(event, PingEvent):
        return state
    model = state.model
    if model is None:
        raise _Rejected(RejectCode.NOT_STARTED, "the stream has not started; a delivery begins with start")
    if state.seq is not None and event.seq <= state.seq:
        if isinstance(event, EndEvent) and event.seq == state.seq and not state.ended:
            return dataclasses.replace(state, ended=True)
        return state  # already applied: redelivery is a no-op
    if state.ended:
        raise _Rejected(RejectCode.ENDED, f"the stream ended at seq {state.seq}; only a new start reopens it")
    if isinstance(event, EndEvent):
        return dataclasses.replace(state, seq=event.seq, ended=True)
    if isinstance(event, SetEvent):
        model = _apply_set(model, event)
    elif isinstance(event, AppendEvent):
        model = _apply_append(model, event)
    else:
        model = _apply_error(model, event)
    return StreamState(stream_id=state.stream_id, model=model, seq=event.seq, ended=False)


# ------------------------------------------------------------------------------------------------------ the ops


def _find(model: Model, block_id: str) -> tuple[int, Block | None]:
    index = model.index_of(block_id)
    if index is None:
        return len(model.blocks), None
    return index, model.blocks[index]


def _with_block(model: Model, index: int, block: Block) -> Model:
    return model.with_block_at(index, block)


def _with_meta(model: Model, meta: JsonObject) -> Model:
    try:
        check_meta(meta, "meta")
    except AgentUEValidationError as exc:
        raise _Rejected(RejectCode.INVALID_RESULT, f"the result would be invalid: {exc}") from None
    return Model.adopt(model.version, model.biz, meta, model.blocks)


def _checked_inline(block_id: str, data: JsonObject) -> InlineBlock:
    try:
        check_inline(data, f"block {block_id!r}")
    except AgentUEValidationError as exc:
        raise _Rejected(RejectCode.INVALID_RESULT, f"the result would be invalid: {exc}") from None
    return InlineBlock.adopt(data)


def _write(target: Mapping[str, Any], path: Sequence[str], value: Any, where: str) -> JsonObject:
    try:
        return set_path(target, path, value)
    except PathConflict as exc:
        raise _Rejected(RejectCode.PATH_CONFLICT, f"cannot write {where}: {exc}") from None


def _apply_set(model: Model, event: SetEvent) -> Model:
    whole = event.whole_block
    if whole is not None:
        if isinstance(whole, RefBlock) and model.version == VERSION_1_0:
            raise _Rejected(RejectCode.LEGACY_REFERENCE, "block references need a version 1.1 model; this one is 1.0")
        index, _ = _find(model, whole.id)
        return _with_block(model, index, whole)
    value = event.patch_value()
    dotted = ".".join(event.path)
    if event.slot == "meta":
        return _with_meta(model, _write(model.meta_view, event.path, value, f"meta.{dotted}"))
    block_id: str = (event.block or {})["id"]
    index, target = _find(model, block_id)
    if target is None:
        raise _Rejected(RejectCode.MISSING_BLOCK, f"block {block_id!r} does not exist (set block.{dotted} patches one)")
    if isinstance(target, RefBlock):
        raise _Rejected(
            RejectCode.UNRESOLVED_REFERENCE,
            f"block {block_id!r} is an unresolved reference; only a whole-block set can replace it",
        )
    data = _write(target.view, event.path, value, f"block.{dotted} of {block_id!r}")
    return _with_block(model, index, _checked_inline(target.id, data))


def _apply_append(model: Model, event: AppendEvent) -> Model:
    name = event.field
    payload = event.block
    index, target = _find(model, event.block_id)
    if target is None:
        body: JsonObject = clone(dict(payload))
        if "type" not in body:
            raise _Rejected(
                RejectCode.MISSING_BLOCK,
                f"block {event.block_id!r} does not exist and the append payload has no type to create it with",
            )
        return _with_block(model, index, _checked_inline(event.block_id, body))
    if isinstance(target, RefBlock):
        raise _Rejected(
            RejectCode.UNRESOLVED_REFERENCE,
            f"block {event.block_id!r} is an unresolved reference; only a whole-block set can replace it",
        )
    addition = clone(payload[name])
    current = target.view.get(name)
    if current is None:
        merged: Any = addition
    elif isinstance(current, str) and isinstance(addition, str):
        merged = current + addition
    elif isinstance(current, list) and isinstance(addition, list):
        merged = [*current, *addition]
    else:
        raise _Rejected(
            RejectCode.TYPE_MISMATCH,
            f"cannot append {describe(addition)} to {name!r} of block {event.block_id!r}, which is {describe(current)}",
        )
    data = dict(target.view)
    data[name] = merged
    return _with_block(model, index, _checked_inline(target.id, data))


def _apply_error(model: Model, event: ErrorEvent) -> Model:
    meta = dict(model.meta_view)
    meta["error"] = clone(event.meta["error"])
    return _with_meta(model, meta)


# ------------------------------------------------------------------------------------------------------- resume


def resume(events: Iterable[Event | Mapping[str, Any]], after_seq: int | None) -> list[Event]:
    """The delivery a consumer gets when it resumes one stream's timeline after `after_seq`.

    With no cursor (None) this is the stored timeline without pings. Otherwise the events through the cursor are
    folded into one `start` at the highest covered seq, followed only by events with a greater seq (and by `end`
    when the stream had already ended). Folding the result from an empty state, or appending it to any state
    that covers the cursor, gives the same snapshot as folding the whole timeline.
    """
    timeline: list[Event] = [event for event in map(as_event, events) if not isinstance(event, PingEvent)]
    if after_seq is None:
        return timeline
    covered: list[Event] = [event for event in timeline if event.seq <= after_seq]
    later: list[Event] = [event for event in timeline if event.seq > after_seq]
    if not any(isinstance(event, StartEvent) for event in covered):
        return later
    state = fold(covered)
    model, seq, stream_id = state.model, state.seq, covered[0].stream_id
    if model is None or seq is None:  # cannot happen: a covered start sets both
        return later
    delivery: list[Event] = [StartEvent(seq=seq, model=model, stream_id=stream_id)]
    if state.ended:
        delivery.append(EndEvent(seq=seq, stream_id=stream_id))
    delivery.extend(later)
    return delivery
