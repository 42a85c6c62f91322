"""`loopd run` and MCP servers: --mcp-config loads them; a workspace's .mcp.json runs only after an explicit opt-in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from loopd.harness.models import IncomingRequest, ServerReply, open_scripted_server
from tests.cli_run.conftest import Dirs, run_captured

SERVER_SCRIPT = Path(__file__).parents[1] / "harness_tools" / "fixtures" / "mcp_echo_server.py"


def _tools_reply(request: IncomingRequest) -> ServerReply:
    return ServerReply(text="tools: " + " ".join(sorted(request.tool_names)))


def _workspace_config(dirs: Dirs, marker: Path) -> None:
    (dirs.workspace / ".mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "fixture": {"command": sys.executable, "args": [str(SERVER_SCRIPT)]},
                    # What a hostile workspace could do: run any command. It must not run without the opt-in.
                    "sneaky": {"command": sys.executable, "args": ["-c", f"open({str(marker)!r}, 'w').write('ran')"]},
                }
            }
        )
    )


async def test_a_workspace_mcp_json_does_not_run_without_the_opt_in(dirs: Dirs, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    _workspace_config(dirs, marker)
    async with open_scripted_server(_tools_reply) as url:
        result = await run_captured(dirs, model="scripted", base_url=url, prompt="which tools?")
    assert result.code == 0, result.stderr
    assert ".mcp.json not loaded" in result.stderr and "--trust-workspace-mcp" in result.stderr
    assert not marker.exists()  # nothing from the file ran
    assert "mcp__" not in result.stdout


async def test_the_opt_in_loads_it_and_a_failing_server_is_one_line(dirs: Dirs, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    _workspace_config(dirs, marker)
    async with open_scripted_server(_tools_reply) as url:
        result = await run_captured(
            dirs, model="scripted", base_url=url, prompt="which tools?", trust_workspace_mcp=True
        )
    assert result.code == 0, result.stderr
    assert "mcp__fixture__echo" in result.stdout  # the model is offered the server's tools
    assert marker.exists()  # the opt-in ran the commands (the sneaky one is no MCP server: it fails)
    failed = [line for line in result.stderr.splitlines() if "MCP server 'sneaky' not loaded" in line]
    assert len(failed) == 1


async def test_mcp_config_loads_a_third_party_server_and_a_bad_file_exits_2(dirs: Dirs, tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}}})
    )
    async with open_scripted_server(_tools_reply) as url:
        result = await run_captured(dirs, model="scripted", base_url=url, prompt="which tools?", mcp_config=config)
        assert result.code == 0, result.stderr
        assert "mcp__time__get_current_time" in result.stdout
        config.write_text(json.dumps({"mcpServers": {"time": {"url": "ftp://nope"}}}))
        result = await run_captured(dirs, model="scripted", base_url=url, prompt="hi", mcp_config=config)
    assert result.code == 2
    assert "mcpServers.time: 'url' must start with http" in result.stderr and "\n" not in result.stderr.strip()
