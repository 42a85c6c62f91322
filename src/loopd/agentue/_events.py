"""AgentUE events: a closed set of six ops, each a frozen value checked on construction. Pure.

Envelope: `op` and `seq` (int >= 0) are required; `stream_id` (omitted or "" = the unnamed stream), `ts` (unix ms)
and `event_type` (a hint, never needed to apply) are optional; the slots `model`, `meta`, `block` and the dotted
`mask` depend on the op:

    start   model only                         replace the whole model
    set     block (no mask): a full block      upsert by id (replace in place, or append at the end)
            meta or block + mask <slot>.<path>  write one field (the mask's first segment selects the slot)
    append  block + mask block.<field>         concatenate a string or an array (creating a missing block)
    error   meta + mask meta.error             set meta.error to an object {code, message, ...}
    ping    nothing                            liveness; repeats the latest seq
    end     nothing                            the delivery is complete

Field patches (masked set, append) never carry `ref` and never target `id` or `ref`. Unknown envelope fields are
refused; a JSON `null` for an optional field means "absent". Everything here depends only on the event itself;
what depends on the current model (does the block exist, is it a reference, …) is the reducer's business.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._json import (
    JsonObject,
    checked_object,
    clone,
    describe,
    dumps,
    loads,
    read_patch_value,
    require_nonempty_str,
    split_path,
)
from loopd.agentue._model import (
    REFERENCE_FIELDS,
    Block,
    ErrorInfo,
    InlineBlock,
    Model,
    RefBlock,
    check_error_object,
    parse_block,
)


class Op(StrEnum):
    START = "start"
    SET = "set"
    APPEND = "append"
    ERROR = "error"
    PING = "ping"
    END = "end"


class Lifecycle(StrEnum):
    """What a transport or store does with an event."""

    EPHEMERAL = "ephemeral"
    """Never persisted (`ping`): it repeats the latest seq and changes nothing."""
    ENDURING = "enduring"
    """Persisted in the stream's timeline (`start`, `set`, `append`, `error`)."""
    TERMINAL = "terminal"
    """Persisted and closes the delivery (`end`)."""


ENVELOPE_FIELDS = ("op", "seq", "stream_id", "ts", "event_type", "mask", "model", "meta", "block")
_SLOTS_BY_OP: dict[Op, frozenset[str]] = {
    Op.START: frozenset({"model"}),
    Op.SET: frozenset({"mask", "meta", "block"}),
    Op.APPEND: frozenset({"mask", "block"}),
    Op.ERROR: frozenset({"mask", "meta"}),
    Op.PING: frozenset(),
    Op.END: frozenset(),
}
ERROR_MASK = "meta.error"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_field_patch(payload: JsonObject, path: tuple[str, ...]) -> None:
    if path[0] in REFERENCE_FIELDS:
        raise AgentUEValidationError("event.mask", f"a field patch may not target {path[0]!r}")
    if "ref" in payload:
        raise AgentUEValidationError("event.block.ref", "a field patch may not carry ref")
    require_nonempty_str(payload, "id", "event.block")


def _nested(path: tuple[str, ...], value: Any) -> JsonObject:
    out: JsonObject = {path[-1]: value}
    for segment in reversed(path[:-1]):
        out = {segment: out}
    return out


