"""A harness call started as a fork of an earlier call's session (`CallRequest.fork`): it answers from that
harness state, the earlier session stays as it was, a bad fork point fails the call, and an adapter that cannot
fork is refused before anything is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from loopd.harness import LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal
from loopd.harness.core.snapshot import state_schema
from loopd.harness.journal import Record, last_settled_seq, replay, unsettled_loops
from loopd.server.engine import AdapterRequest, BuiltinHarnessAdapter, CallRequest, HarnessEngine
from loopd.server.storage import Database, HarnessCall, InvalidRecord
from tests.support.waiting import eventually

from .conftest import ScriptedAdapter, make_engine, new_conversation, new_response, until_done


def answer(request: ModelRequest) -> Reply:
    """Says how many user messages it has seen and echoes the last one (so a fork's history shows)."""
    users = [m.content for m in request.messages if m.role == "user"]
    return Reply(text=f"{len(users)} question(s); last: {users[-1]}")


@asynccontextmanager
async def open_rig(folder: Path) -> AsyncIterator[Rig]:
    folder.mkdir(parents=True, exist_ok=True)
    journal = await SqliteJournal.open(folder / "journal.db")
    try:
        yield Rig(loops=[LoopDefinition(name="main", model=ScriptedModel(answer))], journal=journal)
    finally:
        await journal.aclose()


@asynccontextmanager
async def modal_rig(folder: Path, script: Callable[[ModelRequest], Reply]) -> AsyncIterator[Rig]:
    """A rig whose main loop has the build and plan modes and the file tools, in ``folder``/ws."""
    from loopd.harness.core.config import BUILD, PLAN
    from loopd.harness.gate import AccessConfig
    from loopd.harness.tools import Workspace, default_tools

    ws = folder / "ws"
    ws.mkdir()
    loop = LoopDefinition(
        name="main",
        model=ScriptedModel(script),
        tools=tuple(default_tools(Workspace(ws))),
        access=AccessConfig(),
        modes=(BUILD, PLAN),
    )
    async with open_rig(folder / "harness") as base:
        yield replace(base, loops=[loop], workspace=ws)


async def ask(
    db: Database, engine: HarnessEngine, owner: str, text: str, *, fork: tuple[str, int] | None = None
) -> CallRequest:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation, task_id=f"task-{owner}")
    return CallRequest(
        owner_uid=owner, effect_key="respond", target="builtin", text=text, message_id=response, timeout=60, fork=fork
    )


async def test_a_call_forked_from_an_earlier_session_answers_from_its_state(
    sqlite_db: Database, tmp_path: Path
) -> None:
    async with (
        open_rig(tmp_path / "harness") as rig,
        make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine,
    ):
        first = await engine.start(await ask(sqlite_db, engine, "uid-1", "apples"))
        done = await until_done(engine, first.id)
        assert done.phase == "succeeded" and done.result == {
            "format": "text",
            "content": "1 question(s); last: apples",
        }
        settled = (await rig.journal.session(first.id)).last_seq  # type: ignore[union-attr]

        forked = await engine.start(await ask(sqlite_db, engine, "uid-2", "pears", fork=(first.id, settled)))
        assert forked.params["fork"] == {"session": first.id, "seq": settled}
        done = await until_done(engine, forked.id)
        # The fork's harness saw the first call's question too: its history is the first session's.
        assert done.result == {"format": "text", "content": "2 question(s); last: pears"}
        info = await rig.journal.session(forked.id)
        assert info is not None and (info.parent_id, info.parent_seq) == (first.id, settled)
        assert (await rig.journal.session(first.id)).last_seq == settled  # type: ignore[union-attr]

        inside = await engine.start(await ask(sqlite_db, engine, "uid-3", "plums", fork=(first.id, 2)))
        failed = await until_done(engine, inside.id)
        assert failed.phase == "failed" and "inside a turn" in str(failed.error)
        unknown = await engine.start(await ask(sqlite_db, engine, "uid-4", "figs", fork=("no-such", 1)))
        assert (await until_done(engine, unknown.id)).phase == "failed"


async def test_fork_points_are_validated_and_need_an_adapter_that_forks(sqlite_db: Database) -> None:
    async with make_engine(sqlite_db, {"plain": ScriptedAdapter()}) as engine:
        request = replace(await ask(sqlite_db, engine, "uid-9", "hi", fork=("s", 1)), target="plain")
        with pytest.raises(InvalidRecord, match="cannot start a call as a fork"):
            await engine.start(request)
        for bad in (("", 1), ("s", 0)):
            with pytest.raises(InvalidRecord):
                await engine.start(replace(request, fork=bad))
        assert await engine.find("uid-9", "respond") is None  # nothing was stored


