"""A journal that is not a journal any more is refused with `JournalCorruptError`, on every backend and whether or
not Python runs with ``-O``: a seq out of order, an unknown kind, a newer version, an undecodable payload, an event
that cannot follow the state before it. The cause is chained; the restore leaves no writer behind."""

from __future__ import annotations

import ast
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.harness import (
    InvalidTransitionError,
    Journal,
    JournalCorruptError,
    LoopDefinition,
    MemoryJournal,
    Reply,
    Rig,
    ScriptedModel,
    Usage,
)
from loopd.harness.core import codec
from loopd.harness.core.events import StepDone
from loopd.harness.journal import NewRecord, Record, replay

from .conftest import Storage

SRC = Path(__file__).resolve().parents[2] / "src" / "loopd" / "harness"


def _rig(journal: Journal) -> Rig:
    model = ScriptedModel([], default=Reply(text="hello"))
    return Rig(loops=[LoopDefinition(name="main", model=model)], journal=journal)


async def _one_turn(journal: Journal) -> str:
    """A session with one finished turn, shut down; its id."""
    session = await _rig(journal).start_session()
    try:
        await session.ask("hi", timeout=10)
    finally:
        await session.shutdown()
    return session.id


async def _append_raw(journal: Journal, session_id: str, record: NewRecord) -> None:
    writer = await journal.open_writer(session_id)
    try:
        await writer.append([record])
    finally:
        await writer.aclose()


def _stray_step() -> NewRecord:
    """A well-formed `step_done` with no turn open before it."""
    kind, version, data = codec.encode(StepDone(loop="main", turn_id="t-none", step=1, usage=Usage()))
    return NewRecord(kind, version, data, 1.0)


@pytest.mark.parametrize(
    ("record", "says", "cause"),
    [
        (NewRecord("mystery_event", 1, b"{}", 1.0), "unknown event kind 'mystery_event'", codec.CodecError),
        (NewRecord("turn_done", 99, b"{}", 1.0), "newer than this build", codec.CodecError),
        (NewRecord("turn_done", 1, b"{not json", 1.0), "cannot decode turn_done", codec.CodecError),
        (_stray_step(), "StepDone outside a turn", InvalidTransitionError),
    ],
    ids=["unknown-kind", "newer-version", "undecodable-payload", "event-out-of-place"],
)
async def test_restore_refuses_a_corrupt_record(
    storage: Storage, record: NewRecord, says: str, cause: type[Exception]
) -> None:
    journal = await storage.open()
    session_id = await _one_turn(journal)
    await _append_raw(journal, session_id, record)
    rig = _rig(journal)
    with pytest.raises(JournalCorruptError, match=says) as refused:
        await rig.restore_session(session_id)
    assert isinstance(refused.value.__cause__, cause)
    # The failed restore took no writer for good: another one opens (and would fence it anyway), and the
    # records are all still there to repair.
    writer = await journal.open_writer(session_id)
    await writer.aclose()
    assert (await journal.read(session_id))[-1].kind == record.kind


async def test_sqlite_restore_refuses_a_gap_in_the_seqs(tmp_path: Path) -> None:
    storage = Storage("sqlite", tmp_path)
    try:
        journal = await storage.open()
        session_id = await _one_turn(journal)
        db = sqlite3.connect(tmp_path / "journal.db")
        try:
            db.execute("UPDATE journal_records SET seq = seq + 5 WHERE seq = (SELECT max(seq) FROM journal_records)")
            db.commit()
        finally:
            db.close()
        reopened = await storage.open()  # a fresh process's view of the file
        with pytest.raises(JournalCorruptError, match="expected seq"):
            await _rig(reopened).restore_session(session_id)
    finally:
        await storage.aclose()


async def test_memory_restore_refuses_records_out_of_order() -> None:
    journal = MemoryJournal()
    session_id = await _one_turn(journal)
    stored = journal._sessions[session_id].records  # the test reaches in to corrupt what the API never would
    stored[1], stored[2] = stored[2], stored[1]
    with pytest.raises(JournalCorruptError, match="expected seq 2, found 3"):
        await _rig(journal).restore_session(session_id)


def _record(seq: int, event: StepDone) -> Record:
    kind, version, data = codec.encode(event)
    return Record("s", seq, kind, version, data, 0.0)


def test_replay_starts_at_seq_1_or_right_after_the_state_it_continues() -> None:
    step = StepDone(loop="main", turn_id="t", step=1, usage=Usage())
    with pytest.raises(JournalCorruptError, match="expected seq 1, found 2"):
        replay([_record(2, step)])
    assert replay([]).last_seq == 0


def test_no_assert_guards_the_replay_path() -> None:
    """Input checks on stored records must survive ``python -O``: none of them is an ``assert``."""
    paths = [SRC / "core" / "apply.py", SRC / "core" / "codec.py", *sorted((SRC / "journal").glob("*.py"))]
    found = [
        f"{path.name}:{node.lineno}"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert found == []


def test_corruption_is_refused_under_python_O() -> None:
    script = (
        "from loopd.harness.core.events import StepDone\n"
        "from loopd.harness import Usage, JournalCorruptError\n"
        "from loopd.harness.core import codec\n"
        "from loopd.harness.journal import Record, replay\n"
        "k, v, d = codec.encode(StepDone(loop='main', turn_id='t', step=1, usage=Usage()))\n"
        "try:\n"
        "    replay([Record('s', 1, k, v, d, 0.0)])\n"
        "except JournalCorruptError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "StepDone outside a turn" in done.stdout
