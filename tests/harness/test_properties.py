"""Property tests: live state == state rebuilt from the journal (also from a state snapshot + the records after
it); the stored codec round-trips."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.harness import (
    BUILD,
    PLAN,
    EchoTool,
    ForkWorkspaceError,
    LoopDefinition,
    ModelPermanentError,
    NoSuchQuestionError,
    Reply,
    Rig,
    ScriptedModel,
    SqliteJournal,
    ToolCall,
    ToolOutcome,
    Usage,
)
from loopd.harness.actors import NothingToUndoError, WorkspaceBusyError
from loopd.harness.core import codec, fold
from loopd.harness.core import events as ev
from loopd.harness.core.events import QueuedInput
from loopd.harness.foreign import ForeignEngine
from loopd.harness.journal import replay, restore_state
from loopd.harness.snapshots import SnapshotPolicy
from loopd.harness.tools import AskUserTool

from .helpers import assert_gap_free, journal_state

replies = st.one_of(
    st.builds(
        lambda n, d: Reply(tool_calls=[("echo", {"text": "t", "delay": d})] * n),
        st.integers(1, 3),
        st.sampled_from([0, 0.005, 0.02]),
    ),
    st.builds(lambda t, d: Reply(text=t, delay=d, chunk_size=2), st.text(max_size=20), st.sampled_from([0, 0.01])),
    st.just(Reply(error=ModelPermanentError("boom"))),
    st.just(Reply(tool_calls=[("ask_user", {"question": "which one?", "choices": ["a", "b"]})])),
)

commands = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.text(min_size=1, max_size=10)),
        st.tuples(st.just("interrupt"), st.none()),
        st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.005, 0.02])),
        st.tuples(st.just("cancel_last"), st.none()),
        st.tuples(st.just("answer"), st.text(min_size=1, max_size=10)),
        st.tuples(st.just("fork"), st.sampled_from(["keep", "new", "overwrite"])),
        st.tuples(st.just("checkpoint"), st.text(alphabet="ab", max_size=2)),
        st.tuples(st.just("undo"), st.none()),
        st.tuples(st.just("mode"), st.sampled_from(["plan", "build"])),
        st.tuples(st.just("model"), st.sampled_from(["small", "large"])),
        st.tuples(st.just("active"), st.sampled_from(["main", "side"])),
        st.tuples(st.just("foreign"), st.sampled_from(["hi", "tool", "fail"])),
    ),
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(replies, max_size=10), cmds=commands)
def test_live_state_equals_state_rebuilt_from_the_journal(script: list[Reply], cmds: list[tuple[str, object]]) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as d:
            journal = await SqliteJournal.open(Path(d) / "j.db")
            model = ScriptedModel(script, default=Reply(text="default"))
            # ask_user parks turns (answered by "answer", or expiring); the small window puts compactions on the
            # background lane, whose Hustle* events and late HistoryCompacted must fold like the live state.
            main = LoopDefinition(
                name="main",
                model=model,
                tools=(EchoTool(), AskUserTool(timeout=0.05)),
                modes=(BUILD, PLAN),
                context_window=200,
            )
            side = LoopDefinition(name="side", model=model, tools=(EchoTool(),))
            # A foreign loop (the scripted codex CLI): its first turn journals ForeignSessionBound, later ones resume.
            fake_codex = str(Path(__file__).parent.parent / "harness_foreign" / "fake_codex.py")
            foreign = LoopDefinition(
                name="foreign", model=ForeignEngine(kind="codex", command=(sys.executable, fake_codex), cwd=Path(d))
            )
            (Path(d) / "ws").mkdir()
            rig = Rig(
                loops=[main, side, foreign],
                journal=journal,
                workspace=Path(d) / "ws",
                snapshots=SnapshotPolicy(root=Path(d) / "snap"),
                state_snapshots=1,  # a state snapshot whenever none is being saved: restores start from many points
            )
            session = await rig.start_session()
            last: str | None = None
            forks = 0
            for name, arg in cmds:
                if name == "submit":
                    last = await session.submit(str(arg))
                elif name == "interrupt":
                    await session.interrupt()
                elif name == "answer":
                    for _, ask in session.open_questions():
                        with contextlib.suppress(NoSuchQuestionError):
                            await session.provide_user_input(ask.request_id, str(arg))
                elif name == "cancel_last":
                    if last is not None:
                        await session.cancel_queued(last)
                elif name == "fork":  # go on in a fork at the current (settled) point; the parent stops
                    await session.wait_idle(timeout=10)
                    # "new": the fork restores the parent's snapshot into its own directory (a rig on it);
                    # "overwrite": into the same one. Without a snapshot yet, the fork keeps the workspace.
                    forks += 1
                    if arg == "new":
                        rig = replace(rig, workspace=Path(d) / f"ws-fork-{forks}")
                        assert rig.workspace is not None
                        rig.workspace.mkdir()
                    try:
                        forked = await rig.fork_session(session.id, session.last_seq, workspace=arg)  # type: ignore[arg-type]
                    except ForkWorkspaceError:
                        forked = await rig.fork_session(session.id, session.last_seq)
                    parent, session = session, forked
                    await parent.shutdown()
                    last = None
                elif name == "checkpoint":
                    assert rig.workspace is not None
                    (rig.workspace / "f.txt").write_text(str(arg))
                    await session.checkpoint_workspace()
                elif name == "undo":
                    with contextlib.suppress(NothingToUndoError, WorkspaceBusyError):
                        await session.workspace.undo()
                elif name == "mode":
                    await session.set_loop_mode(str(arg), loop="main")
                elif name == "model":
                    await session.change_loop_inference(str(arg))
                elif name == "active":
                    await session.set_active_loop(str(arg))
                elif name == "foreign":
                    last = await session.submit(str(arg), loop="foreign")
                else:
                    await asyncio.sleep(float(arg))  # type: ignore[arg-type]
                # Between commits the live state is exactly the fold of what is durable.
                async with session.log.paused():
                    rebuilt = await journal_state(journal, session.id)
                    assert dict(rebuilt.loops) == dict(session.state.loops)
                    assert dict(rebuilt.hustles) == dict(session.state.hustles)
                    assert rebuilt.workspace == session.state.workspace
                    assert rebuilt.active_loop == session.state.active_loop
                    assert rebuilt.fingerprint == session.state.fingerprint
                    assert rebuilt.last_seq == session.last_seq
                    # Restore from the newest state snapshot (the live session's, or its parent's before the fork
                    # point) + the records after it == the fold of the whole journal.
                    assert (await restore_state(journal, session.id)).state == rebuilt
            await session.wait_idle(timeout=10)
            rebuilt = await journal_state(journal, session.id)
            assert dict(rebuilt.loops) == dict(session.state.loops)
            assert dict(rebuilt.hustles) == dict(session.state.hustles) == {}
            await session.shutdown()
            assert (await restore_state(journal, session.id)).state == await journal_state(journal, session.id)
            await assert_gap_free(journal, session.id)
            # The state after any earlier record (a fork point): from the newest snapshot at or before it.
            records = await journal.read(session.id)
            for upto in sorted({1, len(records) // 3, len(records) // 2, len(records) - 1, len(records)} - {0}):
                assert (await restore_state(journal, session.id, upto=upto)).state == replay(records[:upto])
            await journal.aclose()

    asyncio.run(scenario())


usages = st.builds(Usage, input_tokens=st.integers(0, 10**6), output_tokens=st.integers(0, 10**6))
calls = st.builds(
    ToolCall,
    id=st.text(min_size=1, max_size=8),
    name=st.text(min_size=1, max_size=8),
    arguments=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5), st.none())),
)
outcomes = st.builds(
    ToolOutcome,
    call_id=st.text(max_size=8),
    name=st.text(max_size=8),
    status=st.sampled_from(["ok", "error", "denied", "interrupted", "unknown"]),
    output=st.text(max_size=50),
)
stored_events = st.one_of(
    st.builds(
        ev.TurnStarted,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        inputs=st.lists(
            st.builds(QueuedInput, command_id=st.text(max_size=8), text=st.text(max_size=30)), max_size=3
        ).map(tuple),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.ModelReplied,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        step=st.integers(1, 99),
        text=st.text(max_size=40),
        tool_calls=st.lists(calls, max_size=3).map(tuple),
        usage=usages,
    ),
    st.builds(
        ev.ToolCompleted,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        step=st.integers(1, 99),
        outcome=outcomes,
    ),
    st.builds(
        ev.TurnInterrupted,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        reason=st.text(max_size=10),
        usage=usages,
        outcomes=st.lists(outcomes, max_size=2).map(tuple),
        at=st.floats(0, 2e9),
    ),
    st.builds(ev.SessionStopped, reason=st.text(max_size=10), at=st.floats(0, 2e9)),
    st.builds(
        ev.HustleStarted,
        hustle_id=st.text(min_size=1, max_size=8),
        name=st.text(max_size=8),
        lane=st.sampled_from(["blocking", "background"]),
        for_loop=st.one_of(st.none(), st.text(max_size=8)),
        params=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
        at=st.floats(0, 2e9),
    ),
    st.builds(ev.HustleCompleted, hustle_id=st.text(max_size=8), usage=usages, at=st.floats(0, 2e9)),
    st.builds(
        ev.HustleFailed,
        hustle_id=st.text(max_size=8),
        error_type=st.text(max_size=8),
        message=st.text(max_size=20),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.UserInputRequested,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        step=st.integers(1, 99),
        request_id=st.text(max_size=8),
        question=st.text(max_size=40),
        choices=st.lists(st.text(max_size=8), max_size=3).map(tuple),
        deadline=st.floats(0, 2e9),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.SessionForked,
        session_id=st.text(min_size=1, max_size=8),
        parent_id=st.text(min_size=1, max_size=8),
        parent_seq=st.integers(1, 10**6),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.WorkspaceCheckpointed,
        ref=st.text(max_size=64),
        trigger=st.sampled_from(["turn_started", "turn_done", "step_done", "idle", "manual"]),
        loop=st.text(max_size=8),
        turn_id=st.text(max_size=8),
        files=st.integers(0, 10**6),
        bytes_new=st.integers(0, 10**9),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.WorkspaceRestored,
        ref=st.text(max_size=64),
        index=st.integers(-1, 99),
        previous_ref=st.one_of(st.none(), st.text(max_size=64)),
        reason=st.text(max_size=10),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.WorkspaceForked,
        ref=st.text(max_size=64),
        parent_id=st.text(max_size=8),
        parent_seq=st.integers(1, 10**6),
        checkpoint_seq=st.integers(1, 10**6),
        directory=st.text(max_size=20),
        overwrite=st.booleans(),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.HustleRefused,
        name=st.text(max_size=8),
        lane=st.sampled_from(["blocking", "background"]),
        for_loop=st.one_of(st.none(), st.text(max_size=8)),
        reason=st.text(max_size=20),
        at=st.floats(0, 2e9),
    ),
    st.builds(ev.ActiveLoopChanged, active=st.text(min_size=1, max_size=8), at=st.floats(0, 2e9)),
    st.builds(
        ev.ConfigurationAdopted,
        changes=st.lists(
            st.builds(
                ev.ConfigChange, aspect=st.text(max_size=8), before=st.text(max_size=8), after=st.text(max_size=8)
            ),
            max_size=3,
        ).map(tuple),
        fingerprint=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
        at=st.floats(0, 2e9),
    ),
    st.builds(ev.LoopModeChanged, loop=st.just("main"), mode=st.text(max_size=8), at=st.floats(0, 2e9)),
    st.builds(
        ev.ForeignToolUsed,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        call_id=st.text(max_size=8),
        name=st.text(max_size=8),
        arguments=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
        output=st.text(max_size=40),
        is_error=st.booleans(),
        at=st.floats(0, 2e9),
    ),
    st.builds(
        ev.ForeignSessionBound,
        loop=st.just("main"),
        engine=st.sampled_from(["claude", "codex"]),
        foreign_session_id=st.text(max_size=40),
        at=st.floats(0, 2e9),
    ),
    st.builds(ev.LoopInferenceChanged, loop=st.just("main"), model=st.text(max_size=8), at=st.floats(0, 2e9)),
    st.builds(
        ev.ContextMeasured,
        loop=st.just("main"),
        turn_id=st.text(max_size=8),
        step=st.integers(1, 99),
        tokens=st.integers(0, 10**6),
        window=st.one_of(st.none(), st.integers(1, 10**6)),
        at=st.floats(0, 2e9),
    ),
)


@settings(max_examples=200)
@given(event=stored_events)
def test_stored_codec_round_trips(event: ev.SessionEvent | ev.LoopEvent) -> None:
    kind, version, data = codec.encode(event)
    assert codec.decode(kind, version, data) == event


def test_codec_upgrades_old_versions_and_refuses_unknown_ones() -> None:
    import pytest

    data = b'{"reason":"old","at":1.0,"legacy":true}'
    with pytest.raises(codec.CodecError):
        codec.decode("session_stopped", 0, data)
    upgraded = codec.decode(
        "session_stopped",
        0,
        data,
        upgrades={("session_stopped", 0): lambda b: {k: v for k, v in b.items() if k != "legacy"}},
    )
    assert upgraded == ev.SessionStopped(reason="old", at=1.0)
    with pytest.raises(codec.CodecError):
        codec.decode("no_such_kind", 1, b"{}")
    with pytest.raises(codec.CodecError):
        codec.decode("session_stopped", 99, data)
    with pytest.raises(codec.CodecError):
        codec.encode(ev.TokenDelta(loop="m", turn_id="t", step=1, text="x"))  # type: ignore[arg-type]


def test_fold_of_nothing_is_an_empty_state() -> None:
    assert fold([]).loops == {}
