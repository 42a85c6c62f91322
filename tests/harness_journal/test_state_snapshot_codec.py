"""The stored form of a state snapshot: a schema that follows the state's shape, and a decoder that refuses."""

from __future__ import annotations

import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass, replace

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness.core import codec, snapshot, user_message
from loopd.harness.core._history import History
from loopd.harness.core.events import SessionStarted
from loopd.harness.core.snapshot import FOLD_VERSION, SnapshotDecodeError, decode_state, encode_state, state_schema
from loopd.harness.core.state import LoopState, SessionState
from loopd.harness.journal import MemoryJournal, NewRecord, StateSnapshots
from loopd.harness.journal._snapshots import INLINE_ENCODE_MESSAGES


@dataclass(frozen=True)
class _Before:
    name: str
    count: int


@dataclass(frozen=True)
class _After:
    name: str
    count: float  # one field's type changed


def test_the_schema_names_the_fold_version_and_is_the_same_in_every_process() -> None:
    assert state_schema().startswith(f"state-{FOLD_VERSION}-")
    other = subprocess.run(
        [sys.executable, "-c", "from loopd.harness.core.snapshot import state_schema; print(state_schema())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert other.stdout.strip() == state_schema()


def test_a_changed_field_changes_the_shape() -> None:
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    snapshot._shape(_Before, before)
    snapshot._shape(_After, after)
    assert list(before.values()) != list(after.values())
    named: dict[str, str] = {}
    snapshot._shape(SessionState, named)
    assert any(name.endswith("state.LoopState") for name in named)  # nested types are described too


@pytest.mark.parametrize(
    "data",
    [b"", b"not zlib", zlib.compress(b"{not json"), zlib.compress(b'{"session_id": 3}'), zlib.compress(b"[]")],
)
def test_what_does_not_decode_is_a_typed_error(data: bytes) -> None:
    with pytest.raises(SnapshotDecodeError):
        decode_state(data)


def test_an_empty_state_round_trips() -> None:
    state = SessionState(session_id="s", rig="r", status="active", last_seq=7)
    assert decode_state(encode_state(state)) == state


async def test_a_session_saves_no_snapshot_before_it_is_released() -> None:
    """While a restore brings a session up its live state is not yet the fold (e.g. its open background runs are
    handed back after `SessionRestored` is journaled): a snapshot taken then would be wrong, so none is."""
    journal = MemoryJournal()
    writer = await journal.create_session("s", at=0.0)
    started = SessionStarted(session_id="s", rig="r", loops=("main",), at=0.0)
    await writer.append([NewRecord(*codec.encode(started), at=0.0)])
    live = SessionState(session_id="s", rig="r", status="active", last_seq=1)
    snapshots = StateSnapshots(journal, "s", lambda: live, VirtualClock(), every=1)
    snapshots.committed([1], [started])
    await snapshots.wait()
    assert snapshots.saves == 0 and await journal.load_snapshot("s", state_schema()) is None
    snapshots.release()
    snapshots.committed([1], [started])
    await snapshots.wait()
    assert snapshots.saves == 1
    stored = await journal.load_snapshot("s", state_schema())
    assert stored is not None and decode_state(stored.data) == live
    await snapshots.aclose()


async def test_a_snapshot_of_few_new_messages_is_encoded_on_the_event_loop_and_a_large_one_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handing a small encode to a worker thread costs the running session more than the encode (its steps wait for
    the interpreter lock while the thread holds it); a large one still goes to a thread, off the event loop."""
    threads: list[int] = []
    encode = snapshot.StateEncoder.encode

    def recording(self: snapshot.StateEncoder, state: SessionState) -> bytes:
        threads.append(threading.get_ident())
        return encode(self, state)

    monkeypatch.setattr(snapshot.StateEncoder, "encode", recording)
    journal = MemoryJournal()
    writer = await journal.create_session("s", at=0.0)
    started = SessionStarted(session_id="s", rig="r", loops=("main",), at=0.0)
    await writer.append([NewRecord(*codec.encode(started), at=0.0)] * 3)

    def state(messages: int, seq: int) -> SessionState:
        history = History(user_message(f"m{i}") for i in range(messages))
        loop = LoopState(name="main", history=history)
        return SessionState(session_id="s", rig="r", status="active", loops={"main": loop}, last_seq=seq)

    for messages, seq in ((3, 1), (INLINE_ENCODE_MESSAGES + 1, 2)):
        live = state(messages, seq)  # a history built apart: every message is new to the encoder
        snapshots = StateSnapshots(journal, "s", lambda live=live: live, VirtualClock(), every=1)  # type: ignore[misc]
        snapshots.release()
        snapshots.committed([seq], [started])
        await snapshots.wait()
        assert snapshots.saves == 1
        stored = await journal.load_snapshot("s", state_schema())
        assert stored is not None and decode_state(stored.data) == live
        await snapshots.aclose()
    assert threads[0] == threading.get_ident() != threads[1]


def test_the_encoder_counts_only_the_messages_it_has_not_encoded() -> None:
    encoder = snapshot.StateEncoder()
    history = History(user_message(f"m{i}") for i in range(5))
    state = SessionState(session_id="s", rig="r", status="active", loops={"main": LoopState("main", history)})
    assert encoder.new_messages(state) == 5
    encoder.encode(state)
    assert encoder.new_messages(state) == 0
    longer = replace(state, loops={"main": LoopState("main", history.appended(user_message("more")))})
    assert encoder.new_messages(longer) == 1
    apart = replace(state, loops={"main": LoopState("main", History(history))})  # equal, but not built on it
    assert encoder.new_messages(apart) == 5
