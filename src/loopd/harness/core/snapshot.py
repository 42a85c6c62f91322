"""The stored form of a session's state: a *state snapshot*, so that restore folds only the journal's tail.

A snapshot is the fold of a session's records ``1..seq`` (`loopd.harness.core.apply.fold`). It is a cache, never
the source of truth: the journal is. It is valid only for the code that folds the same way into the same shape, so
every snapshot carries `state_schema()`, a digest of the state's shape (every field of every type in it, read from
the types themselves, so a new or changed field changes it without anyone remembering to), of `FOLD_VERSION` (bump
it when `apply` changes what an event does to the state without changing the state's shape) and of `FORMAT` (the
byte layout below). A snapshot of another schema is ignored; one that does not decode is ignored too
(`SnapshotDecodeError`): restore then folds the whole journal and a new snapshot is written.

Stored form (`FORMAT` 2): ``MAGIC``, the CRC-32 of the body (4 bytes, big-endian), then the body: a raw DEFLATE
stream of one MessagePack array ``[header, history of loop 1, history of loop 2, ...]``. Every value is written by
position (``LAYOUTS`` names the fields of each type in order; a test and `check_layouts` hold them to the classes;
a mapping's entries are rows led by their key), and ``header`` is the state without the loops' histories. Why:

* Decoding builds the objects directly, without validation (pydantic's validation of a whole state cost more than
  folding the records it saves, and building its validator alone ~10 ms in every restoring process). That is
  legitimate because a snapshot is written by this code under this schema, and a damaged one is still refused: the
  CRC covers every stored byte, DEFLATE and MessagePack check their own structure, and every array's length is
  checked against its layout.
* Encoding is incremental (`StateEncoder`): a loop's history is append-only (`History.extends`), so the DEFLATE
  pieces of the messages a previous snapshot of the same session encoded are reused, and each snapshot encodes and
  compresses only the messages added since. Independently compressed raw DEFLATE pieces, each ended by a sync
  flush, concatenate into one valid stream. So writing a snapshot while the session runs costs in proportion to
  the records since the last one, not to the whole history (the interpreter lock is held only while the new
  messages are turned into MessagePack; `zlib` releases it while compressing).

Not to be confused with workspace snapshots (`loopd.harness.snapshots`: copies of the files a session works on).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from itertools import islice
from types import MappingProxyType
from typing import Any, Final, get_args, get_origin, get_type_hints

import ormsgpack
from pydantic import BaseModel

from loopd.harness._errors import HarnessError
from loopd.harness.core._history import History
from loopd.harness.core._values import Message, ToolCall, ToolOutcome, Usage
from loopd.harness.core.events import QueuedInput
from loopd.harness.core.hustles import HustleInfo
from loopd.harness.core.state import AgentInfo, LoopState, OpenAsk, OpenGate, SessionState, TurnState
from loopd.harness.core.workspace import Checkpoint, WorkspaceHistory

__all__ = [
    "FOLD_VERSION",
    "FORMAT",
    "LAYOUTS",
    "SnapshotDecodeError",
    "StateEncoder",
    "check_layouts",
    "decode_state",
    "encode_state",
    "state_schema",
]

FOLD_VERSION: Final = 2  # 2: SessionForked clears the workspace's fork directory
"""Bump when `apply` folds some event differently into a state of the same shape (old snapshots then rebuild)."""

FORMAT: Final = 2  # 1: zlib-compressed JSON validated by pydantic; 2: positional MessagePack, raw DEFLATE pieces
"""The byte layout of a snapshot (part of `state_schema`: a snapshot of another format is never loaded)."""

MAGIC: Final = b"LSS\x02"
_LEVEL: Final = 1  # zlib's fastest level: a snapshot is written while the session runs
_WBITS: Final = -15  # raw DEFLATE: pieces concatenate (no zlib header or trailer per piece)
_END: Final = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS).flush()  # an empty final block: ends the stream

LAYOUTS: Final[Mapping[type, tuple[str, ...]]] = MappingProxyType(
    {
        SessionState: (
            "session_id",
            "rig",
            "status",
            "loops",
            "last_seq",
            "agents",
            "active_loop",
            "fingerprint",
            "workspace",
            "hustles",
        ),
        LoopState: (
            "name",
            "history",
            "turn",
            "queued",
            "turns",
            "usage",
            "last_reply",
            "context_tokens",
            "context_mark",
            "mode",
            "model",
            "measured_tokens",
            "context_window",
            "foreign_session_id",
        ),
        TurnState: ("turn_id", "step", "phase", "usage", "step_usage", "calls", "outcomes", "gate", "mode", "asks"),
        OpenGate: ("gate_id", "call_ids", "prompt", "deadline"),
        OpenAsk: ("request_id", "question", "choices", "deadline"),
        AgentInfo: ("name", "definition", "parent", "depth", "stopped"),
        WorkspaceHistory: ("checkpoints", "head", "directory", "pending_fork"),
        Checkpoint: ("ref", "trigger", "loop", "turn_id"),
        HustleInfo: ("hustle_id", "name", "lane", "loop", "params"),
        Message: ("role", "content", "tool_calls", "tool_call_id", "name"),
        ToolCall: ("id", "name", "arguments"),
        ToolOutcome: ("call_id", "name", "status", "output"),
        Usage: ("input_tokens", "output_tokens", "cached_tokens", "cost_usd", "calls"),
        QueuedInput: ("command_id", "text"),
    }
)
"""Every type a state holds → its fields in the order the encoder and decoder below write and read them (a
loop's ``history`` is stored apart from the loop, see the module's docstring)."""


def _field_names(tp: type) -> tuple[str, ...]:
    if is_dataclass(tp):
        return tuple(f.name for f in fields(tp))
    if issubclass(tp, BaseModel):
        return tuple(tp.model_fields)
    raise TypeError(f"{tp.__name__} is neither a dataclass nor a model")  # pragma: no cover - LAYOUTS' keys


@functools.cache
def check_layouts() -> None:
    """Raise `SnapshotDecodeError` if a type of the state has fields other than its ``LAYOUTS`` entry says (the
    codec below would drop or misplace them); checked once per process, before the first encode or decode."""
    for tp, layout in LAYOUTS.items():
        if _field_names(tp) != layout:
            raise SnapshotDecodeError(f"the state snapshot codec does not know the fields of {tp.__name__}")


def _shape(tp: object, named: dict[str, str]) -> str:
    """A stable description of type ``tp``: its name, and for a dataclass or model every field and its type's
    shape (each named type described once, in ``named``)."""
    args = get_args(tp)
    if args:
        return f"{_shape(get_origin(tp), named)}[{','.join(_shape(a, named) for a in args)}]"
    if not isinstance(tp, type):
        return repr(tp)
    name = f"{tp.__module__}.{tp.__qualname__}"
    if name in named or not (is_dataclass(tp) or issubclass(tp, BaseModel)):
        return name
    named[name] = ""  # a cycle ends here
    hints = get_type_hints(tp)
    names = [f.name for f in fields(tp)] if is_dataclass(tp) else list(tp.model_fields)
    named[name] = ",".join(f"{n}:{_shape(hints[n], named)}" for n in names)
    return name


@functools.cache
def state_schema() -> str:
    """The schema every snapshot of this build carries: a digest of `FOLD_VERSION`, `FORMAT` and of the state's
    shape (every field of every dataclass and model in `SessionState`, with its type)."""
    named: dict[str, str] = {}
    _shape(SessionState, named)
    _shape(Message, named)  # what a `History` (described by its name alone) holds
    shape = f"format={FORMAT};" + ";".join(f"{name}({body})" for name, body in sorted(named.items()))
    return f"state-{FOLD_VERSION}-{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


class SnapshotDecodeError(HarnessError, ValueError):
    """A stored snapshot does not decode into a state of this build (it is ignored; the journal is replayed)."""


# --- encoding ----------------------------------------------------------------------------------------------------


def _usage(u: Usage) -> list[Any]:
    return [u.input_tokens, u.output_tokens, u.cached_tokens, u.cost_usd, u.calls]


def _call(c: ToolCall) -> list[Any]:
    return [c.id, c.name, c.arguments]


def _message(m: Message) -> list[Any]:
    return [m.role, m.content, [[c.id, c.name, c.arguments] for c in m.tool_calls], m.tool_call_id, m.name]


def _turn(t: TurnState) -> list[Any]:
    gate = t.gate
    return [
        t.turn_id,
        t.step,
        t.phase,
        _usage(t.usage),
        _usage(t.step_usage),
        [_call(c) for c in t.calls],
        [[o.call_id, o.name, o.status, o.output] for o in t.outcomes],
        None if gate is None else [gate.gate_id, list(gate.call_ids), gate.prompt, gate.deadline],
        t.mode,
        [[a.request_id, a.question, list(a.choices), a.deadline] for a in t.asks],
    ]


def _loop(key: str, lp: LoopState) -> list[Any]:
    """A loop without its history (stored apart, see `StateEncoder`), after the key it is stored under."""
    return [
        key,
        lp.name,
        None if lp.turn is None else _turn(lp.turn),
        [[q.command_id, q.text] for q in lp.queued],
        lp.turns,
        _usage(lp.usage),
        lp.last_reply,
        lp.context_tokens,
        lp.context_mark,
        lp.mode,
        lp.model,
        lp.measured_tokens,
        lp.context_window,
        lp.foreign_session_id,
    ]


_BIG_INT: Final = 1  # MessagePack extension type: an integer beyond 64 bits, as its decimal digits


def _pack_other(value: object) -> object:
    """What MessagePack does not hold by itself, in plain values a tool's arguments, a gate's prompt or a hustle's
    parameters may carry: a read-only mapping becomes a map, an integer beyond 64 bits an extension value."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, int):
        return ormsgpack.Ext(_BIG_INT, str(value).encode())
    raise TypeError(f"a state snapshot cannot hold {type(value).__name__}")


