"""The stored form of a state snapshot: a schema that follows the state's shape, and a decoder that refuses."""

from __future__ import annotations

import subprocess
import sys
import zlib
from dataclasses import dataclass

import pytest

from loopd.harness.core import snapshot
from loopd.harness.core.snapshot import FOLD_VERSION, SnapshotDecodeError, decode_state, encode_state, state_schema
from loopd.harness.core.state import SessionState


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
