"""Full prompts of calls through a remote harness: a real ``loopd harness serve`` app on loopback (its model the
real OpenAI-compatible adapter against the scripted server) exposes each session's model calls at
``GET /v1/sessions/{id}/model-calls``, redacted before they leave and only to its token's holder; the engine's
remote adapter reads them and stores each attempt's request and reply like the built-in adapter does. The peer keeps
them, redacted, in its data directory: a restart before the engine read them loses nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from loopd._infra.clock import VirtualClock
from loopd._infra.redaction import Redactor
from loopd.harness import LoopDefinition, Rig, SqliteJournal, ToolCall
from loopd.harness.core import EffectKind
from loopd.harness.gate import MemoryRuleStore
from loopd.harness.models import (
    FailWithStatus,
    OpenAICompatibleModel,
    ServerReply,
    ServerToolCall,
    open_scripted_server,
)
from loopd.harness.serve import IDEMPOTENCY_FILE, create_app, open_harness_server
from loopd.harness.serve._model_calls import MODEL_CALLS_FILE
from loopd.harness.tools._protocol import PreparedCall, Requirement
from loopd.server.audit._routes import resolve_request
from loopd.server.engine import CallRequest, PromptRecording, RemoteHarnessAdapter
from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database
from tests.support.waiting import eventually

from .conftest import content_of, make_engine, new_conversation, new_response, until_done, until_phase
from .test_ledger_prompts import API_KEY, BEARER, CONFIGURED, SCRIPT, LeakyTool, _rig, _rows

TOKEN = "remote-prompts-token-0123456789"


async def test_a_remote_calls_prompts_are_stored_per_attempt_and_redacted(
    sqlite_db: Database, tmp_path: Path, clock: Any
) -> None:
    prompts = PromptRecording(clock, Redactor([r"ACME-[0-9]{8}"], literals=[API_KEY]))
    async with open_scripted_server(list(SCRIPT)) as model_url, _rig(tmp_path / "peer", model_url) as rig:
        # The peer redacts with what `loopd harness serve` gives it: its model's key and its own token.
        app = create_app(rig, token=TOKEN, redactor=Redactor(literals=[API_KEY, TOKEN]))
        async with open_harness_server(app) as server:
            adapter = RemoteHarnessAdapter(server.url, TOKEN, timeout=30, prompts=prompts)
            async with make_engine(sqlite_db, {"remote": adapter}, clock=clock, redactor=prompts.redactor) as engine:
                conversation = await new_conversation(sqlite_db)
                response = await new_response(sqlite_db, conversation, task_id="task-remote")
                call = await engine.start(
                    CallRequest(
                        "uid-rp", "respond", "remote", "what is in deploy.env?", message_id=response, asker="user:a"
                    )
                )
                done = await until_done(engine, call.id, timeout=30)
                assert done.phase == "succeeded", done.error
            await adapter.aclose()
            session = done.execution_ref
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                path = f"/v1/sessions/{session}/model-calls"
                raw = await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
                # Only the token's holder reads them, like every session route.
                assert (await http.get(path)).status_code == 401
                assert (await http.get(path, headers={"Authorization": "Bearer wrong-token"})).status_code == 401
                missing = await http.get("/v1/sessions/nope/model-calls", headers={"Authorization": f"Bearer {TOKEN}"})
                assert missing.status_code == 404

    # What left the peer: three calls (the first with two attempts: the 429, then its retry), redacted.
    assert raw.status_code == 200, raw.text
    page = raw.json()
    assert [item["index"] for item in page["items"]] == [1, 2, 3] and page["has_more"] is False
    assert [a["status_code"] for a in page["items"][0]["attempts"]] == [429, None]
    assert page["items"][2]["request"]["extends"] == 3  # the third call resends only its new messages
    for secret in (API_KEY, BEARER, TOKEN):
        assert secret not in raw.text
    assert CONFIGURED in raw.text  # the peer knows no such pattern; the ledger's own redaction removes it below

    ledger = SqlLedgerStore(sqlite_db)
    lane = (await ledger.find_lanes(Scope(harness_call_id=call.id)))[0]
    events = await ledger.load_lane(lane.id)
    requested = [e for e in events if e.event_type == "attempt.requested" and "request" in e.payload]
    failed = [e for e in events if e.event_type == "attempt.failed" and "duration_ms" in e.payload]
    completed = [e for e in events if e.event_type == "attempt.completed" and "reply" in e.payload]
    assert (len(requested), len(failed), len(completed)) == (4, 1, 3)
    assert failed[0].payload["error"]["status_code"] == 429
    assert requested[0].payload["request"] == requested[1].payload["request"]  # the retried request, stored once
    structure = await ledger.structure(Scope(harness_call_id=call.id))
    by_id = {attempt.id: attempt for attempt in structure.attempts}
    retried, answered = by_id[failed[0].subject_id], by_id[requested[1].subject_id]
    assert retried.action_id == answered.action_id and (retried.attempt_no, answered.attempt_no) == (1, 2)

    last = await resolve_request(ledger, requested[-1].payload["request"]["sha256"])
    assert last["model"] == "gpt-test" and last["system"] == "Be brief."
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]
    assert last["messages"][0]["content"].endswith("what is in deploy.env?")
    reply = json.loads((await ledger.get_artifact(completed[-1].payload["reply"]["sha256"])).body)
    assert reply["text"].startswith("The file holds") and reply["provider_request_id"]

    stored: list[str] = []
    for table in ("ledger_artifacts", "ledger_events", "ledger_attempts"):
        stored.extend(repr(row) for row in await _rows(sqlite_db, f"SELECT * FROM {table}"))
    everything = "\n".join(stored)
    assert "[REDACTED]" in everything
    for secret in (API_KEY, CONFIGURED, BEARER, TOKEN):
        assert secret not in everything


async def test_without_recording_the_peer_serves_no_model_calls(tmp_path: Path) -> None:
    async with open_scripted_server(list(SCRIPT)) as model_url, _rig(tmp_path / "peer", model_url) as rig:
        app = create_app(rig, token=TOKEN, model_calls=False)
        async with (
            open_harness_server(app) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"}) as http,
        ):
            created = (await http.post("/v1/sessions", json={})).json()
            page = await http.get(f"/v1/sessions/{created['id']}/model-calls")
    assert page.status_code == 200 and page.json() == {"items": [], "next_after": 0, "has_more": False}


async def test_a_remote_model_call_that_fails_for_good_keeps_its_attempts(
    sqlite_db: Database, tmp_path: Path, clock: Any
) -> None:
    prompts = PromptRecording(clock, Redactor())
    script = [ServerReply(fault=FailWithStatus(status=429, message="slow down", retry_after=0))] * 3
    async with (
        open_scripted_server(script) as model_url,
        _rig(tmp_path / "peer", model_url) as rig,
        open_harness_server(create_app(rig, token=TOKEN)) as server,
    ):
        adapter = RemoteHarnessAdapter(server.url, TOKEN, timeout=30, prompts=prompts)
        async with make_engine(sqlite_db, {"remote": adapter}, clock=clock) as engine:
            conversation = await new_conversation(sqlite_db)
            response = await new_response(sqlite_db, conversation)
            call = await engine.start(
                CallRequest("uid-rf", "respond", "remote", "hi", message_id=response, asker="user:a")
            )
            assert (await until_done(engine, call.id, timeout=30)).phase == "failed"
        await adapter.aclose()
    ledger = SqlLedgerStore(sqlite_db)
    structure = await ledger.structure(Scope(harness_call_id=call.id))
    [model_call] = [action for action in structure.actions if action.type == "model_call"]
    attempts = [a for a in structure.attempts if a.action_id == model_call.id]
    assert sorted(a.attempt_no or 0 for a in attempts) == [1, 2, 3]  # each try of the peer's model, with its 429
    events = await ledger.load_lane((await ledger.find_lanes(Scope(harness_call_id=call.id)))[0].id)
    failed = [e for e in events if e.event_type == "attempt.failed" and e.subject_id in {a.id for a in attempts}]
    assert len(failed) == 3 and all(e.payload["error"]["status_code"] == 429 for e in failed)


class GatedLeakyTool(LeakyTool):
    """`LeakyTool` that needs an ``fs.write`` permission: the gate asks before it runs."""

    @property
    def effect(self) -> EffectKind:
        return EffectKind.WRITE

    def prepare(self, call: ToolCall) -> PreparedCall:
        need = Requirement(kind="fs.write", scope="/ws", match="deploy.env", description="write deploy.env")
        return PreparedCall(call_id=call.id, tool="read_env", arguments=dict(call.arguments), requirements=(need,))


GATED_SCRIPT = [
    ServerReply(text="Reading it.", tool_calls=(ServerToolCall(name="read_env", id="c1"),)),
    ServerReply(text="The file holds an API key; I will not repeat it.", finish_reason="stop"),
]


@asynccontextmanager
async def _peer(folder: Path, model_url: str) -> AsyncIterator[tuple[str, Rig]]:
    """A ``loopd harness serve`` app whose records and keys are kept in ``folder`` (as `serve` keeps them in its
    data directory); leaving the block stops it the way a SIGTERM does (its lifespan ends)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = OpenAICompatibleModel("gpt-test", base_url=model_url, api_key=API_KEY, max_retries=0, timeout=30)
    journal = await SqliteJournal.open(folder / "journal.db")
    loop = LoopDefinition(name="main", model=model, tools=(GatedLeakyTool(),), system_prompt="Be brief.")
    rig = Rig(loops=[loop], journal=journal, rules=MemoryRuleStore(), name="peer-rig")
    try:
        app = create_app(
            rig,
            token=TOKEN,
            redactor=Redactor(literals=[API_KEY, TOKEN]),
            idempotency_path=folder / IDEMPOTENCY_FILE,
            model_calls_path=folder / MODEL_CALLS_FILE,
        )
        async with open_harness_server(app) as server:
            yield server.url, rig
    finally:
        await journal.aclose()
        await model.aclose()


