"""An MCP stdio server's tool inside a running loop: the model calls it, the gate asks, the answer decides."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from loopd.harness import LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel
from loopd.harness.core.events import GateOpened, GateResolved, ToolCompleted, TurnDone
from loopd.harness.gate import MemoryRuleStore
from loopd.harness.tools._mcp import McpStdioServer, open_mcp_toolset

SERVER_SCRIPT = Path(__file__).parent / "fixtures" / "mcp_echo_server.py"
ECHO = "mcp__fixture__echo"


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    with open(tmp_path / "mcp-stderr.log", "w") as f:
        yield f


def _model() -> ScriptedModel:
    return ScriptedModel(
        [
            Reply(tool_calls=[(ECHO, {"text": "first"})]),
            Reply(text="one"),
            Reply(tool_calls=[(ECHO, {"text": "second"})]),
            Reply(text="two"),
        ]
    )


async def test_an_mcp_tool_runs_in_a_loop_only_after_the_gate(errlog: TextIO) -> None:
    server = McpStdioServer(name="fixture", command=sys.executable, args=(str(SERVER_SCRIPT),))
    rules = MemoryRuleStore()
    async with open_mcp_toolset(server, connect_timeout=20, call_timeout=10, errlog=errlog) as toolset:
        model = _model()
        rig = Rig(
            loops=[LoopDefinition(name="main", model=model, tools=tuple(toolset.tools))],
            journal=MemoryJournal(),
            rules=rules,
        )
        async with rig.open_session() as session:
            # The model sees the MCP tools like any other.
            sub = session.subscribe()
            await session.submit("echo first")
            events = []
            async with asyncio.timeout(15):
                async for env in sub:
                    events.append(env.event)
                    if isinstance(env.event, GateOpened):
                        prompt = env.event.prompt
                        assert any("fixture/echo" in str(item) for item in prompt.get("items", [prompt]))
                        # Nothing ran before the answer.
                        assert not any(isinstance(e, ToolCompleted) for e in events)
                        await session.answer_gate(env.event.gate_id, "approve_always")
                    if isinstance(env.event, TurnDone):
                        break
            await sub.aclose()
            completed = [e for e in events if isinstance(e, ToolCompleted)]
            assert [(c.outcome.status, c.outcome.output) for c in completed] == [("ok", "echo: first")]
            assert any(isinstance(e, GateResolved) and e.granted for e in events)
            assert any(r.kind == "mcp" and r.pattern == "fixture/echo" for r in await rules.load())

            # "Always" was stored: the second call runs without a prompt.
            sub = session.subscribe()
            done = await session.ask("echo second", timeout=15)
            assert isinstance(done, TurnDone) and done.text == "two"
            seen = []
            while True:
                env = await asyncio.wait_for(sub.__anext__(), 30)
                seen.append(env.event)
                if isinstance(env.event, TurnDone):
                    break
            await sub.aclose()
            assert not any(isinstance(e, GateOpened) for e in seen)
            outs = [e.outcome.output for e in seen if isinstance(e, ToolCompleted)]
            assert outs == ["echo: second"]
        tool_messages = [m.content for m in model.requests[1].messages if m.role == "tool"]
        assert tool_messages == ["echo: first"]


async def test_a_denied_mcp_call_never_reaches_the_server(errlog: TextIO) -> None:
    server = McpStdioServer(name="fixture", command=sys.executable, args=(str(SERVER_SCRIPT),))
    async with open_mcp_toolset(server, connect_timeout=20, call_timeout=10, errlog=errlog) as toolset:
        model = ScriptedModel([Reply(tool_calls=[(ECHO, {"text": "nope"})]), Reply(text="ok, not allowed")])
        rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=tuple(toolset.tools))], journal=MemoryJournal())
        async with rig.open_session() as session:
            sub = session.subscribe(kinds={"gate_opened", "tool_completed", "turn_done"})
            await session.submit("echo")
            outcome = None
            async with asyncio.timeout(15):
                async for env in sub:
                    if isinstance(env.event, GateOpened):
                        await session.answer_gate(env.event.gate_id, "deny")
                    elif isinstance(env.event, ToolCompleted):
                        outcome = env.event.outcome
                    elif isinstance(env.event, TurnDone):
                        break
            await sub.aclose()
    assert outcome is not None and outcome.status == "denied"
    assert "echo:" not in outcome.output
