"""Real harness rigs for the engine tests: a scripted model, a tool that needs permission, a SQLite journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loopd.harness import (
    LoopDefinition,
    ModelRequest,
    Reply,
    Rig,
    ScriptedModel,
    SqliteJournal,
    ToolCall,
)
from loopd.harness.gate import MemoryRuleStore
from loopd.harness.tools._testing import TouchTool

FIRST_TEXT = "Let me write it."
FINAL_TEXT = "Wrote a.txt."


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
