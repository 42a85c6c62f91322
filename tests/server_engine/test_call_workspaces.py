"""Harness calls with their own workspace and tools profile: the built-in harness (the demo model, taught by a demo
rule to call tools) works in ``<root>/<location>``, with only the profile's tools, under the unattended gate policy
(file tools allowed, bash allowed only in a confining sandbox, else it asks); location and profile are part of the
call's identity; malformed locations, escapes and targets that cannot take them are refused."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loopd.harness.actors import Rig
from loopd.harness.models import TOOL_RESULTS_HEADER, ModelConfig
from loopd.harness.standard import (
    READ_TOOLS,
    WRITE_TOOLS,
    HarnessSettings,
    WorkspaceRigs,
    open_standard_rig,
    workspace_rigs,
)
from loopd.harness.tools import UNCONFINED, Sandbox
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, HarnessEngine
from loopd.server.storage import Conflict, Database, InvalidRecord
from tests.harness_tools.sandboxes import bubblewrap

from .conftest import ScriptedAdapter, content_of, make_engine, new_conversation, until_done, until_phase

LOCATION = "operator/longhorizon/run-1"


def _rule(text: str) -> str | Mapping[str, Any] | None:
    """The demo model's script for these tests: one tool per request, then an answer quoting its result."""
    asks = {
        "write hello": ("write_file", {"path": "hello.txt", "content": "hello world\n"}),
        "read hello": ("read_file", {"path": "hello.txt"}),
        "run cat": ("bash", {"command": "cat hello.txt; cat ../../../assistant/secret.txt"}),
    }
    for prefix, (tool, arguments) in asks.items():
        if text.startswith(prefix):
            if TOOL_RESULTS_HEADER in text:
                return "result: " + text.split(TOOL_RESULTS_HEADER + "\n", 1)[1]
            return {"tool": tool, "arguments": arguments}
    return None


@dataclass
class Rigs:
    base: Rig
    workspaces: WorkspaceRigs
    root: Path


@asynccontextmanager
async def _rigs(folder: Path, sandbox: Sandbox) -> AsyncIterator[Rigs]:
    settings = HarnessSettings(
        workspace=folder / "workspaces" / "assistant",
        data_dir=folder / "harness",
        model=ModelConfig(),  # the demo model, with the rule above
        sandbox=sandbox,
        demo_rules=(_rule,),
    )
    async with open_standard_rig(settings) as rig:
        yield Rigs(rig, workspace_rigs(rig, settings, folder / "workspaces"), folder / "workspaces")


@asynccontextmanager
async def _engine(db: Database, rigs: Rigs) -> AsyncIterator[HarnessEngine]:
    adapters: dict[str, Any] = {
        "assistant": BuiltinHarnessAdapter(rigs.base, workspaces=rigs.workspaces),
        "plain": BuiltinHarnessAdapter(rigs.base),
        "scripted": ScriptedAdapter(),
    }
    async with make_engine(db, adapters) as engine:
        yield engine


async def _call(
    db: Database, engine: HarnessEngine, text: str, *, key: str = "work", **options: Any
) -> tuple[str, str]:
    conversation = await new_conversation(db)
    call = await engine.start(
        CallRequest(
            owner_uid="run-uid-1",
            effect_key=key,
            target="assistant",
            text=text,
            conversation_id=conversation,
            asker="user:alice",
            timeout=120,
            **options,
        )
    )
    assert call.message_id is not None
    return call.id, call.message_id


def _tools(content: dict[str, Any]) -> list[tuple[str, str]]:
    return [(b["name"], b["status"]) for b in content["blocks"] if b["type"] == "tool"]


async def test_a_write_call_writes_in_its_own_workspace_without_a_gate(sqlite_db: Database, tmp_path: Path) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        call_id, message = await _call(sqlite_db, engine, "write hello", workspace=LOCATION, tools="write")
        call = await until_done(engine, call_id, timeout=20)

    assert call.phase == "succeeded", call.error
    assert (rigs.root / LOCATION / "hello.txt").read_text() == "hello world\n"
    assert not (rigs.root / "assistant" / "hello.txt").exists()
    content = await content_of(sqlite_db, message)
    assert _tools(content) == [("write_file", "completed")]
    assert not [b for b in content["blocks"] if b["type"] == "ask"]  # no permission prompt
    assert call.params["workspace"] == LOCATION and call.params["tools"] == "write"


