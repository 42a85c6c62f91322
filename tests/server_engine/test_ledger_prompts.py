"""Full prompts and replies in the ledger: a built-in harness on the real OpenAI-compatible adapter against the
scripted server; each model attempt (a 429 retried, then the reply) is its own ledger attempt with its request and
reply as content-addressed artifacts; a growing conversation stores only its new messages; a secret in a tool's
output never reaches the ledger's tables."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from loopd.harness import LoopDefinition, Rig, SqliteJournal, ToolCall, Usage
from loopd.harness.core import EffectKind, Idempotency, user_message
from loopd.harness.gate import MemoryRuleStore
from loopd.harness.models import (
    FailWithStatus,
    ModelAttemptRecord,
    ModelCallRecord,
    ModelRequest,
    OpenAICompatibleModel,
    ServerReply,
    ServerToolCall,
    ToolSpec,
    open_scripted_server,
)
from loopd.harness.tools._protocol import PreparedCall, ToolContext, ToolResult
from loopd.server.audit._routes import resolve_request
from loopd.server.engine import (
    BuiltinHarnessAdapter,
    CallRequest,
    OpenAIModelAdapter,
    PromptRecording,
    recording_rig,
)
from loopd.server.ledger import MESSAGES_TYPE, TOOLS_TYPE, Event, Redactor, Scope, SqlLedgerStore
from loopd.server.storage import Database

from .conftest import make_engine, new_conversation, new_response, until_done

API_KEY = "sk-proj-ledgertestkey0123456789abcdef"
CONFIGURED = "ACME-77881234"
BEARER = "eyJhbGciOiJIUzI1NiJ9.cGF5bG9hZA.c2lnbmF0dXJl"
SECRET_OUTPUT = (
    f"deploy.env:\nOPENAI_API_KEY={API_KEY}\nlicense {CONFIGURED}\n"
    f"curl -H 'Authorization: Bearer {BEARER}' https://internal"
)


class LeakyTool:
    """Reads a file full of secrets (its output holds them); needs no permission."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name="read_env", description="Read deploy.env.", parameters={"type": "object"})

    @property
    def effect(self) -> EffectKind:
        return EffectKind.READ

    @property
    def idempotency(self) -> Idempotency:
        return Idempotency.INHERENT

    def prepare(self, call: ToolCall) -> PreparedCall:
        return PreparedCall(call_id=call.id, tool="read_env", arguments=dict(call.arguments))

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        return ToolResult(output=SECRET_OUTPUT)


async def _no_sleep(_seconds: float) -> None:
    return None


@asynccontextmanager
async def _rig(folder: Path, url: str) -> AsyncIterator[Rig]:
    folder.mkdir(parents=True, exist_ok=True)
    model = OpenAICompatibleModel("gpt-test", base_url=url, api_key=API_KEY, max_retries=2, timeout=30, sleep=_no_sleep)
    journal = await SqliteJournal.open(folder / "journal.db")
    try:
        rig = Rig(
            loops=[LoopDefinition(name="main", model=model, tools=(LeakyTool(),), system_prompt="Be brief.")],
            journal=journal,
            rules=MemoryRuleStore(),
            name="ledger-rig",
        )
        yield recording_rig(rig)
    finally:
        await journal.aclose()
        await model.aclose()


SCRIPT = [
    ServerReply(fault=FailWithStatus(status=429, message="slow down", retry_after=0)),
    ServerReply(text="Reading it.", tool_calls=(ServerToolCall(name="read_env", id="c1"),)),
    ServerReply(text="Once more.", tool_calls=(ServerToolCall(name="read_env", id="c2"),)),
    ServerReply(text="The file holds an API key; I will not repeat it.", finish_reason="stop"),
]


