"""ask_user through the engine: the harness's question becomes an ask block answered only by the asker."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness import LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal, ToolCall
from loopd.harness.tools import AskUserTool
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, GateForbidden, HarnessEngine
from loopd.server.storage import Database, DatabaseOptions, open_database

from .conftest import content_of, make_engine, new_conversation, new_response, until_done, until_phase


def _script(request: ModelRequest) -> Reply:
    results = [m for m in request.messages if m.role == "tool"]
    if not results:
        question = {"question": "Which region?", "choices": ["eu", "us"]}
        return Reply(tool_calls=[ToolCall(id="ask-1", name="ask_user", arguments=question)])
    return Reply(text=f"deploying: {results[-1].content}")


async def _rig(folder: Path) -> Rig:
    folder.mkdir(parents=True, exist_ok=True)
    journal = await SqliteJournal.open(folder / "journal.db")
    model = ScriptedModel(_script, model_name="scripted-model")
    return Rig(loops=[LoopDefinition(name="main", model=model, tools=(AskUserTool(),))], journal=journal)


async def _start(db: Database, engine: HarnessEngine) -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation, task_id="task-q")
    call = await engine.start(
        CallRequest(
            owner_uid="task-uid-q",
            effect_key="respond",
            target="builtin",
            text="deploy it",
            message_id=response,
            asker="user:alice",
            timeout=120,
        )
    )
    return call.id, response


async def _question(db: Database, response: str) -> dict[str, object]:
    content = await content_of(db, response)
    (block,) = [b for b in content["blocks"] if b["type"] == "ask"]
    return block  # type: ignore[no-any-return]


async def test_the_question_is_an_ask_block_only_the_asker_answers(sqlite_db: Database, tmp_path: Path) -> None:
    rig = await _rig(tmp_path / "harness")
    try:
        async with make_engine(sqlite_db, {"builtin": BuiltinHarnessAdapter(rig)}) as engine:
            call_id, response = await _start(sqlite_db, engine)
            await until_phase(engine, call_id, "waiting_input")
            block = await _question(sqlite_db, response)
            assert block["id"] == "question/ask-1" and block["prompt"] == "Which region?"
            assert block["choices"] == [{"value": "eu", "label": "eu"}, {"value": "us", "label": "us"}]
            assert block["status"] == "pending" and block["allow_other"] is True

            with pytest.raises(GateForbidden):  # another user of the server: 403, nothing recorded
                await engine.answer_question(call_id, "ask-1", "us", "user:mallory")
            assert (await _question(sqlite_db, response))["status"] == "pending"

            await engine.answer_question(call_id, "ask-1", "eu", "user:alice")
            call = await until_done(engine, call_id, timeout=20)
        assert call.phase == "succeeded" and call.result == {
            "format": "text",
            "content": "deploying: The user answered: eu",
        }
        block = await _question(sqlite_db, response)
        assert (block["status"], block["value"]) == ("success", "eu")
    finally:
        await rig.journal.aclose()


async def test_a_question_asked_before_a_crash_is_answered_after_the_resume(
    tmp_path: Path, clock: VirtualClock
) -> None:
    rig = await _rig(tmp_path / "harness")
    try:
        async with open_database(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock)) as db:
            adapter = BuiltinHarnessAdapter(rig)
            first = make_engine(db, {"builtin": adapter}, clock=clock, replica_id="first")
            await first.open()
            call_id, _ = await _start(db, first)
            await until_phase(first, call_id, "waiting_input")
            await first.abort()  # a crash while the question waits
            await clock.advance(31)  # the crashed engine's lease expires
            async with make_engine(db, {"builtin": adapter}, clock=clock, replica_id="second") as second:
                await until_phase(second, call_id, "waiting_input")
                await second.answer_question(call_id, "ask-1", "us", "user:alice")
                call = await until_done(second, call_id, timeout=20)
            assert call.phase == "succeeded", call.error
            assert call.result == {"format": "text", "content": "deploying: The user answered: us"}
    finally:
        await rig.journal.aclose()