def _unpack_other(code: int, data: bytes) -> object:
    if code != _BIG_INT:
        raise ValueError(f"unknown extension type {code}")
    return int(data)


def _pack(value: object) -> bytes:
    return ormsgpack.packb(value, default=_pack_other, option=ormsgpack.OPT_PASSTHROUGH_BIG_INT)


def _header(state: SessionState) -> list[Any]:
    ws = state.workspace
    return [
        state.session_id,
        state.rig,
        state.status,
        [_loop(key, lp) for key, lp in state.loops.items()],
        state.last_seq,
        [[key, a.name, a.definition, a.parent, a.depth, a.stopped] for key, a in state.agents.items()],
        state.active_loop,
        dict(state.fingerprint),
        [[[c.ref, c.trigger, c.loop, c.turn_id] for c in ws.checkpoints], ws.head, ws.directory, ws.pending_fork],
        [[key, h.hustle_id, h.name, h.lane, h.loop, h.params] for key, h in state.hustles.items()],
    ]


def _array_header(n: int) -> bytes:
    """The MessagePack header of an array of ``n`` values (what precedes them)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _deflate(data: bytes | memoryview) -> bytes:
    """``data`` as a raw DEFLATE piece that any other such piece may follow (sync flush: ends on a byte boundary,
    refers to nothing before it)."""
    compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


@dataclass(frozen=True, slots=True)
class _Encoded:
    """A history as encoded last: the value, and the DEFLATE pieces of its messages' MessagePack, in order."""

    history: History
    pieces: tuple[bytes, ...]