async def test_a_forked_call_on_a_rig_with_snapshots_finds_the_files_the_source_turn_found(
    sqlite_db: Database, tmp_path: Path
) -> None:
    from loopd.harness import ToolCall
    from loopd.harness.gate import Access, AccessConfig
    from loopd.harness.snapshots import SnapshotPolicy
    from loopd.harness.tools import FS_WRITE, Workspace, default_tools

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("before")

    def script(request: ModelRequest) -> Reply:
        """``put`` writes a.txt; anything else answers with what a.txt holds (what the turn sees)."""
        last = request.messages[-1]
        if last.role == "user" and last.content.startswith("put"):
            return Reply(tool_calls=[ToolCall(id="w", name="write_file", arguments={"path": "a.txt", "content": "x"})])
        return Reply(text=f"a.txt: {(ws / 'a.txt').read_text()}")

    loop = LoopDefinition(
        name="main",
        model=ScriptedModel(script),
        tools=tuple(default_tools(Workspace(ws))),
        access=AccessConfig(kinds={FS_WRITE: Access.ALLOW}),
    )
    async with open_rig(tmp_path / "harness") as base:
        plain = replace(base, loops=[loop], workspace=ws)
        rig = replace(plain, snapshots=SnapshotPolicy(root=tmp_path / "snap"))
        async with make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine:
            first = await until_done(engine, (await engine.start(await ask(sqlite_db, engine, "uid-1", "put it"))).id)
            assert first.phase == "succeeded" and (ws / "a.txt").read_text() == "x"
            point = await engine.fork_point(first)
            assert point is not None
            retried = await engine.start(await ask(sqlite_db, engine, "uid-2", "look", fork=point))
            done = await until_done(engine, retried.id)
            assert done.result == {"format": "text", "content": "a.txt: before"}  # as the first call's turn found it
            kinds = [r.kind for r in await rig.journal.read(retried.id, point[1] + 1)]
            assert kinds[:4] == ["session_forked", "workspace_forked", "session_restored", "workspace_restored"]

        # A source session without snapshots (they were off then): the fork keeps the workspace as it is.
        (ws / "a.txt").write_text("now")
        async with make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(plain)}) as engine:
            old = await until_done(engine, (await engine.start(await ask(sqlite_db, engine, "uid-3", "put it"))).id)
            assert old.phase == "succeeded"
            point = await engine.fork_point(old)
        (ws / "a.txt").write_text("now")
        async with make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine:
            assert point is not None
            kept = await engine.start(await ask(sqlite_db, engine, "uid-4", "look", fork=point))
            assert (await until_done(engine, kept.id)).result == {"format": "text", "content": "a.txt: now"}


async def test_a_call_with_a_mode_option_runs_its_turn_in_that_mode(sqlite_db: Database, tmp_path: Path) -> None:
    """`MODE_OPTION` (loop-server's conversation mode): set on the session before its input, so the whole turn runs
    in it; a mode the harness does not declare fails the call."""
    from loopd.server.engine import MODE_OPTION

    offered: list[set[str]] = []

    def script(request: ModelRequest) -> Reply:
        offered.append({tool.name for tool in request.tools})
        return Reply(text="ok")

    async with (
        modal_rig(tmp_path, script) as rig,
        make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine,
    ):
        planned = replace(await ask(sqlite_db, engine, "uid-1", "plan it"), params={MODE_OPTION: "plan"})
        done = await until_done(engine, (await engine.start(planned)).id)
        assert done.phase == "succeeded"
        assert "write_file" not in offered[-1] and "read_file" in offered[-1]
        kinds = [r.kind for r in await rig.journal.read(done.id)]
        assert kinds.index("loop_mode_changed") < kinds.index("turn_started")  # before the turn, not in it

        built = await until_done(engine, (await engine.start(await ask(sqlite_db, engine, "uid-2", "go"))).id)
        assert built.phase == "succeeded" and "write_file" in offered[-1]  # no option: the harness's own mode

        unknown = replace(await ask(sqlite_db, engine, "uid-3", "?"), params={MODE_OPTION: "yolo"})
        failed = await until_done(engine, (await engine.start(unknown)).id)
        assert failed.phase == "failed" and "yolo" in str(failed.error)


