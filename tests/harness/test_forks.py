"""Fork and time travel: a fork at seq N replays to its parent's fold at N, forks of forks work, a seq inside a
turn is refused with the last settled seq before it, and a fork stores only its own records."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.harness import (
    EchoTool,
    ForkPointError,
    Journal,
    LoopDefinition,
    MemoryJournal,
    Reply,
    Rig,
    ScriptedModel,
    SessionNotFoundError,
    SqliteJournal,
)
from loopd.harness.core import SessionState
from loopd.harness.core.events import TurnDone
from loopd.harness.journal import Record, replay, unsettled_loops

from .helpers import assert_gap_free, journal_state

replies = st.one_of(
    st.builds(lambda n: Reply(tool_calls=[("echo", {"text": "t"})] * n), st.integers(1, 2)),
    st.builds(lambda t: Reply(text=t or "ok"), st.text(max_size=12)),
)


def rig_on(journal: Journal, script: list[Reply]) -> Rig:
    model = ScriptedModel(script, default=Reply(text="default"))
    return Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=journal)


def settled_points(records: list[Record]) -> list[int]:
    """Every seq after which no loop is inside a turn (computed independently of `last_settled_seq`)."""
    points: list[int] = []
    state: SessionState | None = None
    for record in records:
        state = replay([record], state)
        if not unsettled_loops(state):
            points.append(record.seq)
    return points


def stored(path: Path, session_id: str) -> tuple[int, int]:
    """Rows and payload bytes the SQLite file holds for ``session_id`` itself."""
    db = sqlite3.connect(path)
    try:
        rows, size = db.execute(
            "SELECT count(*), coalesce(sum(length(r.data)), 0) FROM journal_records r "
            "JOIN journal_sessions s ON s.sid = r.sid WHERE s.id = ?",
            (session_id,),
        ).fetchone()
    finally:
        db.close()
    return int(rows), int(size)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(replies, min_size=1, max_size=8),
    questions=st.integers(1, 4),
    picks=st.lists(st.integers(0, 1000), min_size=1, max_size=3),
)
def test_a_fork_at_n_replays_to_the_parents_fold_at_n_and_stores_only_its_own_records(
    script: list[Reply], questions: int, picks: list[int]
) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "j.db"
            journal = await SqliteJournal.open(path)
            rig = rig_on(journal, script)
            current = await rig.start_session()
            for i in range(questions):
                assert isinstance(await current.ask(f"q{i}", timeout=10), TurnDone)
            for depth, pick in enumerate(picks):
                records = await journal.read(current.id)
                points = settled_points(records)
                # Every seq inside a turn is refused, naming the last settled seq before it.
                inside = [r.seq for r in records if r.seq not in points]
                if inside:
                    seq = inside[pick % len(inside)]
                    with pytest.raises(ForkPointError, match="inside a turn") as refused:
                        await rig.fork_session(current.id, seq)
                    assert refused.value.settled == max(p for p in points if p < seq)
                at = points[pick % len(points)]
                parent_rows = stored(path, current.id)
                fork = await rig.fork_session(current.id, at)
                forked = await journal.read(fork.id)
                # Shared, not copied: the fork's first `at` records are its parent's, and the file holds only the
                # fork's own (its SessionForked and SessionRestored); the parent's rows are unchanged.
                assert [(r.seq, r.kind, r.data) for r in forked[:at]] == [(r.seq, r.kind, r.data) for r in records[:at]]
                assert [r.kind for r in forked[at:]] == ["session_forked", "session_restored"]
                own = forked[at:]
                assert stored(path, fork.id) == (len(own), sum(len(r.data) for r in own))
                assert stored(path, current.id) == parent_rows
                # Replayed, the fork is its parent's fold at `at` (under its own id, active).
                at_n = replay(records[:at])
                rebuilt = await journal_state(journal, fork.id)
                assert dict(rebuilt.loops) == dict(at_n.loops)
                assert (rebuilt.session_id, rebuilt.status) == (fork.id, "active")
                assert dict(fork.state.loops) == dict(rebuilt.loops)
                assert fork.state.session_id == rebuilt.session_id
                # The fork goes on by itself; the next pick forks this fork (forks of forks).
                assert isinstance(await fork.ask(f"fork {depth}", timeout=10), TurnDone)
                assert dict((await journal_state(journal, fork.id)).loops) == dict(fork.state.loops)
                assert await journal.read(current.id, 1, len(records)) == records  # the parent is untouched
                await current.shutdown()
                current = fork
            await current.shutdown()
            await assert_gap_free(journal, current.id)
            await journal.aclose()

    asyncio.run(scenario())


async def test_a_running_parent_is_left_alone_and_a_fork_can_take_another_path() -> None:
    journal = MemoryJournal()
    rig = rig_on(journal, [Reply(text="first"), Reply(text="parent's second"), Reply(text="fork's second")])
    parent = await rig.start_session("parent")
    try:
        assert isinstance(await parent.ask("one", timeout=10), TurnDone)
        point = parent.last_seq
        assert isinstance(await parent.ask("two", timeout=10), TurnDone)
        fork = await rig.fork_session("parent", point, "fork")
        try:
            done = await fork.ask("two, differently", timeout=10)
            assert isinstance(done, TurnDone) and done.text == "fork's second"
            assert parent.state.loops["main"].last_reply == "parent's second"
            assert fork.state.loops["main"].turns == 2 == parent.state.loops["main"].turns
            info = await journal.session("fork")
            assert info is not None and (info.parent_id, info.parent_seq) == ("parent", point)
        finally:
            await fork.shutdown()
    finally:
        await parent.shutdown()


async def test_fork_points_out_of_range_or_unknown_sessions_are_typed_errors() -> None:
    journal = MemoryJournal()
    rig = rig_on(journal, [Reply(text="hi")])
    async with rig.open_session("s") as session:
        await session.ask("hello", timeout=10)
        last = session.last_seq
        for bad in (0, -3, last + 1):
            with pytest.raises(ForkPointError):
                await rig.fork_session("s", bad)
        with pytest.raises(SessionNotFoundError):
            await rig.fork_session("nope", 1)
    assert [s.session_id for s in await journal.sessions()] == ["s"]  # nothing was created by the refusals


async def test_a_chain_of_forks_each_at_its_parents_end_folds_only_what_follows_the_newest_snapshot() -> None:
    """A conversation's sessions: each forked at the end of the one before. A fork whose restore folded
    `RESTORE_FOLD_SNAPSHOT` records or more saves a snapshot at its first commit, so the next fork — and the check
    that its point is settled — folds only the records after it, not the chain from its start."""
    from loopd.harness.core.snapshot import state_schema
    from loopd.harness.journal import RESTORE_FOLD_SNAPSHOT, restore_state

    journal = MemoryJournal()
    rig = rig_on(journal, [])
    async with rig.open_session("s0") as first:
        while first.last_seq < RESTORE_FOLD_SNAPSHOT:
            assert isinstance(await first.ask("again", timeout=10), TurnDone)
        end = first.last_seq
    assert await journal.load_snapshot("s0", state_schema()) is None  # fewer records than `state_snapshots`

    second = await rig.fork_session("s0", end, "s1")
    try:
        assert isinstance(await second.ask("go on", timeout=10), TurnDone)
        assert second.log.snapshots is not None
        await second.log.snapshots.wait()
        end = second.last_seq
    finally:
        await second.shutdown()
    saved = await journal.load_snapshot("s1", state_schema())
    assert saved is not None and saved.seq > RESTORE_FOLD_SNAPSHOT  # taken right after it came up

    at_end = await restore_state(journal, "s1", upto=end)
    assert at_end.snapshot_seq == saved.seq and len(at_end.records) == end - saved.seq < RESTORE_FOLD_SNAPSHOT
    whole = replay(await journal.read("s1", 1, end))
    assert at_end.state.loops["main"].turns == whole.loops["main"].turns == first.state.loops["main"].turns + 1
    assert at_end.state.loops["main"].history == whole.loops["main"].history
    before = await restore_state(journal, "s1", upto=saved.seq - 1)  # a snapshot after ``upto`` is not used
    assert before.snapshot_seq == 0 and before.state.last_seq == saved.seq - 1

    third = await rig.fork_session("s1", end, "s2")
    try:
        assert third.state.loops["main"].history == whole.loops["main"].history
        assert isinstance(await third.ask("and on", timeout=10), TurnDone)
        assert third.log.snapshots is not None
        await third.log.snapshots.wait()
    finally:
        await third.shutdown()
    assert await journal.load_snapshot("s2", state_schema(), upto=end) == saved  # its own: none (a short fold)