class StateEncoder:
    """Encodes the states of one session, one at a time (`encode`), reusing the compressed messages of each loop's
    history it encoded last when the new history extends it (see the module's docstring).

    Holds one `_Encoded` per loop (the compressed form of its history: far smaller than the history itself). Meant
    for one encode at a time (a session's `StateSnapshots` runs one save at a time); two at once still encode
    correctly (each entry is a consistent pair and is replaced whole), one may just not reuse the other's work.
    """

    def __init__(self) -> None:
        self._histories: dict[str, _Encoded] = {}

    def new_messages(self, state: SessionState) -> int:
        """How many messages `encode` would turn into MessagePack for ``state`` (those its histories added since the
        last encode; all of them for a history it does not build on): what an encode costs, in proportion."""
        previous = self._histories
        count = 0
        for key, loop in state.loops.items():
            known = previous.get(key)
            start = len(known.history) if known is not None and loop.history.extends(known.history) else 0
            count += len(loop.history) - start
        return count

    def encode(self, state: SessionState) -> bytes:
        """The stored form of ``state`` (see the module's docstring)."""
        check_layouts()
        loops = list(state.loops.items())
        pieces = [_deflate(_array_header(1 + len(loops)) + _pack(_header(state)))]
        previous = self._histories  # read once: each entry is consistent on its own, whoever replaces the dict
        histories: dict[str, _Encoded] = {}
        for key, loop in loops:
            history = loop.history
            known = previous.get(key)
            done: tuple[bytes, ...] = ()
            start = 0
            if known is not None and history.extends(known.history):
                done, start = known.pieces, len(known.history)
            if len(history) > start:
                packed = _pack([_message(m) for m in islice(history, start, None)])
                added = memoryview(packed)[len(_array_header(len(history) - start)) :]  # the array's body
                done = (*done, _deflate(added))
            histories[key] = _Encoded(history, done)
            pieces.append(_deflate(_array_header(len(history))))
            pieces.extend(done)
        pieces.append(_END)
        checksum = 0
        for piece in pieces:
            checksum = zlib.crc32(piece, checksum)
        self._histories = histories
        return b"".join([MAGIC, checksum.to_bytes(4, "big"), *pieces])


