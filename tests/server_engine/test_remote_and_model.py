"""The remote adapter against a real ``loopd harness serve`` on loopback, and the OpenAI-compatible model adapter
against the scripted OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness import Usage
from loopd.harness.models import FailWithStatus, OpenAICompatibleModel, ServerReply, open_scripted_server
from loopd.harness.serve import create_app, open_harness_server
from loopd.server.engine import CallRequest, HarnessEngine, OpenAIModelAdapter, RemoteHarnessAdapter
from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database

from .conftest import (
    answer_events,
    assert_append_only,
    block,
    content_of,
    make_engine,
    new_conversation,
    new_response,
    until_done,
    until_phase,
)
from .rigs import FINAL_TEXT, FIRST_TEXT, Harness, open_rig

TOKEN = "remote-token"


async def _start(db: Database, engine: HarnessEngine, target: str, text: str = "please write a.txt") -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    call = await engine.start(
        CallRequest("uid-r", "respond", target, text, message_id=response, asker="user:alice", timeout=120)
    )
    return call.id, response


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[tuple[Harness, str]]:
    async with open_rig(tmp_path / "remote") as harness:
        app = create_app(harness.rig, token=TOKEN)
        async with open_harness_server(app) as server:
            yield harness, server.url


async def _gate_id(db: Database, response: str) -> str:
    content = await content_of(db, response)
    gate: str = next(b["id"] for b in content["blocks"] if b["type"] == "ask")
    return gate.removeprefix("gate/")


async def test_a_remote_call_survives_an_engine_crash_without_a_second_session(
    remote: tuple[Harness, str], sqlite_db: Database, clock: VirtualClock
) -> None:
    harness, url = remote
    first_adapter = RemoteHarnessAdapter(url, TOKEN, timeout=30)
    first = make_engine(sqlite_db, {"remote": first_adapter}, clock=clock, replica_id="first")
    await first.open()
    call_id, response = await _start(sqlite_db, first, "remote")
    await until_phase(first, call_id, "waiting_input")
    checkpoint = (await first.get(call_id)).checkpoint
    await first.abort()  # the engine crashes while the remote waits for permission
    await first_adapter.aclose()

    await clock.advance(31)
    second_adapter = RemoteHarnessAdapter(url, TOKEN, timeout=30)
    second = make_engine(sqlite_db, {"remote": second_adapter}, clock=clock, replica_id="second")
    await second.answer_gate(call_id, await _gate_id(sqlite_db, response), "approve", "user:alice")
    async with second:
        call = await until_done(second, call_id, timeout=20)
    await second_adapter.aclose()

    assert call.phase == "succeeded", call.error
    assert call.checkpoint > checkpoint
    content = await content_of(sqlite_db, response)
    assert block(content, "answer") == {"id": "answer", "type": "text", "content": f"{FIRST_TEXT}\n\n{FINAL_TEXT}"}
    assert block(content, "result") == {"id": "result", "type": "result", "format": "text", "content": FINAL_TEXT}
    tool = block(content, "tool/call-1")
    assert tool is not None and tool["status"] == "completed"
    assert harness.tool.ran == ["a.txt"]
    sessions = await harness.rig.sessions()
    assert len(sessions) == 1 and call.execution_ref == sessions[0].session_id  # one remote session, one input
    records = await harness.journal.read(sessions[0].session_id)
    assert [r.kind for r in records].count("turn_started") == 1


async def test_the_remote_adapter_refuses_a_wrong_token(remote: tuple[Harness, str], sqlite_db: Database) -> None:
    _harness, url = remote
    adapter = RemoteHarnessAdapter(url, "wrong-token", timeout=30)
    async with make_engine(sqlite_db, {"remote": adapter}) as engine:
        call_id, _ = await _start(sqlite_db, engine, "remote")
        call = await engine.wait(call_id, 10)
    await adapter.aclose()
    assert call.phase == "failed" and call.error is not None and "401" in call.error["message"]


def _model(url: str) -> OpenAIModelAdapter:
    model = OpenAICompatibleModel("gpt-test", base_url=url, api_key="test", max_retries=0, timeout=30)
    return OpenAIModelAdapter(model, system_prompt="Be brief.", owned=model)


async def test_the_model_adapter_streams_one_completion(sqlite_db: Database) -> None:
    script = [ServerReply(text="Hello there, friend.", usage=Usage(input_tokens=7, output_tokens=3), chunk_size=4)]
    async with open_scripted_server(script) as url:
        adapter = _model(url)
        async with make_engine(sqlite_db, {"gpt": adapter}) as engine:
            call_id, response = await _start(sqlite_db, engine, "gpt", text="say hello")
            call = await engine.wait(call_id, 10)
        await adapter.aclose()
    assert call.phase == "succeeded" and call.result == {"format": "text", "content": "Hello there, friend."}
    content = await content_of(sqlite_db, response)
    assert block(content, "answer") == {"id": "answer", "type": "text", "content": "Hello there, friend."}
    usage = await SqlLedgerStore(sqlite_db).usage(Scope(harness_call_id=call_id))
    assert (usage.input_tokens, usage.output_tokens) == (7, 3)
    # previews (coalesced when they arrive together): one set, then appends; the final text adds nothing
    assert_append_only(await answer_events(sqlite_db, response), "Hello there, friend.")


async def test_an_unavailable_model_is_run_again_and_a_refusal_fails_the_call(sqlite_db: Database) -> None:
    script = [
        ServerReply(fault=FailWithStatus(status=503, message="overloaded")),
        ServerReply(text="Second try."),
        ServerReply(fault=FailWithStatus(status=400, message="bad request")),
    ]
    async with open_scripted_server(script) as url:
        adapter = _model(url)
        async with make_engine(sqlite_db, {"gpt": adapter}) as engine:
            call_id, _ = await _start(sqlite_db, engine, "gpt", text="hi")
            retried = await until_done(engine, call_id)  # the retry after the 503 comes due on the virtual clock
            conversation = await new_conversation(sqlite_db)
            other = await engine.start(
                CallRequest("uid-x", "respond", "gpt", "hi", conversation_id=conversation, timeout=60)
            )
            refused = await until_done(engine, other.id)
        await adapter.aclose()
    assert retried.phase == "succeeded" and retried.result["content"] == "Second try."
    assert refused.phase == "failed" and refused.error is not None and refused.error["code"] == "model_error"
    store = SqlLedgerStore(sqlite_db)
    attempts = [
        e.payload.get("mode")
        for e in (await store.load_run(retried.conversation_id or "", call_id)).events
        if e.event_type == "attempt.requested" and "mode" in e.payload
    ]
    assert attempts == ["start", "resume"]  # the lost completion and its re-run are two attempts
