"""The stored form of a state snapshot: a schema that follows the state's shape, and a decoder that refuses."""

from __future__ import annotations

import subprocess
import sys
import zlib
from dataclasses import dataclass

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness.core import codec, snapshot
from loopd.harness.core.events import SessionStarted
from loopd.harness.core.snapshot import FOLD_VERSION, SnapshotDecodeError, decode_state, encode_state, state_schema
from loopd.harness.core.state import SessionState
from loopd.harness.journal import MemoryJournal, NewRecord, StateSnapshots


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