@dataclass(frozen=True, kw_only=True)
class _Event:
    """Fields and checks shared by every op."""

    op: ClassVar[Op]
    lifecycle: ClassVar[Lifecycle] = Lifecycle.ENDURING
    seq: int
    stream_id: str | None = None
    ts: int | None = None
    event_type: str | None = None

    def __post_init__(self) -> None:
        if not _is_count(self.seq):
            raise AgentUEValidationError("event.seq", f"must be an integer >= 0, not {self.seq!r}")
        if self.stream_id is not None and not isinstance(self.stream_id, str):
            raise AgentUEValidationError("event.stream_id", f"must be a string, not {describe(self.stream_id)}")
        if self.ts is not None and not _is_count(self.ts):
            raise AgentUEValidationError("event.ts", f"must be unix milliseconds (an integer >= 0), not {self.ts!r}")
        if self.event_type is not None and not isinstance(self.event_type, str):
            raise AgentUEValidationError("event.event_type", f"must be a string, not {describe(self.event_type)}")
        self._check_slots()

    def _check_slots(self) -> None:
        """Op-specific checks (no slots by default)."""

    def _slots_json(self) -> JsonObject:
        return {}

    @property
    def stream_key(self) -> str:
        """The stream this event addresses: `stream_id`, with omitted and "" both meaning the unnamed stream."""
        return self.stream_id or ""

    def to_json(self) -> JsonObject:
        out: JsonObject = {"op": self.op.value, "seq": self.seq}
        if self.stream_id is not None:
            out["stream_id"] = self.stream_id
        if self.ts is not None:
            out["ts"] = self.ts
        if self.event_type is not None:
            out["event_type"] = self.event_type
        out.update(self._slots_json())
        return out


@dataclass(frozen=True, kw_only=True)
class StartEvent(_Event):
    """Replace the stream's whole model; `seq` is the highest seq the model covers."""

    op: ClassVar[Op] = Op.START
    model: Model

    def _check_slots(self) -> None:
        if not isinstance(self.model, Model):
            raise AgentUEValidationError("event.model", f"start carries a Model, not {describe(self.model)}")

    def _slots_json(self) -> JsonObject:
        return {"model": self.model.to_json()}


@dataclass(frozen=True, kw_only=True)
class SetEvent(_Event):
    """Upsert a whole block (no mask) or write one field of meta or of an existing block (mask)."""

    op: ClassVar[Op] = Op.SET
    mask: str | None = None
    meta: Mapping[str, Any] | None = None
    block: Mapping[str, Any] | None = None
    _path: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False, default=())
    _whole: Block | None = dataclasses.field(init=False, repr=False, compare=False, default=None)

    @classmethod
    def whole(cls, seq: int, block: Block | Mapping[str, Any], **envelope: Any) -> SetEvent:
        """Upsert `block` as a whole."""
        body = block.to_json() if isinstance(block, InlineBlock | RefBlock) else block
        return cls(seq=seq, block=body, **envelope)

    @classmethod
    def block_field(cls, seq: int, block_id: str, path: str, value: Any, **envelope: Any) -> SetEvent:
        """Write `value` at the dotted `path` of the existing block `block_id` (e.g. `"tool.status"`)."""
        segments = split_path(path, "path")
        return cls(seq=seq, mask=f"block.{path}", block={"id": block_id, **_nested(segments, value)}, **envelope)

    @classmethod
    def meta_field(cls, seq: int, path: str, value: Any, **envelope: Any) -> SetEvent:
        """Write `value` at the dotted `path` of meta, creating intermediate objects."""
        return cls(seq=seq, mask=f"meta.{path}", meta=_nested(split_path(path, "path"), value), **envelope)

    def _check_slots(self) -> None:
        if (self.meta is None) == (self.block is None):
            raise AgentUEValidationError("event", "set carries exactly one of meta or block")
        if self.mask is None:
            if self.block is None:
                raise AgentUEValidationError("event.mask", "a set of meta needs a mask 'meta.<path>'")
            body = checked_object(self.block, "event.block")
            object.__setattr__(self, "block", body)
            object.__setattr__(self, "_whole", parse_block(body, "event.block"))
            return
        segments = split_path(self.mask, "event.mask")
        slot, path = segments[0], segments[1:]
        if slot not in ("meta", "block"):
            raise AgentUEValidationError("event.mask", f"{self.mask!r} must start with 'meta.' or 'block.'")
        if not path:
            raise AgentUEValidationError("event.mask", f"{self.mask!r} names the {slot} slot but no field in it")
        payload = self.meta if slot == "meta" else self.block
        if payload is None:
            other = "block" if slot == "meta" else "meta"
            raise AgentUEValidationError("event.mask", f"{self.mask!r} selects {slot} but the event carries {other}")
        body = checked_object(payload, f"event.{slot}")
        object.__setattr__(self, slot, body)
        if slot == "block":
            _check_field_patch(body, path)
        found, _ = read_patch_value(body, path)
        if not found:
            raise AgentUEValidationError(
                f"event.{slot}", f"carries no value for {self.mask!r} (neither at {'.'.join(path)!r} nor {path[-1]!r})"
            )
        object.__setattr__(self, "_path", path)

    @property
    def slot(self) -> str:
        """ "meta" or "block": the slot this event writes."""
        return "meta" if self.meta is not None else "block"

    @property
    def path(self) -> tuple[str, ...]:
        """The masked field path inside the slot (empty for a whole-block set)."""
        return self._path

    @property
    def whole_block(self) -> Block | None:
        """The block of an unmasked set (None for a field patch)."""
        return self._whole

    def patch_value(self) -> Any:
        """A copy of the value a field patch writes (read at the path, else under the last segment's name)."""
        payload = self.meta if self.meta is not None else self.block
        if payload is None or not self._path:
            raise AgentUEValidationError("event.mask", "a whole-block set has no patch value")
        return clone(read_patch_value(payload, self._path)[1])

    def _slots_json(self) -> JsonObject:
        out: JsonObject = {}
        if self.mask is not None:
            out["mask"] = self.mask
        if self.meta is not None:
            out["meta"] = clone(self.meta)
        if self.block is not None:
            out["block"] = clone(self.block)
        return out


