"""The built-in harness adapter: a real rig, a gate, the ledger trail, and a crash resumed without a second run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loopd._infra.clock import VirtualClock
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, HarnessEngine, HistoryEntry
from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database, DatabaseOptions, open_database

from .conftest import (
    block,
    content_of,
    make_engine,
    new_conversation,
    new_response,
    until,
    until_done,
    until_phase,
    until_true,
    without_call_ids,
)
from .rigs import FINAL_TEXT, FIRST_TEXT, open_rig


async def _start(db: Database, engine: HarnessEngine) -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation, task_id="task-7")
    call = await engine.start(
        CallRequest(
            owner_uid="task-uid-7",
            effect_key="respond",
            target="builtin",
            text="please write a.txt",
            message_id=response,
            history=(HistoryEntry("user", "alice", "earlier question"), HistoryEntry("harness", "builtin", "earlier")),
            asker="user:alice",
            timeout=120,
        )
    )
    return call.id, response


async def _answer_gate(engine: HarnessEngine, call_id: str, db: Database, response: str) -> None:
    await until_phase(engine, call_id, "waiting_input")
    content = await content_of(db, response)
    gates = [b["id"] for b in content["blocks"] if b["type"] == "ask"]
    assert len(gates) == 1
    await engine.answer_gate(call_id, gates[0].removeprefix("gate/"), "approve", "user:alice")


async def _run_clean(folder: Path, clock: VirtualClock) -> dict[str, Any]:
    async with (
        open_rig(folder / "harness") as harness,
        open_database(folder / "loopd.db", options=DatabaseOptions(clock=clock)) as db,
    ):
        async with make_engine(db, {"builtin": BuiltinHarnessAdapter(harness.rig)}, clock=clock) as engine:
            call_id, response = await _start(db, engine)
            await _answer_gate(engine, call_id, db, response)
            call = await until_done(engine, call_id, timeout=20)
            assert call.phase == "succeeded", call.error
        return await content_of(db, response)


async def test_a_builtin_call_runs_the_harness_through_its_gate(sqlite_db: Database, tmp_path: Path) -> None:
    async with open_rig(tmp_path / "harness") as harness:
        journal = harness.rig.journal
        looked_up: list[str] = []
        session = journal.session

        async def counted(session_id: str) -> Any:
            looked_up.append(session_id)
            return await session(session_id)

        journal.session = counted  # type: ignore[method-assign]
        async with make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(harness.rig)}) as engine:
            call_id, response = await _start(sqlite_db, engine)
            await _answer_gate(engine, call_id, sqlite_db, response)
            call = await engine.wait(call_id, 20)
        sessions = await harness.rig.sessions()
    assert call.phase == "succeeded" and call.result == {"format": "text", "content": FINAL_TEXT}
    assert call.execution_ref == call_id
    assert [info.session_id for info in sessions] == [call_id]  # the harness session id is the call id
    assert looked_up == []  # a new session of its own is created, not looked for first (nor its parent after)
    assert harness.tool.ran == ["a.txt"]
    prompt = harness.script.requests[0].messages[-1].content
    assert "earlier question" in prompt and prompt.endswith("please write a.txt")

    content = await content_of(sqlite_db, response)
    assert block(content, "answer") == {"id": "answer", "type": "text", "content": f"{FIRST_TEXT}\n\n{FINAL_TEXT}"}
    tool = block(content, "tool/call-1")
    assert tool is not None and (tool["name"], tool["status"], tool["output"]) == ("touch", "completed", "touched")
    gate = next(b for b in content["blocks"] if b["type"] == "ask")
    assert (gate["status"], gate["value"]) == ("success", "approve")
    assert "write a.txt" in gate["prompt"]

    store = SqlLedgerStore(sqlite_db)
    view = await engine.trail(call_id)
    actions = {e.event_type for e in view.events}
    assert {"turn.loopd.gate_opened", "turn.loopd.gate_resolved", "run.completed"} <= actions
    usage = await store.usage(Scope(harness_call_id=call_id))
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert (await store.usage(Scope(task_id="task-7"))).input_tokens == usage.input_tokens
    conversation = (await engine.get(call_id)).conversation_id
    assert (await store.usage(Scope(conversation_id=conversation))).output_tokens == usage.output_tokens
    assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []


async def test_a_crashed_engine_is_resumed_through_the_journal_and_ends_like_a_clean_run(
    tmp_path: Path, clock: VirtualClock
) -> None:
    clean = await _run_clean(tmp_path / "clean", clock)

    folder = tmp_path / "crash"
    async with (
        open_rig(folder / "harness", stall_final=True) as harness,
        open_database(folder / "loopd.db", options=DatabaseOptions(clock=clock)) as db,
    ):
        adapter = BuiltinHarnessAdapter(harness.rig)
        first = make_engine(db, {"builtin": adapter}, clock=clock, replica_id="first")
        await first.open()
        call_id, response = await _start(db, first)
        await _answer_gate(first, call_id, db, response)
        await until_true(lambda: harness.script.final_calls == 1)  # the answer's model call hangs

        async def tool_finished_applied() -> bool:
            return (await first.get(call_id)).checkpoint >= 6

        await until(tool_finished_applied)
        checkpoint = (await first.get(call_id)).checkpoint
        assert checkpoint == 6  # model call, text, tool started, gate opened, gate resolved, tool finished
        await first.abort()  # a crash: drives cancelled, the in-process session dropped, no lease released

        await clock.advance(31)  # the crashed engine's lease expires
        async with make_engine(db, {"builtin": adapter}, clock=clock, replica_id="second") as second:
            call = await until_done(second, call_id, timeout=20)
        assert call.phase == "succeeded", call.error
        assert call.checkpoint > checkpoint

        assert without_call_ids(await content_of(db, response)) == without_call_ids(clean)
        assert harness.tool.ran == ["a.txt"]  # the tool ran once
        assert harness.script.final_calls == 2  # the model call in flight was re-issued (a read effect)
        assert [info.session_id for info in await harness.rig.sessions()] == [call_id]  # one harness session
        store = SqlLedgerStore(db)
        lanes = await store.find_lanes(Scope(harness_call_id=call_id))
        assert [(lane.run_id, lane.name) for lane in lanes] == [(call_id, "main")]
        view = await store.load_run(lanes[0].session_id, call_id)
        requested = [e for e in view.events if e.event_type == "attempt.requested" and "mode" in e.payload]
        assert [e.payload["mode"] for e in requested] == ["start", "resume"]
        # The crashed attempt is settled by the resumed drive: failed, interrupted, its usage marked unknown (the
        # model call in flight had streamed nothing, so there is no evidence of what it spent).
        assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []
        outcome = next(e for e in view.events if e.subject_id == requested[0].subject_id and e.seq > requested[0].seq)
        assert outcome.event_type == "attempt.failed"
        assert outcome.payload["reason"] == "interrupted" and outcome.payload["error"]["code"] == "interrupted"
        assert outcome.payload["usage"] is None and outcome.payload["usage_estimated"] is True
        totals = await store.usage(Scope(harness_call_id=call_id))
        assert totals.usage_estimated and totals.estimated_attempts == 1
        assert totals.input_tokens > 0  # the reported model calls, the re-issued one included
