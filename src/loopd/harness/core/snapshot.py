"""The stored form of a session's state: a *state snapshot*, so that restore folds only the journal's tail.

A snapshot is the fold of a session's records ``1..seq`` (`loopd.harness.core.apply.fold`), written as compact
JSON of the `SessionState` and compressed (zlib). It is a cache, never the source of truth: the journal is. It is
valid only for the code that folds the same way into the same shape, so every snapshot carries `state_schema()`, a
digest of the state's shape (every field of every type in it, read from the types themselves, so a new or changed
field changes it without anyone remembering to) and of `FOLD_VERSION` (bump it when `apply` changes what an event
does to the state without changing the state's shape). A snapshot of another schema is ignored; one that does not
decode is ignored too (`SnapshotDecodeError`): restore then folds the whole journal and a new snapshot is written.

Not to be confused with workspace snapshots (`loopd.harness.snapshots`: copies of the files a session works on).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from dataclasses import fields, is_dataclass, replace
from types import MappingProxyType
from typing import Final, get_args, get_origin, get_type_hints

from pydantic import BaseModel, TypeAdapter, ValidationError

from loopd.harness._errors import HarnessError
from loopd.harness.core._values import Message
from loopd.harness.core.state import SessionState

__all__ = ["FOLD_VERSION", "SnapshotDecodeError", "decode_state", "encode_state", "state_schema"]

FOLD_VERSION: Final = 2  # 2: SessionForked clears the workspace's fork directory
"""Bump when `apply` folds some event differently into a state of the same shape (old snapshots then rebuild)."""

_LEVEL: Final = 1  # zlib's fastest level: a snapshot is written while the session runs


@functools.cache
def _adapter() -> TypeAdapter[SessionState]:
    """Built on first use, not at import (tens of milliseconds that every loopd process would pay)."""
    return TypeAdapter(SessionState)


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
    """The schema every snapshot of this build carries: a digest of `FOLD_VERSION` and of the state's shape (every
    field of every dataclass and model in `SessionState`, with its type)."""
    named: dict[str, str] = {}
    _shape(SessionState, named)
    _shape(Message, named)  # what a `History` (described by its name alone) holds
    shape = ";".join(f"{name}({body})" for name, body in sorted(named.items()))
    return f"state-{FOLD_VERSION}-{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


class SnapshotDecodeError(HarnessError, ValueError):
    """A stored snapshot does not decode into a state of this build (it is ignored; the journal is replayed)."""


def encode_state(state: SessionState) -> bytes:
    """The stored form of ``state`` (compressed JSON of every field)."""
    plain = replace(
        state,
        loops=dict(state.loops),
        agents=dict(state.agents),
        fingerprint=dict(state.fingerprint),
        hustles=dict(state.hustles),
    )
    return zlib.compress(_adapter().dump_json(plain, fallback=_plain), _LEVEL)


def _plain(value: object) -> object:
    """What the adapter does not serialize by itself: a read-only mapping of plain values (a gate's prompt, a
    hustle's parameters) becomes an object."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    raise TypeError(f"a state snapshot cannot hold {type(value).__name__}")


def decode_state(data: bytes) -> SessionState:
    """The state ``data`` (from `encode_state` of a build with the same `state_schema()`) holds.

    Raises `SnapshotDecodeError` when it does not decompress or validate.
    """
    try:
        state = _adapter().validate_json(zlib.decompress(data))
    except (zlib.error, ValidationError, ValueError) as exc:
        raise SnapshotDecodeError(f"state snapshot does not decode: {exc}") from exc
    return _frozen(state)


def _frozen(state: SessionState) -> SessionState:
    """The read-only mappings the fold builds, in place of the dicts validation makes (values stay equal)."""
    loops = {}
    for name, loop in state.loops.items():
        turn = loop.turn
        if turn is not None and turn.gate is not None:
            gate = replace(turn.gate, prompt=MappingProxyType(dict(turn.gate.prompt)))
            loop = replace(loop, turn=replace(turn, gate=gate))
        loops[name] = loop
    hustles = {hid: replace(info, params=MappingProxyType(dict(info.params))) for hid, info in state.hustles.items()}
    return replace(
        state,
        loops=MappingProxyType(loops),
        agents=MappingProxyType(dict(state.agents)),
        fingerprint=MappingProxyType(dict(state.fingerprint)),
        hustles=MappingProxyType(hustles),
    )