async def test_the_peers_records_survive_its_restart_and_still_reach_the_ledger(
    sqlite_db: Database, tmp_path: Path, clock: VirtualClock
) -> None:
    prompts = PromptRecording(clock, Redactor(literals=[API_KEY]))
    folder = tmp_path / "peer"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with open_scripted_server(list(GATED_SCRIPT)) as model_url:
        async with _peer(folder, model_url) as (url, rig):
            adapter = RemoteHarnessAdapter(url, TOKEN, timeout=30, prompts=prompts)
            first = make_engine(sqlite_db, {"remote": adapter}, clock=clock, replica_id="first")
            await first.open()
            conversation = await new_conversation(sqlite_db)
            response = await new_response(sqlite_db, conversation, task_id="task-restart")
            request = CallRequest("uid-rs", "respond", "remote", "what is in deploy.env?", message_id=response)
            call_id = (await first.start(replace(request, asker="user:a"))).id
            await until_phase(first, call_id, "waiting_input", timeout=30)
            await first.abort()  # loop-server goes away while the peer waits for permission
            await adapter.aclose()
            # The gate is answered at the peer while no engine watches: the turn's second call is made and recorded.
            async with httpx.AsyncClient(base_url=url, timeout=10, headers=auth) as http:
                [session] = (await http.get("/v1/sessions")).json()["items"]
                [gate] = [b for b in (await content_of(sqlite_db, response))["blocks"] if b["type"] == "ask"]
                answered = await http.post(
                    f"/v1/sessions/{session['id']}/gates/{gate['id'].removeprefix('gate/')}",
                    json={"answer": "approve"},
                )
                assert answered.status_code in (200, 202), answered.text

                async def turn_done() -> bool:
                    return any(r.kind == "turn_done" for r in await rig.journal.read(session["id"]))

                await eventually(turn_done, what="the peer's turn to end")
        # The peer has restarted (a new process on the same data directory) before loop-server read the records.
        stored = (folder / MODEL_CALLS_FILE).read_bytes()
        assert (folder / MODEL_CALLS_FILE).stat().st_mode & 0o777 == 0o600
        assert b"[REDACTED]" in stored
        for secret in (API_KEY, BEARER, TOKEN):
            assert secret.encode() not in stored  # redacted before it was kept
        async with _peer(folder, model_url) as (url, _rig_again):
            adapter = RemoteHarnessAdapter(url, TOKEN, timeout=30, prompts=prompts)
            await clock.advance(31)  # the first engine's lease expires
            async with make_engine(sqlite_db, {"remote": adapter}, clock=clock, replica_id="second") as second:
                done = await until_done(second, call_id, timeout=30)
            await adapter.aclose()
    assert done.phase == "succeeded", done.error

    ledger = SqlLedgerStore(sqlite_db)
    lane = (await ledger.find_lanes(Scope(harness_call_id=call_id)))[0]
    events = await ledger.load_lane(lane.id)
    requested = [e for e in events if e.event_type == "attempt.requested" and "request" in e.payload]
    completed = [e for e in events if e.event_type == "attempt.completed" and "reply" in e.payload]
    assert (len(requested), len(completed)) == (2, 2)  # both calls, the one made before the restart included
    last = await resolve_request(ledger, requested[-1].payload["request"]["sha256"])
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "tool"]
    assert "[REDACTED]" in last["messages"][-1]["content"] and API_KEY not in json.dumps(last)
    reply = json.loads((await ledger.get_artifact(completed[-1].payload["reply"]["sha256"])).body)
    assert reply["text"].startswith("The file holds")
