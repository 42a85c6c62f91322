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
    """Step 1 asks for ``touch a.txt``; step 2 answers. The first step-2 call may hang (``stall_final``), or hang
    after its first chunk (``stall_final_mid``); ``chunk_delay`` paces the chunks (so they interleave with the
    engine's reads); ``final_texts`` replaces the answer of the n-th step-2 call (a model that says something else
    when its call is re-issued)."""

    stall_final: bool = False
    stall_final_mid: bool = False
    chunk_delay: float = 0.0
    final_texts: dict[int, str] = field(default_factory=dict)
    final_calls: int = 0
    requests: list[ModelRequest] = field(default_factory=list)

    def __call__(self, request: ModelRequest) -> Reply:
        self.requests.append(request)
        if not any(message.role == "tool" for message in request.messages):
            return Reply(
                text=FIRST_TEXT,
                tool_calls=[ToolCall(id="call-1", name="touch", arguments={"path": "a.txt"})],
                chunk_size=5,
                chunk_delay=self.chunk_delay,
            )
        self.final_calls += 1
        first = self.final_calls == 1
        text = self.final_texts.get(self.final_calls, FINAL_TEXT)
        if self.stall_final_mid and first:
            return Reply(text=text, chunk_size=4, chunk_delay=60.0)  # the first chunk, then nothing
        return Reply(
            text=text, chunk_size=4, delay=60.0 if self.stall_final and first else 0.0, chunk_delay=self.chunk_delay
        )


@dataclass
class Harness:
    rig: Rig
    journal: SqliteJournal
    model: ScriptedModel
    script: Script
    tool: TouchTool


@asynccontextmanager
async def open_rig(folder: Path, *, stall_final: bool = False, script: Script | None = None) -> AsyncIterator[Harness]:
    folder.mkdir(parents=True, exist_ok=True)
    script = script or Script(stall_final=stall_final)
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