def encode_state(state: SessionState) -> bytes:
    """The stored form of ``state`` (`StateEncoder.encode` without a previous state to build on)."""
    return StateEncoder().encode(state)


# --- decoding ----------------------------------------------------------------------------------------------------

_new = object.__new__
_set = object.__setattr__
# BaseModel's own slots, set the way pydantic's `model_construct` sets them (a descriptor's ``__set__`` costs less
# than `object.__setattr__` looking the name up, and a history decodes thousands of models).
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_MESSAGE_FIELDS: Final = frozenset(LAYOUTS[Message])
_CALL_FIELDS: Final = frozenset(LAYOUTS[ToolCall])
_OUTCOME_FIELDS: Final = frozenset(LAYOUTS[ToolOutcome])
_USAGE_FIELDS: Final = frozenset(LAYOUTS[Usage])
_QUEUED_FIELDS: Final = frozenset(LAYOUTS[QueuedInput])


def _model(cls: type[BaseModel], names: frozenset[str], values: dict[str, Any]) -> Any:
    """An instance of model ``cls`` holding ``values`` (every field), built the way `model_construct` does but
    without its per-field work: the values were the fields of such an instance when encoded. Like a validation of
    every field, it marks every field as set (its own set: pydantic may update a copy's)."""
    model = _new(cls)
    _set(model, "__dict__", values)
    _set_fields_set(model, set(names))
    _set_extra(model, None)
    _set_private(model, None)
    return model


def _call_of(v: list[Any]) -> ToolCall:
    call_id, name, arguments = v
    if type(arguments) is not dict:
        raise TypeError("tool call arguments are not a map")
    return _model(ToolCall, _CALL_FIELDS, {"id": call_id, "name": name, "arguments": arguments})  # type: ignore[no-any-return]


def _usage_of(v: list[Any]) -> Usage:
    input_tokens, output_tokens, cached_tokens, cost_usd, calls = v
    values = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": cached_tokens,
        "cost_usd": cost_usd,
        "calls": calls,
    }
    return _model(Usage, _USAGE_FIELDS, values)  # type: ignore[no-any-return]


def _messages_of(values: list[Any]) -> History:
    """A history's messages: the hot part of a decode (thousands of messages), so `_model` is inlined here.

    The messages of one history share one fields-set (and their tool calls another): pydantic never changes a frozen
    model's set in place (`model_copy` gives the copy its own), and a set per model would be a third of the objects
    a restore makes for the garbage collector to scan."""
    out: list[Message] = []
    append = out.append
    new, set_dict, set_fields_set, set_extra, set_private = _new, _set, _set_fields_set, _set_extra, _set_private
    message_fields, call_fields = set(_MESSAGE_FIELDS), set(_CALL_FIELDS)
    for role, content, raw_calls, tool_call_id, name in values:
        calls: tuple[ToolCall, ...] = ()
        if raw_calls:
            built = []
            for call_id, call_name, arguments in raw_calls:
                if type(arguments) is not dict:
                    raise TypeError("tool call arguments are not a map")
                call = new(ToolCall)
                set_dict(call, "__dict__", {"id": call_id, "name": call_name, "arguments": arguments})
                set_fields_set(call, call_fields)
                set_extra(call, None)
                set_private(call, None)
                built.append(call)
            calls = tuple(built)
        message = new(Message)
        set_dict(
            message,
            "__dict__",
            {"role": role, "content": content, "tool_calls": calls, "tool_call_id": tool_call_id, "name": name},
        )
        set_fields_set(message, message_fields)
        set_extra(message, None)
        set_private(message, None)
        append(message)
    return History(out)


