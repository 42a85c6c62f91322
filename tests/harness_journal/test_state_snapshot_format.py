"""The stored form of a state snapshot (format 2): it round-trips any state exactly, an encoder reuses what it
encoded before, and anything damaged or foreign is refused (so restore ignores it and folds the whole journal)."""

from __future__ import annotations

import zlib
from dataclasses import fields, is_dataclass, replace
from types import MappingProxyType
from typing import Any

import ormsgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from loopd.harness.core import codec, snapshot
from loopd.harness.core._history import History
from loopd.harness.core._values import Message, ToolCall, ToolOutcome, Usage
from loopd.harness.core.events import QueuedInput, SessionStarted
from loopd.harness.core.hustles import HustleInfo
from loopd.harness.core.snapshot import (
    FORMAT,
    LAYOUTS,
    MAGIC,
    SnapshotDecodeError,
    StateEncoder,
    decode_state,
    encode_state,
    state_schema,
)
from loopd.harness.core.state import AgentInfo, LoopState, OpenAsk, OpenGate, SessionState, TurnState
from loopd.harness.core.workspace import Checkpoint, WorkspaceHistory
from loopd.harness.journal import MemoryJournal, NewRecord, replay, restore_state

# --- generated states ---------------------------------------------------------------------------------------------

texts = st.text(max_size=12)
maybe_text = st.none() | texts
# What a tool's arguments, a gate's prompt or a hustle's parameters hold: JSON values (lists, not tuples: both the
# journal and a snapshot give lists back), and integers beyond 64 bits.
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(texts, plain, max_size=3)
usages = st.builds(
    Usage,
    input_tokens=st.integers(0, 10**9),
    output_tokens=st.integers(0, 10**9),
    cached_tokens=st.integers(0, 10**6),
    cost_usd=st.floats(0, 100),
    calls=st.integers(0, 1000),
) | st.just(Usage())
calls = st.builds(ToolCall, id=texts, name=texts, arguments=arguments)
outcomes = st.builds(
    ToolOutcome,
    call_id=texts,
    name=texts,
    status=st.sampled_from(["ok", "error", "denied", "interrupted", "unknown"]),
    output=texts,
)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=st.text(max_size=40),
    tool_calls=st.lists(calls, max_size=2).map(tuple),
    tool_call_id=maybe_text,
    name=maybe_text,
)
histories = st.lists(messages, max_size=8).map(History)
gates = st.builds(
    OpenGate,
    gate_id=texts,
    call_ids=st.lists(texts, max_size=3).map(tuple),
    prompt=st.dictionaries(texts, plain, max_size=3).map(MappingProxyType),
    deadline=st.floats(0, 2e9),
)
asks = st.builds(
    OpenAsk,
    request_id=texts,
    question=texts,
    choices=st.lists(texts, max_size=3).map(tuple),
    deadline=st.floats(0, 2e9),
)
turns = st.builds(
    TurnState,
    turn_id=texts,
    step=st.integers(0, 500),
    phase=st.sampled_from(["model", "tools"]),
    usage=usages,
    step_usage=usages,
    calls=st.lists(calls, max_size=3).map(tuple),
    outcomes=st.lists(outcomes, max_size=3).map(tuple),
    gate=st.none() | gates,
    mode=maybe_text,
    asks=st.lists(asks, max_size=2).map(tuple),
)
loops = st.builds(
    LoopState,
    name=texts,
    history=histories,
    turn=st.none() | turns,
    queued=st.lists(st.builds(QueuedInput, command_id=texts, text=texts), max_size=2).map(tuple),
    turns=st.integers(0, 10**6),
    usage=usages,
    last_reply=maybe_text,
    context_tokens=st.integers(0, 10**6),
    context_mark=st.integers(0, 10**6),
    mode=maybe_text,
    model=maybe_text,
    measured_tokens=st.integers(0, 10**6),
    context_window=st.none() | st.integers(0, 10**6),
    foreign_session_id=maybe_text,
)
agents = st.builds(
    AgentInfo, name=texts, definition=texts, parent=texts, depth=st.integers(0, 9), stopped=st.booleans()
)
workspaces = st.builds(
    WorkspaceHistory,
    checkpoints=st.lists(st.builds(Checkpoint, ref=texts, trigger=texts, loop=texts, turn_id=texts), max_size=3).map(
        tuple
    ),
    head=st.integers(-1, 3),
    directory=texts,
    pending_fork=maybe_text,
)
hustles = st.builds(
    HustleInfo,
    hustle_id=texts,
    name=texts,
    lane=st.sampled_from(["blocking", "background"]),
    loop=maybe_text,
    params=st.dictionaries(texts, plain, max_size=3).map(MappingProxyType),
)
states = st.builds(
    SessionState,
    session_id=texts,
    rig=texts,
    status=st.sampled_from(["new", "active", "stopped"]),
    loops=st.dictionaries(texts, loops, max_size=3).map(MappingProxyType),
    last_seq=st.integers(0, 10**9),
    agents=st.dictionaries(texts, agents, max_size=2).map(MappingProxyType),
    active_loop=maybe_text,
    fingerprint=st.dictionaries(texts, texts, max_size=3).map(MappingProxyType),
    workspace=workspaces,
    hustles=st.dictionaries(texts, hustles, max_size=2).map(MappingProxyType),
)