@dataclass(frozen=True, kw_only=True)
class AppendEvent(_Event):
    """Concatenate a string or an array onto `block.<field>`; a missing block is created from the payload."""

    op: ClassVar[Op] = Op.APPEND
    mask: str
    block: Mapping[str, Any]
    _field: str = dataclasses.field(init=False, repr=False, compare=False, default="")

    @classmethod
    def to(
        cls, seq: int, block_id: str, field: str, value: str | list[Any], *, type: str | None = None, **envelope: Any
    ) -> AppendEvent:
        """Append `value` to `field` of `block_id`; give `type` so that the first append can create the block."""
        body: JsonObject = {"id": block_id, field: value}
        if type is not None:
            body["type"] = type
        return cls(seq=seq, mask=f"block.{field}", block=body, **envelope)

    def _check_slots(self) -> None:
        segments = split_path(self.mask, "event.mask")
        if len(segments) != 2 or segments[0] != "block":
            raise AgentUEValidationError(
                "event.mask", f"append needs a mask 'block.<field>' with a single field, not {self.mask!r}"
            )
        body = checked_object(self.block, "event.block")
        object.__setattr__(self, "block", body)
        _check_field_patch(body, segments[1:])
        name = segments[1]
        if name not in body:
            raise AgentUEValidationError(f"event.block.{name}", "append carries no value for its masked field")
        if not isinstance(body[name], str | list):
            raise AgentUEValidationError(
                f"event.block.{name}", f"append takes a string or an array, not {describe(body[name])}"
            )
        object.__setattr__(self, "_field", name)

    @property
    def field(self) -> str:
        """The appended field (the mask's single segment after `block.`)."""
        return self._field

    @property
    def block_id(self) -> str:
        value: str = self.block["id"]
        return value

    def _slots_json(self) -> JsonObject:
        return {"mask": self.mask, "block": clone(self.block)}


@dataclass(frozen=True, kw_only=True)
class ErrorEvent(_Event):
    """Set `meta.error` (a terminal failure puts `error` before `end`)."""

    op: ClassVar[Op] = Op.ERROR
    meta: Mapping[str, Any]
    mask: str = ERROR_MASK

    @classmethod
    def of(cls, seq: int, code: str, message: str, *, detail: Any = None, **envelope: Any) -> ErrorEvent:
        error = ErrorInfo(code=code, message=message, detail=detail)
        return cls(seq=seq, meta={"error": error.to_json()}, **envelope)

    def _check_slots(self) -> None:
        if self.mask != ERROR_MASK:
            raise AgentUEValidationError("event.mask", f"error needs the mask {ERROR_MASK!r}, not {self.mask!r}")
        body = checked_object(self.meta, "event.meta")
        if "error" not in body:
            raise AgentUEValidationError("event.meta.error", "error carries an object meta.error")
        check_error_object(body["error"], "event.meta.error")
        object.__setattr__(self, "meta", body)

    @property
    def error(self) -> ErrorInfo:
        return ErrorInfo.from_json(self.meta["error"])

    def _slots_json(self) -> JsonObject:
        return {"mask": self.mask, "meta": clone(self.meta)}