async def test_a_read_call_reads_what_a_write_call_left_and_is_offered_no_write_tool(
    sqlite_db: Database, tmp_path: Path
) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        written, _ = await _call(sqlite_db, engine, "write hello", key="executor", workspace=LOCATION, tools="write")
        assert (await until_done(engine, written, timeout=20)).phase == "succeeded"
        read, message = await _call(sqlite_db, engine, "read hello", key="auditor", workspace=LOCATION)
        call = await until_done(engine, read, timeout=20)
        denied, denied_message = await _call(sqlite_db, engine, "write hello", key="sneaky", workspace=LOCATION)
        refused = await until_done(engine, denied, timeout=20)

    assert call.phase == "succeeded", call.error
    assert call.params["tools"] == "read"  # a workspace without tools: read
    assert call.result["content"] == "result: [read_file] hello world"
    assert _tools(await content_of(sqlite_db, message)) == [("read_file", "completed")]
    # The read profile offers no write tool: the demo model says so instead of calling one.
    assert refused.phase == "succeeded" and "offers no such tool" in refused.result["content"]
    assert _tools(await content_of(sqlite_db, denied_message)) == []


def test_each_profile_offers_exactly_its_tools_with_its_gate_policy(tmp_path: Path) -> None:
    from loopd.harness.actors import LoopDefinition
    from loopd.harness.gate import Access
    from loopd.harness.models import ScriptedModel
    from loopd.harness.tools import EXEC, FS_READ, FS_WRITE

    base = Rig(
        loops=[LoopDefinition(name="main", model=ScriptedModel([]))],
        journal=object(),  # type: ignore[arg-type]  # never used: no session is started
        workspace=tmp_path / "assistant",
    )

    def rigs(sandbox: Sandbox) -> WorkspaceRigs:
        return WorkspaceRigs(base=base, root=tmp_path, sandbox=sandbox, hidden=())

    class Confining:  # stands for bubblewrap in this pure check of the policy (the name is what counts)
        name = "bubblewrap"

    unconfined = rigs(UNCONFINED)
    confined = rigs(Confining())  # type: ignore[arg-type]
    names = {
        profile: tuple(t.spec.name for t in unconfined.rig("a", profile).loops[0].tools)
        for profile in ("none", "read", "write")
    }
    assert {profile: sorted(found) for profile, found in names.items()} == {
        "none": [],
        "read": sorted(READ_TOOLS),
        "write": sorted(WRITE_TOOLS),
    }
    assert unconfined.rig(None, "none").loops[0].tools == ()
    assert unconfined.rig("a", "read").loops[0].access.kinds == {FS_READ: Access.ALLOW}
    assert unconfined.rig("a", "write").loops[0].access.kinds == {FS_READ: Access.ALLOW, FS_WRITE: Access.ALLOW}
    assert confined.rig("a", "write").loops[0].access.kinds == {
        FS_READ: Access.ALLOW,
        FS_WRITE: Access.ALLOW,
        EXEC: Access.ALLOW,
    }
    rig = unconfined.rig("a", "write")
    assert rig.agents == () and rig.workspace == (tmp_path / "a").resolve()


async def test_without_a_confining_sandbox_bash_asks_the_asker(sqlite_db: Database, tmp_path: Path) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        call_id, message = await _call(sqlite_db, engine, "run cat", workspace=LOCATION, tools="write")
        await until_phase(engine, call_id, "waiting_input", timeout=20)
        content = await content_of(sqlite_db, message)
        gate = next(b for b in content["blocks"] if b["type"] == "ask")
        assert "cat hello.txt" in gate["prompt"]
        await engine.answer_gate(call_id, gate["id"].removeprefix("gate/"), "deny", "user:alice")
        call = await until_done(engine, call_id, timeout=20)
    assert call.phase == "succeeded"
    assert _tools(await content_of(sqlite_db, message)) == [("bash", "failed")]


async def test_in_bubblewrap_bash_runs_unasked_and_sees_only_its_workspace(sqlite_db: Database, tmp_path: Path) -> None:
    sandbox = bubblewrap()
    async with _rigs(tmp_path, sandbox) as rigs, _engine(sqlite_db, rigs) as engine:
        workspace = rigs.root / LOCATION
        workspace.mkdir(parents=True)
        (workspace / "hello.txt").write_text("hello world\n")
        (rigs.root / "assistant" / "secret.txt").write_text("not yours\n")
        call_id, message = await _call(sqlite_db, engine, "run cat", workspace=LOCATION, tools="write")
        call = await until_done(engine, call_id, timeout=30)

    assert call.phase == "succeeded", call.error
    output = call.result["content"]
    assert "hello world" in output
    assert "not yours" not in output  # the assistant's workspace, beside this one, is not in the sandbox
    content = await content_of(sqlite_db, message)
    assert _tools(content) == [("bash", "failed")]  # ran (unasked); the second cat found nothing: exit status 1
    assert "No such file" in output
    assert not [b for b in content["blocks"] if b["type"] == "ask"]


