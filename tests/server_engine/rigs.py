"""Real harness rigs for the engine tests: a scripted model, a tool that needs permission, a SQLite journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loopd.harness import (
    EffectKind,
    Idempotency,
    LoopDefinition,
    ModelRequest,
    PreparedCall,
    Reply,
    Requirement,
    Rig,
    ScriptedModel,
    SqliteJournal,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
)
from loopd.harness.gate import MemoryRuleStore
from loopd.harness.tools import GrantCandidate

FIRST_TEXT = "Let me write it."
FINAL_TEXT = "Wrote a.txt."


class TouchTool:
    """Needs an ``fs.write`` permission for its path (so every call opens a gate); records what it ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name="touch", description="touch a file", parameters={"type": "object"})

    @property
    def effect(self) -> EffectKind:
        return EffectKind.WRITE

    @property
    def idempotency(self) -> Idempotency:
        return Idempotency.INHERENT

    def prepare(self, call: ToolCall) -> PreparedCall:
        path = str(call.arguments["path"])
        requirement = Requirement(
            kind="fs.write",
            scope="/ws",
            match=path,
            description=f"write {path}",
            candidates=(GrantCandidate(kind="fs.write", pattern=path),),
        )
        return PreparedCall(call_id=call.id, tool="touch", arguments=dict(call.arguments), requirements=(requirement,))

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        self.ran.append(str(call.arguments["path"]))
        return ToolResult(output="touched")


@dataclass
class Script:
    """Step 1 asks for ``touch a.txt``; step 2 answers. The first step-2 call may hang (``stall_final``)."""

    stall_final: bool = False
    final_calls: int = 0
    requests: list[ModelRequest] = field(default_factory=list)

    def __call__(self, request: ModelRequest) -> Reply:
        self.requests.append(request)
        if not any(message.role == "tool" for message in request.messages):
            return Reply(
                text=FIRST_TEXT,
                tool_calls=[ToolCall(id="call-1", name="touch", arguments={"path": "a.txt"})],
                chunk_size=5,
            )
        self.final_calls += 1
        stall = self.stall_final and self.final_calls == 1
        return Reply(text=FINAL_TEXT, chunk_size=4, delay=60.0 if stall else 0.0)


@dataclass
class Harness:
    rig: Rig
    journal: SqliteJournal
    model: ScriptedModel
    script: Script
    tool: TouchTool


@asynccontextmanager
async def open_rig(folder: Path, *, stall_final: bool = False) -> AsyncIterator[Harness]:
    folder.mkdir(parents=True, exist_ok=True)
    script = Script(stall_final=stall_final)
    model = ScriptedModel(script, model_name="scripted-model")
    tool = TouchTool()
    journal = await SqliteJournal.open(folder / "journal.db")
    rig = Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(tool,))],
        journal=journal,
        rules=MemoryRuleStore(),
        name="test-rig",
    )
    try:
        yield Harness(rig, journal, model, script, tool)
    finally:
        await journal.aclose()