async def test_a_call_goes_on_from_where_an_earlier_calls_session_ended(
    sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`HarnessEngine.continuation_point` (the responder's next question in a conversation): the earlier call's
    session id and last seq, once it ended settled; a call started there sees that session's history, and an empty
    `MODE_OPTION` puts its loop back in the harness's own mode rather than the one that session ended in."""
    from loopd.server.engine import MODE_OPTION, HistoryEntry
    from loopd.server.engine._adapter import CONVERSATION_SO_FAR, SINCE_LAST_ANSWER

    offered: list[set[str]] = []

    def script(request: ModelRequest) -> Reply:
        offered.append({tool.name for tool in request.tools})
        return answer(request)

    async with (
        modal_rig(tmp_path, script) as rig,
        make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine,
    ):
        planned = replace(await ask(sqlite_db, engine, "uid-1", "apples"), params={MODE_OPTION: "plan"})
        first = await until_done(engine, (await engine.start(planned)).id)
        assert first.phase == "succeeded" and "write_file" not in offered[-1]
        end = (await rig.journal.session(first.id)).last_seq  # type: ignore[union-attr]
        # Its run shut the session down settled here, in this process: known without folding its state.
        import loopd.server.engine._builtin as builtin

        folded = builtin.restore_state
        monkeypatch.setattr(builtin, "restore_state", None)
        point = await engine.continuation_point(first)
        assert point == (first.id, end)
        monkeypatch.setattr(builtin, "restore_state", folded)

        said = (HistoryEntry("operator", "router", "the pears are on their way"),)
        going_on = replace(
            await ask(sqlite_db, engine, "uid-2", "pears", fork=point), params={MODE_OPTION: ""}, history=said
        )
        second = await until_done(engine, (await engine.start(going_on)).id)
        assert str(second.result["content"]).startswith("2 question(s); last: ")  # the session's history
        assert str(second.result["content"]).endswith("Current request:\npears")
        assert "write_file" in offered[-1]  # back in the harness's own mode (build)
        own = await rig.journal.read(second.id, point[1] + 1)
        assert not any(b"apples" in record.data for record in own)  # the history is shared, not copied
        # What was said since is introduced as such: the session holds the conversation before it.
        taken = [r for r in own if b"the pears are on their way" in r.data]
        assert taken and all(SINCE_LAST_ANSWER.encode() in r.data for r in taken)
        assert not any(CONVERSATION_SO_FAR.encode() in r.data for r in own)

        # Another adapter (a restarted server) knows nothing: it folds the session's state to find its end.
        other = BuiltinHarnessAdapter(rig)
        asking = AdapterRequest(first.id, "builtin", "", (), {}, first.deadline_at, 1.0)
        assert await other.end_point(asking, first.id) == end
        assert await other.end_point(asking, "no-such-session") is None

        assert await engine.continuation_point(replace(first, target="nobody")) is None
        assert await engine.continuation_point(replace(first, execution_ref=None)) is None


def _fold_fork_point(records: list[Record], first_own: int) -> int:
    """The fork point folded over a session's whole chain (what `BuiltinHarnessAdapter.fork_point` must equal)."""
    state = replay(records[: first_own - 1])
    for index in range(first_own - 1, len(records)):
        state = replay([records[index]], state)
        if unsettled_loops(state):
            return max(last_settled_seq(records[:index]), 1)
    return max(last_settled_seq(records), 1)


async def test_a_retry_late_in_a_conversation_finds_its_fork_point_without_folding_the_chain(
    sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each later question's session goes on from the one before (a chain of forks). Retrying an answer late in
    the conversation asks for that call's fork point: the state it shares with its parents comes from their
    newest snapshot at or before the fork, and only the call's own records are folded after it."""
    async with modal_rig(tmp_path, answer) as base:
        rig = replace(base, state_snapshots=1)
        async with make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine:
            calls: list[HarnessCall] = []
            point: tuple[str, int] | None = None
            for index in range(3):
                started = await engine.start(await ask(sqlite_db, engine, f"uid-{index}", f"q{index}", fork=point))
                calls.append(await until_done(engine, started.id))
                point = await engine.continuation_point(calls[-1])
                assert point is not None

            for call in calls:
                info = await rig.journal.session(call.id)
                assert info is not None
                first_own = info.parent_seq + 1 if info.parent_id is not None else 1
                expected = _fold_fork_point(await rig.journal.read(call.id, 1), first_own)
                assert await engine.fork_point(call) == (call.id, expected)

            last = calls[-1]
            info = await rig.journal.session(last.id)
            assert info is not None and info.parent_id == calls[1].id

            async def snapshot_before_the_fork() -> bool:
                found = await rig.journal.load_snapshot(last.id, state_schema(), upto=info.parent_seq)
                return found is not None

            await eventually(snapshot_before_the_fork, timeout=10.0, what="a snapshot of the chain before the fork")
            reads: list[int] = []
            read = rig.journal.read

            async def counted(session_id: str, from_seq: int = 1, limit: int | None = None) -> list[Record]:
                reads.append(from_seq)
                return await read(session_id, from_seq, limit)

            monkeypatch.setattr(rig.journal, "read", counted)
            assert (await engine.fork_point(last))[1] > info.parent_seq
            assert reads and 1 not in reads  # never the chain from its start