async def _run(db: Database, tmp_path: Path, clock: Any) -> tuple[str, SqlLedgerStore]:
    prompts = PromptRecording(clock, Redactor([r"ACME-[0-9]{8}"], literals=[API_KEY]))
    async with open_scripted_server(list(SCRIPT)) as url, _rig(tmp_path / "harness", url) as rig:
        adapter = BuiltinHarnessAdapter(rig, prompts=prompts)
        async with make_engine(db, {"builtin": adapter}, clock=clock, redactor=prompts.redactor) as engine:
            conversation = await new_conversation(db)
            response = await new_response(db, conversation, task_id="task-ledger")
            call = await engine.start(
                CallRequest(
                    "uid-l", "respond", "builtin", "what is in deploy.env?", message_id=response, asker="user:alice"
                )
            )
            done = await until_done(engine, call.id, timeout=30)
            assert done.phase == "succeeded", done.error
    return call.id, SqlLedgerStore(db)


def _of(events: list[Event], kind: str) -> list[Event]:
    return [event for event in events if event.event_type == kind]


async def test_every_model_attempt_stores_its_request_and_reply(db: Database, tmp_path: Path, clock: Any) -> None:
    call_id, ledger = await _run(db, tmp_path, clock)
    view = await ledger.load_run((await ledger.find_lanes(Scope(harness_call_id=call_id)))[0].session_id, call_id)
    requested = [e for e in _of(view.events, "attempt.requested") if "request" in e.payload]
    assert len(requested) == 4  # the 429, then three model calls
    failed = [e for e in _of(view.events, "attempt.failed") if "duration_ms" in e.payload]
    assert len(failed) == 1 and failed[0].payload["error"]["status_code"] == 429
    assert failed[0].payload["error"]["code"] == "ModelRetryableError"
    completed = [e for e in _of(view.events, "attempt.completed") if "reply" in e.payload]
    assert len(completed) == 3
    assert all(e.payload["finish_reason"] in ("tool_calls", "stop") for e in completed)
    assert all(e.payload.get("provider_request_id") for e in completed)
    assert all(e.payload["usage"]["input_tokens"] > 0 for e in completed)  # the roll-ups still count them

    # The retried attempt and its successor belong to one model_call action, numbered 1 and 2.
    structure = await ledger.structure(Scope(harness_call_id=call_id))
    by_id = {attempt.id: attempt for attempt in structure.attempts}
    first_failed, first_ok = by_id[failed[0].subject_id], by_id[requested[1].subject_id]
    assert first_failed.action_id == first_ok.action_id
    assert (first_failed.attempt_no, first_ok.attempt_no) == (1, 2)
    assert requested[0].payload["request"] == requested[1].payload["request"]  # the same request, stored once

    # The last request resolves to the whole conversation, the tool results redacted.
    last = await resolve_request(ledger, requested[-1].payload["request"]["sha256"])
    assert last["model"] == "gpt-test" and last["system"] == "Be brief."
    assert [tool["name"] for tool in last["tools"]] == ["read_env"]
    roles = [message["role"] for message in last["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]
    assert "[REDACTED]" in last["messages"][2]["content"]
    reply = json.loads((await ledger.get_artifact(completed[-1].payload["reply"]["sha256"])).body)
    assert reply["text"].startswith("The file holds") and reply["finish_reason"] == "stop"

    # A growing conversation stores only its new messages: the last segment holds the two newest, chained.
    manifest = json.loads((await ledger.get_artifact(requested[-1].payload["request"]["sha256"])).body)
    head = json.loads((await ledger.get_artifact(manifest["messages"]["head"])).body)
    assert len(head["messages"]) == 2 and head["parent"] is not None
    rows = await _rows(db, "SELECT content_type, size FROM ledger_artifacts")
    segments = [row for row in rows if row[0] == MESSAGES_TYPE]
    assert len(segments) == 3  # 1 + 2 + 2 messages, not 1 + 3 + 5


async def _rows(db: Database, sql: str) -> list[tuple[Any, ...]]:
    async with db.transaction(read_only=True) as tx:
        return await tx.fetch(sql)


async def test_a_secret_in_a_tool_output_never_reaches_the_ledger(
    sqlite_db: Database, tmp_path: Path, clock: Any
) -> None:
    db = sqlite_db
    await _run(db, tmp_path, clock)
    stored: list[str] = []
    for table in (
        "ledger_artifacts",
        "ledger_events",
        "ledger_lanes",
        "ledger_actions",
        "ledger_attempts",
        "ledger_appends",
    ):
        stored.extend(repr(row) for row in await _rows(db, f"SELECT * FROM {table}"))
    everything = "\n".join(stored)
    assert "read_env" in everything and "[REDACTED]" in everything  # the trail is there, redacted
    for secret in (API_KEY, CONFIGURED, BEARER, "ledgertestkey"):
        assert secret not in everything


async def test_a_plain_model_target_records_its_completion(sqlite_db: Database, clock: Any) -> None:
    prompts = PromptRecording(clock, Redactor(literals=[API_KEY]))
    script = [ServerReply(text=f"your key is {API_KEY}", finish_reason="stop")]
    async with open_scripted_server(script) as url:
        model = OpenAICompatibleModel("gpt-test", base_url=url, api_key=API_KEY, max_retries=0, timeout=30)
        adapter = OpenAIModelAdapter(model, system_prompt="Be brief.", owned=model, prompts=prompts)
        async with make_engine(sqlite_db, {"gpt": adapter}, clock=clock) as engine:
            conversation = await new_conversation(sqlite_db)
            response = await new_response(sqlite_db, conversation)
            call = await engine.start(
                CallRequest("uid-m", "respond", "gpt", "say hi", message_id=response, asker="user:alice")
            )
            assert (await until_done(engine, call.id, timeout=20)).phase == "succeeded"
        await adapter.aclose()
    ledger = SqlLedgerStore(sqlite_db)
    lane = (await ledger.find_lanes(Scope(harness_call_id=call.id)))[0]
    events = await ledger.load_lane(lane.id)
    [done] = [e for e in events if e.event_type == "attempt.completed" and "reply" in e.payload]
    reply = json.loads((await ledger.get_artifact(done.payload["reply"]["sha256"])).body)
    assert reply["text"] == "your key is [REDACTED]" and reply["provider"] == "openai"
    [asked] = [e for e in events if e.event_type == "attempt.requested" and "request" in e.payload]
    request = await resolve_request(ledger, asked.payload["request"]["sha256"])
    assert request["system"] == "Be brief." and request["messages"][-1]["content"].endswith("say hi")


async def test_a_model_call_that_fails_for_good_keeps_its_attempts(
    sqlite_db: Database, tmp_path: Path, clock: Any
) -> None:
    prompts = PromptRecording(clock, Redactor())
    script = [ServerReply(fault=FailWithStatus(status=429, message="slow down", retry_after=0))] * 3
    async with open_scripted_server(script) as url, _rig(tmp_path / "harness", url) as rig:
        adapter = BuiltinHarnessAdapter(rig, prompts=prompts)
        async with make_engine(sqlite_db, {"builtin": adapter}, clock=clock) as engine:
            conversation = await new_conversation(sqlite_db)
            response = await new_response(sqlite_db, conversation)
            call = await engine.start(
                CallRequest("uid-f", "respond", "builtin", "hi", message_id=response, asker="user:alice")
            )
            assert (await until_done(engine, call.id, timeout=30)).phase == "failed"
    ledger = SqlLedgerStore(sqlite_db)
    structure = await ledger.structure(Scope(harness_call_id=call.id))
    [model_call] = [action for action in structure.actions if action.type == "model_call"]
    attempts = sorted((a for a in structure.attempts if a.action_id == model_call.id), key=lambda a: a.attempt_no or 0)
    assert [a.attempt_no for a in attempts] == [1, 2, 3]  # max_retries=2: three tries, each its own attempt
    events = await ledger.load_lane((await ledger.find_lanes(Scope(harness_call_id=call.id)))[0].id)
    failed = [e for e in events if e.event_type == "attempt.failed" and e.subject_id in {a.id for a in attempts}]
    assert len(failed) == 3 and all(e.payload["error"]["status_code"] == 429 for e in failed)
    asked = [e for e in events if e.event_type == "attempt.requested" and e.subject_id == attempts[0].id]
    assert (await resolve_request(ledger, asked[0].payload["request"]["sha256"]))["messages"][-1]["content"] == "hi"


def _recorded(tools: tuple[ToolSpec, ...], question: str) -> ModelCallRecord:
    request = ModelRequest(model="m", messages=(user_message(question),), tools=tools, system="s")
    usage = Usage(input_tokens=3, output_tokens=1)
    return ModelCallRecord(request, (ModelAttemptRecord(model="m", started_at=1.0, ended_at=2.0, usage=usage),))


def _tool_set(description: str) -> tuple[ToolSpec, ...]:
    return (ToolSpec(name="lookup", description=description, parameters={"type": "object"}),)


async def test_sessions_of_one_engine_encode_the_same_tool_list_once(clock: Any) -> None:
    """Every chat's session offers the same tools: their artifact is encoded (redacted, hashed) once per engine,
    not once per session; an equal list built anew finds it, another list gets its own, redacted like any."""
    prompts = PromptRecording(clock, Redactor(literals=[API_KEY]))
    blobs = []
    for question, tools in (("a", _tool_set(f"key {API_KEY}")), ("b", _tool_set(f"key {API_KEY}"))):
        log = prompts.log()  # a new session
        log.record(_recorded(tools, question))
        taken = log.take(3, 1)
        assert taken is not None
        [tools_blob] = [b for b in taken.blobs if b.ref.content_type == TOOLS_TYPE]
        blobs.append(tools_blob)
    assert blobs[0] is blobs[1], "the second session reused the first one's encoding"
    assert API_KEY not in blobs[0].body.decode() and "[REDACTED]" in blobs[0].body.decode()
    other = prompts.log()
    other.record(_recorded(_tool_set("another tool"), "c"))
    taken = other.take(3, 1)
    assert taken is not None
    [third] = [b for b in taken.blobs if b.ref.content_type == TOOLS_TYPE]
    assert third.ref.sha256 != blobs[0].ref.sha256


def _asked(messages: tuple[Any, ...]) -> ModelCallRecord:
    request = ModelRequest(model="m", messages=messages, tools=_tool_set("t"), system="s")
    usage = Usage(input_tokens=3, output_tokens=1)
    return ModelCallRecord(request, (ModelAttemptRecord(model="m", started_at=1.0, ended_at=2.0, usage=usage),))


def _segments(taken: Any) -> list[dict[str, Any]]:
    return [json.loads(b.body) for b in taken.blobs if b.ref.content_type == MESSAGES_TYPE]


async def test_a_session_that_goes_on_from_another_stores_only_its_new_messages(clock: Any) -> None:
    """A conversation's next session (a fork at the end of the last one) sends that session's last request again —
    equal messages read back from the journal, not the same objects — then the answer and the new question: its log,
    seeded with that session's last chain, stores a segment of the new messages only, over that chain."""
    from loopd.harness.core import Message

    def assistant_message(text: str) -> Message:
        return Message(role="assistant", content=text)

    prompts = PromptRecording(clock, Redactor())
    earlier = (user_message("apples?"), assistant_message("red ones"), user_message("pears?"))
    first = prompts.log("s1")
    first.record(_asked(earlier))
    taken = first.take(3, 1)
    assert taken is not None
    (head,) = _segments(taken)
    assert head["parent"] is None and len(head["messages"]) == 3
    head_sha = next(b.ref.sha256 for b in taken.blobs if b.ref.content_type == MESSAGES_TYPE)

    copies = tuple(Message.model_validate(m.model_dump()) for m in earlier)  # as a restored session has them
    assert copies == earlier and all(a is not b for a, b in zip(copies, earlier, strict=True))
    going_on = (*copies, assistant_message("green ones"), user_message("plums?"))
    for parent, expected in (("s1", (head_sha, 2)), ("unknown", (None, 5)), (None, (None, 5))):
        log = prompts.log("s2", parent=parent)
        log.record(_asked(going_on))
        taken = log.take(3, 1)
        assert taken is not None
        (segment,) = _segments(taken)
        assert (segment["parent"], len(segment["messages"])) == expected
        assert segment["messages"][-1]["content"] == "plums?"
        assert prompts.sessions.take("s1") is None  # handed over: a conversation keeps its latest session's only
