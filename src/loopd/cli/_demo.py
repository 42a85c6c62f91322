"""`loopd demo`: a short harness session in the terminal with the scripted model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer
from rich.panel import Panel

from loopd.cli._errors import cli_console, run_async
from loopd.harness import EchoTool, LoopDefinition, Reply, Rig, ScriptedModel, SqliteJournal
from loopd.harness.core.events import TokenDelta, ToolCallStarted, ToolCompleted, TurnDone


def demo_command(
    data_dir: Path | None = typer.Option(None, help="Where to keep the demo journal (default: a temp folder)."),
) -> None:
    """Run a short durable harness session with the scripted model: a tool step, a streamed answer, a restore."""
    run_async(_demo(data_dir or Path(tempfile.mkdtemp(prefix="loopd-demo-"))))


async def _demo(data_dir: Path) -> None:
    console = cli_console(stderr=False)
    journal = await SqliteJournal.open(data_dir / "journal.db")
    model = ScriptedModel(
        [
            Reply(tool_calls=[("echo", {"text": "hello from a tool", "delay": 0.3})], delay=0.2),
            Reply(
                text="The echo tool answered 'hello from a tool'. Every step you just saw is in the journal.",
                chunk_size=3,
                chunk_delay=0.02,
            ),
        ]
    )
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=journal, name="demo")
    session = await rig.start_session()
    console.print(Panel.fit(f"session [bold]{session.id}[/]\njournal {data_dir / 'journal.db'}", title="loopd demo"))
    events = session.subscribe()
    console.print("[bold cyan]you[/] › say hello through a tool")
    await session.submit("say hello through a tool")
    with console.status("thinking…") as status:
        async for env in events:
            event = env.event
            if isinstance(event, ToolCallStarted):
                status.update(f"running tool [bold]{event.name}[/] {event.summary}")
            elif isinstance(event, ToolCompleted):
                console.print(f"  [dim]tool {event.outcome.name} → {event.outcome.status}: {event.outcome.output}[/]")
                status.update("thinking…")
            elif isinstance(event, TokenDelta):
                status.stop()
                console.print(event.text, end="", style="green", soft_wrap=True)
            elif isinstance(event, TurnDone):
                console.print()
                console.print(f"  [dim]turn done in {event.step} steps · {event.usage.total_tokens} tokens[/]")
                break
    await session.shutdown()
    restored = await rig.restore_session(session.id)
    loop = restored.state.loops["main"]
    console.print(
        f"[bold]restored[/] session from {restored.last_seq} journal records: "
        f"{len(loop.history)} messages, last reply intact: {loop.last_reply is not None}"
    )
    await restored.shutdown()
    await journal.aclose()
