"""Fail-closed appends, crash and restore, gap-free sequences under concurrency."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd._infra.clock import settle
from loopd.harness import (
    EchoTool,
    Idempotency,
    Journal,
    JournalError,
    JournalFencedError,
    LoopDefinition,
    MemoryJournal,
    ModelRequest,
    Reply,
    Rig,
    ScriptedModel,
    SessionFaultError,
    SqliteJournal,
    SubscriptionLostError,
)
from loopd.harness.core.events import ToolCompleted, TurnDone, TurnInterrupted
from loopd.harness.journal import NewRecord
from tests.support.waiting import eventually

from .helpers import assert_gap_free, journal_state, same_loops


def tool_rig(journal: Journal, model: ScriptedModel, *, idempotency: Idempotency = Idempotency.INHERENT) -> Rig:
    return Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(idempotency=idempotency),))],
        journal=journal,
    )


# --- fail-closed ---------------------------------------------------------------------------------------------


async def test_an_append_error_stops_the_session_with_a_typed_fault() -> None:
    calls = {"n": 0}

    def fail_on_tool_completed(_sid: str, records: object) -> None:
        calls["n"] += 1
        if any(r.kind == "tool_completed" for r in records):  # type: ignore[attr-defined]
            raise OSError("disk full")

    journal = MemoryJournal(fail_append=fail_on_tool_completed)
    tool = EchoTool()
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "x"})]), Reply(text="never")])
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(tool,))], journal=journal)
    session = await rig.start_session()
    sub = session.subscribe()
    await session.submit("go")
    with pytest.raises(SessionFaultError, match="disk full"):
        async for _ in sub:
            pass
    assert session.status == "faulted"
    with pytest.raises(SessionFaultError):
        await session.submit("more")
    # Nothing after the failed append was stored or acted on: the model was called once.
    assert len(model.requests) == 1
    kinds = [r.kind for r in await journal.read(session.id)]
    assert kinds == ["session_started", "turn_started", "context_measured", "model_replied"]
    await session.shutdown()  # closing a faulted session is safe


async def test_sqlite_append_failure_is_fail_closed(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = await SqliteJournal.open(path)
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "x"})]), Reply(text="never")])
    session = await tool_rig(journal, model).start_session()
    # A real storage failure, injected from another connection: the table refuses tool results.
    other = sqlite3.connect(path)
    other.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON journal_records WHEN NEW.kind = 'tool_completed' "
        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
    )
    other.commit()
    other.close()
    sub = session.subscribe()
    await session.submit("go")
    with pytest.raises(SessionFaultError, match="injected failure"):
        async for _ in sub:
            pass
    assert len(model.requests) == 1
    assert await assert_gap_free(journal, session.id) == 4  # started, turn started, context measured, model replied
    await session.shutdown()
    await journal.aclose()


# --- crash and restore ---------------------------------------------------------------------------------------


async def crash_and_restore(journal: Journal, crash_after: float, seed: int) -> None:
    rng = random.Random(seed)
    script = []
    for _ in range(6):
        if rng.random() < 0.6:
            calls = [("echo", {"text": f"t{rng.randint(0, 99)}", "delay": rng.choice([0, 0.01, 0.03])})]
            calls *= rng.randint(1, 3)
            script.append(Reply(tool_calls=calls, delay=rng.choice([0, 0.01])))
        else:
            script.append(Reply(text="answer " * 5, chunk_size=3, chunk_delay=0.002))
    model = ScriptedModel(script, default=Reply(text="done"))
    rig = tool_rig(journal, model)
    session = await rig.start_session()
    for i in range(3):
        await session.submit(f"input {i}")
    await asyncio.sleep(crash_after)
    session.abort()  # the process "dies": tasks cancelled, no final record, the writer is just dropped
    restored = await rig.restore_session(session.id)
    try:
        await assert_gap_free(journal, session.id)
        loop = restored.state.loops["main"]
        assert loop.turn is None and loop.queued == ()
        calls = [c.id for m in loop.history for c in m.tool_calls]
        answered = [m.tool_call_id for m in loop.history if m.role == "tool"]
        assert sorted(calls) == sorted(a for a in answered if a is not None)
        same_loops(restored.state, await journal_state(journal, session.id))
        # The restored session works.
        done = await restored.ask("after the crash", timeout=30)
        assert isinstance(done, TurnDone)
    finally:
        await restored.shutdown()
    await assert_gap_free(journal, session.id)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crash_after=st.floats(min_value=0, max_value=0.12), seed=st.integers(0, 10_000))
def test_crash_at_random_points_then_restore_is_consistent(crash_after: float, seed: int) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as d:
            journal = await SqliteJournal.open(Path(d) / "j.db")
            try:
                await crash_and_restore(journal, crash_after, seed)
            finally:
                await journal.aclose()

    asyncio.run(scenario())


async def test_restore_interrupts_an_open_turn_and_marks_open_tools_unknown(
    sqlite_journal: SqliteJournal,
) -> None:
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "slow", "delay": 30})])], default=Reply(text="ok"))
    rig = tool_rig(sqlite_journal, model, idempotency=Idempotency.NONE)
    session = await rig.start_session()
    sub = session.subscribe()
    await session.submit("go")
    async for env in sub:
        if env.event.kind == "tool_call_started":
            break
    session.abort()
    restored = await rig.restore_session(session.id)
    records = await sqlite_journal.read(session.id)
    tail = [r.kind for r in records][-2:]
    assert tail == ["session_restored", "turn_interrupted"]
    state = restored.state.loops["main"]
    tool_msgs = [m for m in state.history if m.role == "tool"]
    assert len(tool_msgs) == 1 and "outcome unknown" in tool_msgs[0].content
    await restored.shutdown()


@pytest.mark.parametrize(("idempotency", "reruns"), [(Idempotency.INHERENT, 2), (Idempotency.NONE, 1)])
async def test_resume_reruns_only_idempotent_tools(
    sqlite_journal: SqliteJournal, idempotency: Idempotency, reruns: int
) -> None:
    tool = EchoTool(idempotency=idempotency)
    model = ScriptedModel([Reply(tool_calls=[("echo", {"text": "side effect", "delay": 0.3})]), Reply(text="done")])
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(tool,))], journal=sqlite_journal)
    session = await rig.start_session()
    sub = session.subscribe()
    await session.submit("go")
    async for env in sub:
        if env.event.kind == "tool_call_started":
            break
    session.abort()
    restored = await rig.restore_session(session.id, mode="resume")
    sub2 = restored.subscribe(from_seq=1)
    outcome = None
    async with asyncio.timeout(30):
        async for env in sub2:
            if isinstance(env.event, ToolCompleted):
                outcome = env.event.outcome
            if isinstance(env.event, TurnDone):
                break
    assert outcome is not None
    assert len(tool.runs) == reruns  # the started run (cancelled by the crash) + the re-run, if idempotent
    assert outcome.status == ("ok" if idempotency is Idempotency.INHERENT else "unknown")
    await restored.shutdown()


async def test_resume_reissues_a_model_call_in_flight(sqlite_journal: SqliteJournal) -> None:
    model = ScriptedModel([Reply(text="lost", delay=30), Reply(text="second try")])
    rig = tool_rig(sqlite_journal, model)
    session = await rig.start_session()
    await session.submit("go")
    async with asyncio.timeout(30):
        while not model.requests:  # the model call is in flight (its reply takes 30 s)
            await settle()
    session.abort()
    restored = await rig.restore_session(session.id, mode="resume")
    await restored.wait_idle(timeout=30)
    assert restored.state.loops["main"].last_reply == "second try"
    assert len(model.requests) == 2 and model.requests[0].messages == model.requests[1].messages
    await restored.shutdown()


async def test_restore_fences_the_old_writer(sqlite_journal: SqliteJournal) -> None:
    rig = tool_rig(sqlite_journal, ScriptedModel([], default=Reply(text="x")))
    session = await rig.start_session()
    old_writer = session.log.writer
    session.abort()
    restored = await rig.restore_session(session.id)
    with pytest.raises(JournalFencedError):
        await old_writer.append([NewRecord("session_stopped", 1, b'{"reason":"x","at":0}', 0.0)])
    await restored.shutdown()
    await assert_gap_free(sqlite_journal, session.id)


async def test_restore_of_an_unknown_session_is_a_typed_error(journal: Journal) -> None:
    from loopd.harness import SessionNotFoundError

    rig = tool_rig(journal, ScriptedModel([]))
    with pytest.raises(SessionNotFoundError):
        await rig.restore_session("nope")


async def test_a_session_started_with_its_first_input_journals_its_start_with_that_input() -> None:
    appends: list[list[str]] = []
    journal = MemoryJournal(fail_append=lambda _sid, records: appends.append([r.kind for r in records]))
    rig = tool_rig(journal, ScriptedModel([], default=Reply(text="hi")))
    session = await rig.start_session(with_first_input=True)
    assert appends == [] and await journal.read(session.id) == []  # nothing stored (nor shown) before the input
    sub = session.subscribe(from_seq=1)
    result = await session.ask("hello", timeout=30)
    assert isinstance(result, TurnDone)
    assert appends[0] == ["session_started", "turn_started"]  # one append, not one each
    seen = [(e.seq, e.event.kind) for e in [await anext(sub), await anext(sub)]]
    assert seen == [(1, "session_started"), (2, "turn_started")]
    assert session.state.fingerprint == rig.fingerprint()
    await session.shutdown()
    await assert_gap_free(journal, session.id)


async def test_a_held_start_that_no_input_follows_is_stored_when_the_session_ends(journal: Journal) -> None:
    rig = tool_rig(journal, ScriptedModel([]))
    session = await rig.start_session(with_first_input=True)
    await session.shutdown()
    assert [r.kind for r in await journal.read(session.id)] == ["session_started", "session_stopped"]


async def test_a_session_created_but_never_started_is_started_by_its_restore(journal: Journal) -> None:
    # A crash between the session's creation and its first append (a held start) leaves it without records.
    writer = await journal.create_session("s-cut", at=1.0)
    await writer.aclose()
    rig = tool_rig(journal, ScriptedModel([], default=Reply(text="answered")))
    session = await rig.restore_session("s-cut", mode="resume")
    result = await session.ask("hello", timeout=30)
    assert isinstance(result, TurnDone)
    kinds = [r.kind for r in await journal.read("s-cut")]
    assert kinds[:2] == ["session_started", "turn_started"]
    await session.shutdown()
    await assert_gap_free(journal, "s-cut")


# --- concurrency ---------------------------------------------------------------------------------------------


async def test_gap_free_sequences_under_100_concurrent_sessions(sqlite_journal: SqliteJournal) -> None:
    def two_tool_steps_per_turn(req: ModelRequest) -> Reply:
        tools = sum(m.role == "tool" for m in req.messages)
        users = sum(m.role == "user" for m in req.messages)
        return Reply(tool_calls=[("echo", {"text": "x"})]) if tools < 2 * users else Reply(text="done")

    model = ScriptedModel(two_tool_steps_per_turn)
    rig = tool_rig(sqlite_journal, model)
    sessions = await asyncio.gather(*(rig.start_session() for _ in range(100)))

    async def drive(s: object) -> None:
        for i in range(3):
            result = await s.ask(f"turn {i}", timeout=20)  # type: ignore[attr-defined]
            assert isinstance(result, TurnDone)

    await asyncio.gather(*(drive(s) for s in sessions))
    await asyncio.gather(*(s.shutdown() for s in sessions))
    counts = [await assert_gap_free(sqlite_journal, s.id) for s in sessions]
    assert all(c == counts[0] for c in counts)
    # Group commit: far fewer transactions than records.
    assert sqlite_journal.commits < sqlite_journal.records_written / 2


async def test_journal_contract_basics(journal: Journal) -> None:
    from loopd.harness import SessionBusyError

    w = await journal.create_session("s1", at=1.0)
    assert await w.append([NewRecord("k", 1, b"{}", 1.0)] * 3) == [1, 2, 3]
    assert await w.append([NewRecord("k", 1, b"{}", 1.0)]) == [4]
    with pytest.raises(SessionBusyError):
        await journal.create_session("s1", at=1.0)
    w2 = await journal.open_writer("s1")
    assert w2.last_seq == 4
    with pytest.raises(JournalError):
        await w.append([NewRecord("k", 1, b"{}", 1.0)])
    assert await w2.append([NewRecord("k", 1, b"{}", 1.0)]) == [5]
    assert [r.seq for r in await journal.read("s1", 3, 2)] == [3, 4]
    info = await journal.session("s1")
    assert info is not None and info.last_seq == 5

    followed: list[int] = []

    async def follow() -> None:
        async for r in journal.follow("s1", 4, poll_interval=0.05):
            followed.append(r.seq)
            if r.seq == 6:
                return

    task = asyncio.create_task(follow())
    await eventually(lambda: followed == [4, 5], what="the follower to read the stored records")
    await w2.append([NewRecord("k", 1, b"{}", 1.0)])
    await asyncio.wait_for(task, 30)
    assert followed == [4, 5, 6]


def test_subscription_lost_error_says_where_to_resume() -> None:
    err = SubscriptionLostError(41)
    assert err.last_seq == 41 and "resubscribe from 42" in str(err)
    assert isinstance(TurnInterrupted, type)