def assert_same(decoded: object, original: object, path: str = "state") -> None:
    """``decoded`` equals ``original`` with the same types all the way down (a read-only mapping where the fold
    keeps one, a tuple where it keeps a tuple), and every model is complete (pydantic's per-instance state)."""
    if isinstance(original, History):
        assert type(decoded) is History, path
        assert len(decoded) == len(original), path
        for i, (a, b) in enumerate(zip(decoded, original, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
        return
    if isinstance(original, MappingProxyType):
        assert type(decoded) is MappingProxyType, path
    elif isinstance(original, float):
        assert type(decoded) is float, path
    elif not isinstance(original, list | dict):  # plain values: MessagePack gives lists and dicts back
        assert type(decoded) is type(original), path
    assert decoded == original, path
    if isinstance(original, BaseModel):
        assert isinstance(decoded, BaseModel)
        assert decoded.__pydantic_extra__ is None and decoded.__pydantic_private__ is None, path
        assert decoded.model_fields_set <= set(type(original).model_fields), path
        for name in type(original).model_fields:
            assert_same(getattr(decoded, name), getattr(original, name), f"{path}.{name}")
    elif is_dataclass(original):
        for f in fields(original):
            assert_same(getattr(decoded, f.name), getattr(original, f.name), f"{path}.{f.name}")
    elif isinstance(original, MappingProxyType):
        for key in original:
            assert_same(decoded[key], original[key], f"{path}[{key!r}]")  # type: ignore[index]
    elif isinstance(original, tuple):
        for i, (a, b) in enumerate(zip(decoded, original, strict=True)):  # type: ignore[call-overload]
            assert_same(a, b, f"{path}[{i}]")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states)
def test_every_state_round_trips_exactly(state: SessionState) -> None:
    assert_same(decode_state(encode_state(state)), state)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states, st.lists(st.tuples(st.sampled_from(["append", "replace", "drop"]), st.lists(messages, max_size=4))))
def test_an_encoder_that_builds_on_its_previous_snapshots_writes_the_same_states(
    state: SessionState, changes: list[tuple[str, list[Message]]]
) -> None:
    """Histories appended to (reused), replaced (e.g. by a compaction) or loops gone: each snapshot of a reused
    encoder decodes to its own state."""
    encoder = StateEncoder()
    assert_same(decode_state(encoder.encode(state)), state)
    for change, added in changes:
        loops = dict(state.loops)
        for key, loop in list(loops.items())[:2]:
            if change == "append":
                loops[key] = replace(loop, history=loop.history.appended(*added))
            elif change == "replace":
                loops[key] = replace(loop, history=History(added))
            else:
                del loops[key]
        state = replace(state, loops=MappingProxyType(loops), last_seq=state.last_seq + 1)
        assert_same(decode_state(encoder.encode(state)), state)


def test_a_history_appended_to_reuses_the_compressed_messages_encoded_before() -> None:
    first = [Message(role="user", content=f"message {i} " * 20) for i in range(200)]
    later = [Message(role="assistant", content=f"reply {i}") for i in range(3)]
    history = History(first)
    state = SessionState(session_id="s", loops=MappingProxyType({"main": LoopState(name="main", history=history)}))
    encoder = StateEncoder()
    before = encoder.encode(state)
    grown = replace(state, loops=MappingProxyType({"main": LoopState(name="main", history=history.appended(*later))}))
    after = encoder.encode(grown)
    assert decode_state(after) == grown
    reused = encoder._histories["main"].pieces
    assert len(reused) == 2 and reused[0] in before  # the first 200 messages were not encoded again
    # A history that does not extend the one encoded before (an equal one built apart) is encoded whole.
    apart = replace(state, loops=MappingProxyType({"main": LoopState(name="main", history=History(first))}))
    assert decode_state(encoder.encode(apart)) == apart
    assert len(encoder._histories["main"].pieces) == 1


def test_history_extends_only_what_it_was_appended_from() -> None:
    base = History([Message(role="user", content="a")])
    grown = base.appended(Message(role="user", content="b"))
    assert grown.extends(base) and base.extends(base) and not base.extends(grown)
    fork = base.appended(Message(role="user", content="c"))  # a copy: ``base``'s buffer already holds "b"
    assert not fork.extends(grown) and not grown.extends(fork)
    assert not History(base).extends(base)  # equal, but not built from it


def test_decoded_messages_share_a_fields_set_that_no_copy_changes() -> None:
    """A history's decoded messages share one fields-set (fewer objects for the garbage collector); a copy with
    changes gets its own, so the others are untouched."""
    first, second, third = decode_state(encode_state(_state())).loops["main"].history
    changed = first.model_copy(update={"content": "changed"})
    assert changed.content == "changed" and first.content == "hello"
    assert second.model_fields_set == third.model_fields_set == set(LAYOUTS[Message])
    assert changed.model_dump(exclude_unset=True)["content"] == "changed"
    assert second.model_dump(exclude_unset=True) == second.model_dump()