async def test_workspace_and_tools_are_part_of_the_calls_identity(sqlite_db: Database, tmp_path: Path) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        conversation = await new_conversation(sqlite_db)

        def request(**options: Any) -> CallRequest:
            return CallRequest(
                owner_uid="run-uid-2",
                effect_key="round/1/executor",
                target="assistant",
                text="write hello",
                conversation_id=conversation,
                timeout=120,
                **options,
            )

        first = await engine.start(request(workspace=LOCATION, tools="write"))
        again = await engine.start(request(workspace=LOCATION, tools="write"))
        assert again.id == first.id
        with pytest.raises(Conflict):
            await engine.start(request(workspace=LOCATION, tools="read"))
        with pytest.raises(Conflict):
            await engine.start(request(workspace="operator/longhorizon/run-2", tools="write"))
        with pytest.raises(Conflict):
            await engine.start(request())
        await until_done(engine, first.id, timeout=20)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workspace": "../escape", "tools": "write"}, "no '..'"),
        ({"workspace": "a/../../b", "tools": "write"}, "no '..'"),
        ({"workspace": "/etc", "tools": "read"}, "no absolute path"),
        ({"workspace": "a//b"}, "no '..'"),
        ({"workspace": "x" * 600}, "at most 512 characters"),
        ({"tools": "write"}, "need a workspace"),
        ({"tools": "read"}, "need a workspace"),
        ({"workspace": "a", "tools": "admin"}, "tools must be one of"),
    ],
)
async def test_malformed_workspaces_and_profiles_are_refused(
    sqlite_db: Database, tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        conversation = await new_conversation(sqlite_db)
        with pytest.raises(InvalidRecord, match=message):
            await engine.start(
                CallRequest(
                    owner_uid="o",
                    effect_key="k",
                    target="assistant",
                    text="hi",
                    conversation_id=conversation,
                    **options,
                )
            )
    assert sorted(p.name for p in rigs.root.iterdir()) == ["assistant"]  # nothing created


async def test_a_profile_without_a_workspace_may_only_be_none(sqlite_db: Database, tmp_path: Path) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        call_id, message = await _call(sqlite_db, engine, "read hello", tools="none")
        call = await until_done(engine, call_id, timeout=20)
    assert call.phase == "succeeded" and "offers no such tool" in call.result["content"]
    assert _tools(await content_of(sqlite_db, message)) == []


@pytest.mark.parametrize("target", ["plain", "scripted"])
async def test_a_target_that_takes_no_workspace_refuses_one(sqlite_db: Database, tmp_path: Path, target: str) -> None:
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        conversation = await new_conversation(sqlite_db)
        with pytest.raises(InvalidRecord, match="takes no workspace"):
            await engine.start(
                CallRequest(
                    owner_uid="o",
                    effect_key="k",
                    target=target,
                    text="hi",
                    conversation_id=conversation,
                    workspace=LOCATION,
                )
            )


async def test_a_workspace_that_a_symlink_points_elsewhere_fails_the_call(sqlite_db: Database, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        (rigs.root / "operator" / "longhorizon").mkdir(parents=True)
        os.symlink(outside, rigs.root / LOCATION)
        call_id, _ = await _call(sqlite_db, engine, "write hello", workspace=LOCATION, tools="write")
        call = await until_done(engine, call_id, timeout=20)
    assert call.phase == "failed"
    assert call.error is not None and "resolves outside" in call.error["message"]
    assert list(outside.iterdir()) == []


async def test_over_http_a_workspace_is_the_callers_own_and_bad_ones_are_400(
    sqlite_db: Database, tmp_path: Path
) -> None:
    import httpx
    from fastapi import FastAPI

    from loopd.server.engine import engine_router
    from loopd.server.http import ServerSecurity, open_http_server
    from loopd.server.http._errors import install_error_handlers
    from loopd.server.http._security import SecurityMiddleware

    token = "workspace-test-token"
    auth = {"Authorization": f"Bearer {token}"}
    async with _rigs(tmp_path, UNCONFINED) as rigs, _engine(sqlite_db, rigs) as engine:
        app = FastAPI()
        install_error_handlers(app)
        app.include_router(engine_router(engine))
        app.add_middleware(SecurityMiddleware, security=ServerSecurity(tokens=(token,)))
        conversation = await new_conversation(sqlite_db)
        body = {
            "owner_uid": "uid-h",
            "effect_key": "executor",
            "target": "assistant",
            "text": "write hello",
            "conversation_id": conversation,
            "workspace": "runs/1",
            "tools": "write",
        }
        async with open_http_server(app) as server, httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
            started = await client.post("/v1/harness/calls", json=body, headers=auth)
            assert started.status_code == 202, started.text
            call = started.json()
            assert call["tools"] == "write"
            scope, _, rest = call["workspace"].partition("/")
            assert scope == "user" and rest.endswith("/runs/1")  # the admin's own: user/<admin key>/runs/1
            changed = await client.post("/v1/harness/calls", json={**body, "tools": "read"}, headers=auth)
            assert changed.status_code == 409 and changed.json()["error"]["type"] == "conflict"
            for workspace in ("../../operator/longhorizon/x", "runs/../../x", "/tmp/x"):
                refused = await client.post(
                    "/v1/harness/calls", json={**body, "effect_key": "other", "workspace": workspace}, headers=auth
                )
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["type"] == "invalid_request"
            bad_profile = await client.post("/v1/harness/calls", json={**body, "tools": "root"}, headers=auth)
            assert bad_profile.status_code == 400
            done = await until_done(engine, call["id"], timeout=20)
            state = (await client.get(f"/v1/harness/calls/{call['id']}", headers=auth)).json()
    assert done.phase == "succeeded", done.error
    assert state["workspace"] == call["workspace"]
    assert (rigs.root / call["workspace"] / "hello.txt").read_text() == "hello world\n"
    assert not (rigs.root / "operator").exists() and not (tmp_path / "x").exists()


@dataclass
class _WriteThenAnswer:
    """Step 1 writes notes.txt with write_file; step 2 answers, the first time after a long stall (a crash window)."""

    final_calls: int = 0

    def __call__(self, request: Any) -> Any:
        from loopd.harness import Reply, ToolCall

        if not any(message.role == "tool" for message in request.messages):
            return Reply(
                tool_calls=[ToolCall(id="w1", name="write_file", arguments={"path": "notes.txt", "content": "x"})]
            )
        self.final_calls += 1
        return Reply(text="written", delay=60.0 if self.final_calls == 1 else 0.0)


async def test_a_crashed_engine_resumes_a_workspace_call_in_the_same_workspace_without_rerunning_its_tool(
    tmp_path: Path, clock: Any
) -> None:
    from loopd.harness import LoopDefinition, ScriptedModel, SqliteJournal
    from loopd.harness.gate import MemoryRuleStore
    from loopd.server.storage import DatabaseOptions, open_database

    from .conftest import until, until_true

    script = _WriteThenAnswer()
    journal = await SqliteJournal.open(tmp_path / "journal.db")
    base = Rig(
        loops=[LoopDefinition(name="main", model=ScriptedModel(script, model_name="scripted"))],
        journal=journal,
        rules=MemoryRuleStore(),
        workspace=tmp_path / "workspaces" / "assistant",
    )
    rigs = WorkspaceRigs(base=base, root=tmp_path / "workspaces", sandbox=UNCONFINED, hidden=())
    adapter = BuiltinHarnessAdapter(base, workspaces=rigs)
    try:
        async with open_database(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock)) as db:
            first = make_engine(db, {"assistant": adapter}, clock=clock, replica_id="first")
            await first.open()
            call_id, message = await _call(db, first, "write notes", workspace=LOCATION, tools="write")
            await until_true(lambda: script.final_calls == 1)  # the tool ran; the answer's model call hangs
            await first.abort()  # a crash: the drive dropped, its lease left to expire
            notes = tmp_path / "workspaces" / LOCATION / "notes.txt"
            assert notes.read_text() == "x"
            notes.write_text("changed after the tool ran")  # a re-run of the tool would overwrite this

            await clock.advance(31)
            async with make_engine(db, {"assistant": adapter}, clock=clock, replica_id="second") as second:
                call = await until_done(second, call_id, timeout=20)

                async def settled() -> bool:
                    return _tools(await content_of(db, message)) == [("write_file", "completed")]

                await until(settled)
            assert call.phase == "succeeded", call.error
            assert call.result["content"] == "written"
            assert script.final_calls == 2  # the model call in flight was re-issued, in the same session
            assert notes.read_text() == "changed after the tool ran"  # the tool was not run again
            assert [info.session_id for info in await base.sessions()] == [call_id]
    finally:
        await journal.aclose()