@dataclass(frozen=True, kw_only=True)
class PingEvent(_Event):
    """Liveness while idle; repeats the latest seq and never changes state."""

    op: ClassVar[Op] = Op.PING
    lifecycle: ClassVar[Lifecycle] = Lifecycle.EPHEMERAL


@dataclass(frozen=True, kw_only=True)
class EndEvent(_Event):
    """The delivery is complete; the model does not change."""

    op: ClassVar[Op] = Op.END
    lifecycle: ClassVar[Lifecycle] = Lifecycle.TERMINAL


Event = StartEvent | SetEvent | AppendEvent | ErrorEvent | PingEvent | EndEvent
"""Any AgentUE event (a closed union: `event.op` tells which)."""

_CLASSES: dict[Op, type[_Event]] = {
    Op.START: StartEvent,
    Op.SET: SetEvent,
    Op.APPEND: AppendEvent,
    Op.ERROR: ErrorEvent,
    Op.PING: PingEvent,
    Op.END: EndEvent,
}


def event_from_json(data: Any) -> Event:
    """Validate a JSON event; raises `AgentUEValidationError` naming the offending field."""
    if not isinstance(data, Mapping):
        raise AgentUEValidationError("event", f"must be a JSON object, not {describe(data)}")
    unknown = sorted(str(name) for name in data if name not in ENVELOPE_FIELDS)
    if unknown:
        raise AgentUEValidationError("event", f"unknown field(s) {', '.join(map(repr, unknown))}")
    raw_op = data.get("op")
    if not isinstance(raw_op, str) or raw_op not in Op.__members__.values():
        ops = ", ".join(op.value for op in Op)
        raise AgentUEValidationError("event.op", f"must be one of {ops}, not {raw_op!r}")
    op = Op(raw_op)
    present = {name: value for name, value in data.items() if value is not None}
    if "seq" not in present:
        raise AgentUEValidationError("event.seq", "is required")
    stray = sorted((set(present) & {"mask", "model", "meta", "block"}) - _SLOTS_BY_OP[op])
    if stray:
        raise AgentUEValidationError("event", f"{op.value} may not carry {', '.join(stray)}")
    kwargs: dict[str, Any] = {
        name: present[name] for name in ("seq", "stream_id", "ts", "event_type") if name in present
    }
    if op is Op.START:
        if "model" not in present:
            raise AgentUEValidationError("event.model", "start carries the whole model")
        kwargs["model"] = Model.from_json(present["model"], path="event.model")
    else:
        kwargs.update({name: present[name] for name in _SLOTS_BY_OP[op] if name in present})
    if op is Op.APPEND and "mask" not in kwargs:
        raise AgentUEValidationError("event.mask", "append needs a mask 'block.<field>'")
    if op is Op.APPEND and "block" not in kwargs:
        raise AgentUEValidationError("event.block", "append carries a block")
    if op is Op.ERROR and "mask" not in kwargs:
        raise AgentUEValidationError("event.mask", f"error needs the mask {ERROR_MASK!r}")
    if op is Op.ERROR and "meta" not in kwargs:
        raise AgentUEValidationError("event.meta", "error carries meta.error")
    event: Event = _CLASSES[op](**kwargs)  # type: ignore[assignment]  # _CLASSES maps each op to its class
    return event


def as_event(event: Event | Mapping[str, Any]) -> Event:
    """An `Event` as is, or a JSON mapping validated into one."""
    if isinstance(event, _Event):
        return event
    return event_from_json(event)


def encode_event(event: Event) -> str:
    """Compact JSON text of an event."""
    return dumps(event.to_json())


def decode_event(text: str) -> Event:
    """An event from JSON text."""
    return event_from_json(loads(text, "event"))