# --- what is refused ------------------------------------------------------------------------------------------------


def _state() -> SessionState:
    history = History(
        [
            Message(role="user", content="hello"),
            Message(role="assistant", tool_calls=(ToolCall(id="c1", name="echo", arguments={"text": "x"}),)),
            Message(role="tool", content="x", tool_call_id="c1", name="echo"),
        ]
    )
    loop = LoopState(name="main", history=history, turns=1, usage=Usage(input_tokens=3, calls=1))
    return SessionState(session_id="s", rig="r", status="active", loops=MappingProxyType({"main": loop}), last_seq=9)


def _sealed(values: Any) -> bytes:
    """A well-formed snapshot (right magic, checksum, compression) holding ``values``."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, -15)
    body = compressor.compress(ormsgpack.packb(values)) + compressor.flush()
    return MAGIC + zlib.crc32(body).to_bytes(4, "big") + body


def test_every_damaged_byte_is_refused() -> None:
    data = encode_state(_state())
    for i in range(len(data)):
        for flip in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[i] ^= flip
            with pytest.raises(SnapshotDecodeError):
                decode_state(bytes(damaged))


@pytest.mark.parametrize("cut", [0, 3, 4, 8, 9, -1, -2])
def test_a_truncated_snapshot_is_refused(cut: int) -> None:
    data = encode_state(_state())
    with pytest.raises(SnapshotDecodeError):
        decode_state(data[:cut])


def test_trailing_bytes_and_foreign_formats_are_refused() -> None:
    data = encode_state(_state())
    state_json = b'{"session_id":"s"}'
    for foreign in (
        data + b"\x00",
        b"",
        zlib.compress(state_json),  # format 1
        b"LSS\x01" + data[4:],
        _sealed([]),  # well-formed, but not a state
        _sealed([[1, 2, 3]]),
        _sealed(list(ormsgpack.unpackb(zlib.decompressobj(-15).decompress(data[8:])))[:1]),  # a loop's history gone
    ):
        with pytest.raises(SnapshotDecodeError):
            decode_state(foreign)


def test_values_that_do_not_fit_the_layouts_are_refused() -> None:
    values = ormsgpack.unpackb(zlib.decompressobj(-15).decompress(encode_state(_state())[8:]))
    header, history = values
    assert decode_state(_sealed(values)) == _state()  # the helper itself seals a valid snapshot
    for broken in (
        [header, [row[:-1] for row in history]],  # a message short of a field
        [header, [[*row, None] for row in history]],  # one field too many
        [header, [["tool", "x", [["c1", "echo", "not a map"]], None, None]]],  # arguments that are not a map
        [[*header[:3], [[*header[3][0], "extra"]], *header[4:]], history],  # a loop with a field too many
        [header[:-1], history],  # a state short of a field
    ):
        with pytest.raises(SnapshotDecodeError):
            decode_state(_sealed(broken))


async def test_restore_ignores_a_damaged_snapshot_and_folds_the_whole_journal() -> None:
    journal = MemoryJournal()
    writer = await journal.create_session("s", at=0.0)
    started = SessionStarted(session_id="s", rig="r", loops=("main",), at=0.0)
    await writer.append([NewRecord(*codec.encode(started), at=0.0)])
    records = await journal.read("s")
    good = encode_state(replay(records))
    damaged = bytearray(good)
    damaged[-3] ^= 0x10
    await journal.save_snapshot("s", 1, state_schema(), bytes(damaged), at=1.0)
    restored = await restore_state(journal, "s")
    assert restored.snapshot_seq == 0 and restored.ignored is not None and "checksum" in restored.ignored
    assert restored.state == replay(records)
    await journal.save_snapshot("s", 1, state_schema(), good, at=2.0)
    restored = await restore_state(journal, "s")
    assert restored.snapshot_seq == 1 and restored.ignored is None and restored.state == replay(records)


# --- the layouts follow the classes ---------------------------------------------------------------------------------


def test_the_layouts_name_every_field_of_every_type_a_state_holds() -> None:
    """A new field or a new nested type must reach the codec (else it would be dropped): the layouts are the
    fields of each class, in order, and cover every dataclass and model the state's shape names."""
    snapshot.check_layouts()
    named: dict[str, str] = {}
    snapshot._shape(SessionState, named)
    snapshot._shape(Message, named)
    covered = {f"{tp.__module__}.{tp.__qualname__}" for tp in LAYOUTS}
    assert set(named) == covered
    for tp, layout in LAYOUTS.items():
        assert snapshot._field_names(tp) == layout, tp
        if issubclass(tp, BaseModel):
            assert tuple(tp.model_fields) == layout, tp
        else:
            assert is_dataclass(tp) and tuple(f.name for f in fields(tp)) == layout, tp


def test_the_schema_covers_the_format() -> None:
    assert FORMAT == 2 and MAGIC == b"LSS\x02"
    assert state_schema().startswith("state-")
