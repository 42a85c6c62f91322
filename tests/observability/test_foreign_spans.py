"""A foreign loop's spans while tracing is on: its turn is an ``invoke_agent`` span, the CLI's run of the turn its
``chat foreign:<kind>`` child (with the usage and cost the CLI reported), and each of the CLI's own tools an
``execute_tool`` span under that."""

from __future__ import annotations

import sys
from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from loopd.harness import LoopDefinition, MemoryJournal, Rig
from loopd.harness.core.events import TurnDone
from loopd.harness.foreign import ForeignEngine
from loopd.harness.gate import Access, AccessConfig
from tests.support.tracing import named, parent_of

FAKES = Path(__file__).resolve().parents[1] / "harness_foreign"


async def test_a_foreign_turn_has_chat_and_execute_tool_spans(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    engine = ForeignEngine(kind="claude", command=(sys.executable, str(FAKES / "fake_claude.py")), cwd=tmp_path)
    access = AccessConfig(tools={"Bash": Access.ALLOW})  # the gate lets the CLI's Bash run without asking
    loop = LoopDefinition(name="main", model=engine, access=access, model_timeout=30)
    session = await Rig(loops=[loop], journal=MemoryJournal()).start_session()
    result = await session.ask("use a tool please", timeout=30)
    await session.shutdown()
    assert isinstance(result, TurnDone) and result.text == "Bash said a.txt"
    recorded = spans.get_finished_spans()
    [turn] = named(recorded, "invoke_agent main")
    [chat] = named(recorded, "chat foreign:claude")
    assert parent_of(recorded, chat) is turn
    assert chat.attributes is not None
    assert (chat.attributes["gen_ai.usage.input_tokens"], chat.attributes["gen_ai.usage.output_tokens"]) == (12, 5)
    assert chat.attributes["loopd.usage.cost_usd"] == 0.0042
    [tool] = named(recorded, "execute_tool Bash")
    assert parent_of(recorded, tool) is chat
    assert tool.attributes is not None and tool.attributes["gen_ai.tool.call.id"] == "toolu_1"
    assert tool.status.status_code is StatusCode.UNSET


async def test_a_refused_foreign_tool_marks_its_span(spans: InMemorySpanExporter, tmp_path: Path) -> None:
    engine = ForeignEngine(kind="claude", command=(sys.executable, str(FAKES / "fake_claude.py")), cwd=tmp_path)
    access = AccessConfig(tools={"Bash": Access.DENY})
    loop = LoopDefinition(name="main", model=engine, access=access, model_timeout=30)
    session = await Rig(loops=[loop], journal=MemoryJournal()).start_session()
    await session.ask("use a tool please", timeout=30)
    await session.shutdown()
    [tool] = named(spans.get_finished_spans(), "execute_tool Bash")
    assert tool.status.status_code is StatusCode.ERROR
