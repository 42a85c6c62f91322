"""MCP servers from configuration (the ``mcpServers`` format): parsing, loading several servers where one fails,
a third-party server from PyPI (mcp-server-time) next to the project's own, the gate, and restore."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from loopd.harness import LoopDefinition, Reply, Rig, ScriptedModel, SqliteJournal
from loopd.harness.core.events import GateOpened, ToolCompleted, TurnDone
from loopd.harness.tools import (
    McpConfigError,
    McpHttpServer,
    McpStdioServer,
    load_mcp_config,
    open_configured_mcp_tools,
    parse_mcp_servers,
)
from tests.support.availability import missing

SERVER_SCRIPT = Path(__file__).parent / "fixtures" / "mcp_echo_server.py"
TIME_TOOL = "mcp__time__get_current_time"


def _time_server_available() -> None:
    try:
        import mcp_server_time  # noqa: F401
    except ImportError:
        missing("mcp-server-time is not installed (pip install -e '.[dev]')")


# --- parsing (pure) --------------------------------------------------------------------------------------------


def test_the_mcp_servers_format_parses_stdio_and_http_entries_with_variables() -> None:
    doc = {
        "mcpServers": {
            "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone=${TZ:-UTC}"], "env": {"A": "1"}},
            "web": {"type": "http", "url": "https://mcp.example/${PATH_PART}", "headers": {"X-Key": "${KEY}"}},
            "off": {"command": "never", "disabled": True},
        }
    }
    servers = parse_mcp_servers(doc, source="t.json", env={"PATH_PART": "mcp", "KEY": "k1"})
    assert servers == (
        McpStdioServer(name="time", command="uvx", args=("mcp-server-time", "--local-timezone=UTC"), env={"A": "1"}),
        McpHttpServer(name="web", url="https://mcp.example/mcp", headers={"X-Key": "k1"}),
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"command": "x", "args": "not a list"}, "'args' must be a list"),
        ({"url": "ftp://x"}, "must start with http"),
        ({"url": "http://x", "type": "sse"}, "SSE transport is not supported"),
        ({"command": "x", "bogus": 1}, "unknown keys"),
        ({"nothing": 1}, "needs 'command'"),
        ({"command": "${UNSET_FOR_TEST}"}, "${UNSET_FOR_TEST} is not set"),
    ],
)
def test_a_malformed_entry_is_a_typed_error_naming_the_file_and_the_entry(entry: object, message: str) -> None:
    with pytest.raises(McpConfigError, match=r"cfg\.json: mcpServers\.s") as raised:
        parse_mcp_servers({"mcpServers": {"s": entry}}, source="cfg.json", env={})
    assert message in str(raised.value)


def test_a_bad_server_name_or_document_is_refused(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match="server names"):
        parse_mcp_servers({"mcpServers": {"has space": {"command": "x"}}}, source="c", env={})
    with pytest.raises(McpConfigError, match="'mcpServers' object"):
        parse_mcp_servers({"servers": {}}, source="c", env={})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(McpConfigError, match="not valid JSON"):
        load_mcp_config(bad)
    with pytest.raises(McpConfigError, match="cannot read"):
        load_mcp_config(tmp_path / "missing.json")


# --- loading: one failing server does not stop the others -----------------------------------------------------


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
                    "fixture": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]},
                    "broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]},
                    "absent": {"command": str(tmp_path / "no-such-program")},
                }
            }
        )
    )
    return path


async def test_configured_servers_load_and_a_failing_one_is_reported_in_one_line(tmp_path: Path) -> None:
    _time_server_available()
    reports: list[str] = []
    with open(tmp_path / "stderr.log", "w") as errlog:
        async with open_configured_mcp_tools(
            load_mcp_config(_config(tmp_path)), report=reports.append, connect_timeout=20, errlog=errlog
        ) as tools:
            names = {t.spec.name for t in tools}
            assert TIME_TOOL in names and "mcp__fixture__echo" in names
            assert not any("broken" in n or "absent" in n for n in names)
    assert len(reports) == 2 and all("\n" not in r for r in reports)
    assert any(r.startswith("MCP server 'broken' not loaded") for r in reports)
    assert any(r.startswith("MCP server 'absent' not loaded") for r in reports)


# --- the gate and restore --------------------------------------------------------------------------------------


def _rig(tools: tuple, journal: SqliteJournal, *, restored: bool = False) -> Rig:  # type: ignore[type-arg]
    script = [] if restored else [Reply(tool_calls=[(TIME_TOOL, {"timezone": "UTC"})])]
    model = ScriptedModel(script, default=Reply(text="It is now."))
    return Rig(loops=[LoopDefinition(name="main", model=model, tools=tools)], journal=journal)


async def test_a_configured_server_tool_waits_for_the_gate_and_survives_a_crash_and_restore(tmp_path: Path) -> None:
    """The third-party server's tool meets the gate like a built-in; the session crashes with the question open;
    a new process (new server connections) restores it, the answer arrives, the tool runs."""
    _time_server_available()
    servers = tuple(s for s in load_mcp_config(_config(tmp_path)) if s.name == "time")
    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        async with open_configured_mcp_tools(servers, report=pytest.fail, connect_timeout=20) as tools:
            session = await _rig(tools, journal).start_session()
            sub = session.subscribe()
            await session.submit("what time is it?")
            async with asyncio.timeout(30):
                async for env in sub:
                    assert not isinstance(env.event, ToolCompleted)  # nothing runs before the answer
                    if isinstance(env.event, GateOpened):
                        gate_id = env.event.gate_id
                        assert "time/get_current_time" in json.dumps(env.event.prompt)
                        break
            await sub.aclose()
            session.abort()  # a crash with the question open
        async with open_configured_mcp_tools(servers, report=pytest.fail, connect_timeout=20) as tools:
            restored = await _rig(tools, journal, restored=True).restore_session(session.id)
            sub = restored.subscribe()
            await restored.answer_gate(gate_id, "approve")
            outcome = None
            async with asyncio.timeout(30):
                async for env in sub:
                    if isinstance(env.event, ToolCompleted):
                        outcome = env.event.outcome
                    if isinstance(env.event, TurnDone):
                        break
            await sub.aclose()
            await restored.shutdown()
        assert outcome is not None and outcome.status == "ok" and '"timezone": "UTC"' in outcome.output
    finally:
        await journal.aclose()


# --- loopd up: a built-in harness's configuration ----------------------------------------------------------------


def test_a_builtin_harness_configures_mcp_servers_and_a_bad_entry_is_a_config_problem(tmp_path: Path) -> None:
    from loopd.server.config import BuiltinHarness, ConfigError, parse_config

    text = """
harnesses:
  - key: assistant
    kind: builtin
    mcpServers:
      time: {command: python3, args: [-m, mcp_server_time], env: {TZ: "${ZONE:-UTC}"}}
      docs: {url: "https://docs.example/mcp", headers: {Authorization: "Bearer t"}}
"""
    config = parse_config(text, base_dir=tmp_path, env={})
    assert config.harnesses is not None
    target = config.harnesses[0]
    assert isinstance(target, BuiltinHarness)
    assert target.mcp_servers == (
        McpStdioServer(name="time", command="python3", args=("-m", "mcp_server_time"), env={"TZ": "UTC"}),
        McpHttpServer(name="docs", url="https://docs.example/mcp", headers={"Authorization": "Bearer t"}),
    )
    with pytest.raises(ConfigError, match=r"mcpServers\.time: the SSE transport is not supported"):
        parse_config(
            text.replace("command: python3, args: [-m, mcp_server_time], env", "type: sse, url: 'http://x', h"), env={}
        )
