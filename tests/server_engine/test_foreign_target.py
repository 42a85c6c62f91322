"""A foreign loop as a harness target (issue 17.5): the standard rig with a foreign main loop, as `loopd up` builds a
``kind: foreign`` target, behind the built-in adapter. The CLI (the scripted fake claude) asks permission for its
tool: that gate is an ask block only the asker answers; its tool use and its reported usage and cost land in the
ledger like a built-in turn's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness.core import codec
from loopd.harness.core.events import ForeignSessionBound
from loopd.harness.foreign import standard_engine
from loopd.harness.standard import HarnessSettings, open_standard_rig
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, GateForbidden, HarnessEngine
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
)

FAKES = Path(__file__).resolve().parents[1] / "harness_foreign"


def _settings(tmp_path: Path) -> HarnessSettings:
    workspace = tmp_path / "workspace"
    command = (sys.executable, str(FAKES / "fake_claude.py"))
    return HarnessSettings(
        workspace=workspace,
        data_dir=tmp_path / "harness-claude",
        foreign=standard_engine("claude", command, workspace),
    )


async def _start(db: Database, engine: HarnessEngine, text: str, timeout: float = 60) -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation, task_id="task-f")
    request = CallRequest(
        "task-uid-f", "respond", "claude", text, message_id=response, asker="user:alice", timeout=timeout
    )
    return (await engine.start(request)).id, response


async def test_the_clis_permission_request_is_a_gate_only_the_asker_answers(
    sqlite_db: Database, tmp_path: Path
) -> None:
    async with (
        open_standard_rig(_settings(tmp_path)) as rig,
        make_engine(sqlite_db, {"claude": BuiltinHarnessAdapter(rig)}) as engine,
    ):
        call_id, response = await _start(sqlite_db, engine, "use a tool please")
        await until_phase(engine, call_id, "waiting_input", timeout=30)
        content = await content_of(sqlite_db, response)
        (gate,) = [b for b in content["blocks"] if b["type"] == "ask"]
        assert gate["status"] == "pending" and "Bash" in gate["prompt"]
        gate_id = gate["id"].removeprefix("gate/")
        with pytest.raises(GateForbidden):  # another user of the server: refused, the CLI still waits
            await engine.answer_gate(call_id, gate_id, "approve", "user:mallory")
        assert (
            next(b for b in (await content_of(sqlite_db, response))["blocks"] if b["type"] == "ask")["status"]
            == "pending"
        )
        await engine.answer_gate(call_id, gate_id, "approve", "user:alice")
        call = await until_done(engine, call_id, timeout=30)
    assert call.phase == "succeeded", call.error
    assert call.result == {"format": "text", "content": "Bash said a.txt"}
    content = await content_of(sqlite_db, response)
    tool = block(content, "tool/toolu_1")
    assert tool is not None and (tool["name"], tool["status"], tool["output"]) == ("Bash", "completed", "a.txt")

    # The ledger: the CLI's turn is the call's model attempt (its reported tokens and cost), its tool an action.
    store = SqlLedgerStore(sqlite_db)
    usage = await store.usage(Scope(harness_call_id=call_id))
    assert (usage.input_tokens, usage.output_tokens) == (12, 5)
    assert usage.cost_usd == pytest.approx(0.0042)
    assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []
    trail = await engine.trail(call_id)
    kinds = [e.event_type for e in trail.events]
    assert "turn.loopd.gate_opened" in kinds and "turn.loopd.gate_resolved" in kinds
    (tool_attempt,) = [e for e in trail.events if e.payload.get("input") == {"command": "ls"}]
    ended = [e for e in trail.events if e.subject_id == tool_attempt.subject_id and e.event_type != "attempt.requested"]
    assert [(e.event_type, e.payload) for e in ended] == [("attempt.completed", {"status": "completed"})]


async def test_a_denied_permission_reaches_the_cli_and_the_tool_fails(sqlite_db: Database, tmp_path: Path) -> None:
    async with (
        open_standard_rig(_settings(tmp_path)) as rig,
        make_engine(sqlite_db, {"claude": BuiltinHarnessAdapter(rig)}) as engine,
    ):
        call_id, response = await _start(sqlite_db, engine, "use a tool please")
        await until_phase(engine, call_id, "waiting_input", timeout=30)
        (gate,) = [b for b in (await content_of(sqlite_db, response))["blocks"] if b["type"] == "ask"]
        await engine.answer_gate(call_id, gate["id"].removeprefix("gate/"), "deny", "user:alice")
        call = await until_done(engine, call_id, timeout=30)
    assert call.phase == "succeeded" and "Bash was denied" in str(call.result)
    tool = block(await content_of(sqlite_db, response), "tool/toolu_1")
    assert tool is not None and tool["status"] == "failed"


async def test_loopd_up_opens_a_foreign_target_without_forks_or_call_workspaces(tmp_path: Path) -> None:
    from contextlib import AsyncExitStack

    from loopd._infra.clock import SystemClock
    from loopd._infra.metrics import Metrics
    from loopd.server._composition import UpSettings, WorkspaceLocationError, _open_foreign
    from loopd.server.config import ForeignHarness

    data = tmp_path / "data"
    target = ForeignHarness(key="claude", engine="claude", command=(sys.executable, str(FAKES / "fake_claude.py")))
    async with AsyncExitStack() as stack:
        settings = UpSettings(data_dir=data)
        adapter = await _open_foreign(stack, target, settings, data, tmp_path, SystemClock(), Metrics())
        assert adapter.supports_forks is False and adapter.supports_workspaces is False
        assert (data / "harness-claude" / "journal.db").exists() and (tmp_path / "claude").is_dir()
        inside = ForeignHarness(key="x", engine="codex", workspace=data / "ws")
        with pytest.raises(WorkspaceLocationError):  # the data directory holds the credentials
            await _open_foreign(stack, inside, settings, data, tmp_path, SystemClock(), Metrics())


async def test_a_call_whose_engine_crashed_at_the_gate_is_resumed_and_asks_again(
    tmp_path: Path, clock: VirtualClock
) -> None:
    async with (
        open_standard_rig(_settings(tmp_path)) as rig,
        open_database(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock)) as db,
    ):
        adapter = BuiltinHarnessAdapter(rig)
        first = make_engine(db, {"claude": adapter}, clock=clock, replica_id="first")
        await first.open()
        call_id, response = await _start(db, first, "use a tool please", timeout=3600)  # virtual time runs fast
        await until_phase(first, call_id, "waiting_input", timeout=30)
        old_gate = next(b["id"] for b in (await content_of(db, response))["blocks"] if b["type"] == "ask")
        await first.abort()  # a crash while the CLI waits at the gate
        await clock.advance(31)  # the crashed engine's lease expires
        async with make_engine(db, {"claude": adapter}, clock=clock, replica_id="second") as second:

            async def asked_again() -> bool:  # the old gate was denied by the restore; the re-run asks anew
                blocks = (await content_of(db, response))["blocks"]
                return any(b["type"] == "ask" and b["status"] == "pending" and b["id"] != old_gate for b in blocks)

            await until(asked_again, timeout=30)
            blocks = (await content_of(db, response))["blocks"]
            gate = next(b for b in blocks if b["type"] == "ask" and b["status"] == "pending" and b["id"] != old_gate)
            await second.answer_gate(call_id, gate["id"].removeprefix("gate/"), "approve", "user:alice")
            call = await until_done(second, call_id, timeout=30)
        assert call.phase == "succeeded", call.error
        assert call.result == {"format": "text", "content": "Bash said a.txt"}
        records = await rig.journal.read(call_id, 1)
        events = [codec.decode(r.kind, r.version, r.data) for r in records]
        bound = {e.foreign_session_id for e in events if isinstance(e, ForeignSessionBound)}
        assert len(bound) == 1  # the re-run turn resumed the same foreign session