def _turn_of(v: list[Any]) -> TurnState:
    turn_id, step, phase, usage, step_usage, calls, outcomes, gate, mode, asks = v
    open_gate = None
    if gate is not None:
        gate_id, call_ids, prompt, deadline = gate
        open_gate = OpenGate(gate_id, tuple(call_ids), MappingProxyType(prompt), deadline)
    return TurnState(
        turn_id=turn_id,
        step=step,
        phase=phase,
        usage=_usage_of(usage),
        step_usage=_usage_of(step_usage),
        calls=tuple(_call_of(c) for c in calls),
        outcomes=tuple(
            _model(ToolOutcome, _OUTCOME_FIELDS, {"call_id": c, "name": n, "status": s, "output": o})
            for c, n, s, o in outcomes
        ),
        gate=open_gate,
        mode=mode,
        asks=tuple(OpenAsk(r, q, tuple(ch), d) for r, q, ch, d in asks),
    )


def _loop_of(v: list[Any], history: History) -> tuple[str, LoopState]:
    key, name, turn, queued, turns, usage, last_reply, context_tokens, context_mark, mode, model, measured, *rest = v
    context_window, foreign_session_id = rest
    loop = LoopState(
        name=name,
        history=history,
        turn=None if turn is None else _turn_of(turn),
        queued=tuple(_model(QueuedInput, _QUEUED_FIELDS, {"command_id": c, "text": t}) for c, t in queued),
        turns=turns,
        usage=_usage_of(usage),
        last_reply=last_reply,
        context_tokens=context_tokens,
        context_mark=context_mark,
        mode=mode,
        model=model,
        measured_tokens=measured,
        context_window=context_window,
        foreign_session_id=foreign_session_id,
    )
    return key, loop


def _state_of(values: list[Any]) -> SessionState:
    header, *histories = values
    session_id, rig, status, loops, last_seq, agents, active_loop, fingerprint, workspace, hustles = header
    if len(loops) != len(histories):
        raise ValueError(f"{len(loops)} loops, {len(histories)} histories")
    checkpoints, head, directory, pending_fork = workspace
    return SessionState(
        session_id=session_id,
        rig=rig,
        status=status,
        loops=MappingProxyType(dict(_loop_of(lp, _messages_of(h)) for lp, h in zip(loops, histories, strict=True))),
        last_seq=last_seq,
        agents=MappingProxyType({key: AgentInfo(n, d, p, depth, s) for key, n, d, p, depth, s in agents}),
        active_loop=active_loop,
        fingerprint=MappingProxyType(dict(fingerprint)),
        workspace=WorkspaceHistory(
            checkpoints=tuple(Checkpoint(r, t, lp, tid) for r, t, lp, tid in checkpoints),
            head=head,
            directory=directory,
            pending_fork=pending_fork,
        ),
        hustles=MappingProxyType(
            {key: HustleInfo(hid, n, lane, lp, MappingProxyType(p)) for key, hid, n, lane, lp, p in hustles}
        ),
    )


def decode_state(data: bytes) -> SessionState:
    """The state ``data`` (from `encode_state` or `StateEncoder.encode` of a build with the same `state_schema()`)
    holds, built without validation (see the module's docstring).

    Raises `SnapshotDecodeError` when it is not such a snapshot: another format, a checksum that does not match,
    a stream that does not inflate or unpack, or values that do not fit the layouts.
    """
    check_layouts()
    if data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + 4:
        raise SnapshotDecodeError("state snapshot does not decode: not a snapshot of this format")
    body = memoryview(data)[len(MAGIC) + 4 :]
    if zlib.crc32(body) != int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "big"):
        raise SnapshotDecodeError("state snapshot does not decode: its checksum does not match")
    try:
        inflater = zlib.decompressobj(_WBITS)
        raw = inflater.decompress(body)
        if not inflater.eof or inflater.unused_data:
            raise ValueError("the compressed stream does not end where the snapshot does")
        values = ormsgpack.unpackb(raw, ext_hook=_unpack_other)
        if type(values) is not list:
            raise TypeError("not an array")
        return _state_of(values)
    except (zlib.error, ormsgpack.MsgpackDecodeError, TypeError, ValueError, KeyError) as exc:
        raise SnapshotDecodeError(f"state snapshot does not decode: {exc}") from exc
