"""`loopd run`'s MCP servers: ``--mcp-config FILE`` and the workspace's ``.mcp.json``, behind an explicit opt-in.

A ``.mcp.json`` in the workspace was written by whoever wrote the workspace (a cloned repository, a downloaded
archive): its stdio servers are commands this process would run, and its HTTP servers are places it would send
requests to. So it is loaded only with ``--trust-workspace-mcp``, or when the user answers "y" to a question that
shows every command and URL; without a terminal and without the flag it is skipped with one line saying how to
load it. ``--mcp-config FILE`` is the user's own choice and needs no question.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

from loopd.cli._errors import CliError
from loopd.cli._run_input import InputInterrupted, LineInput

if TYPE_CHECKING:
    from loopd.cli._run_view import RunView
    from loopd.harness.tools import McpServer

EXIT_USAGE: Final = 2
WORKSPACE_MCP_FILE: Final = ".mcp.json"
"""The same name as `loopd.harness.tools.WORKSPACE_MCP_FILE` (not imported: that loads the MCP SDK)."""


async def mcp_servers_for(
    workspace: Path, config: Path | None, *, trust_workspace: bool, view: RunView, terminal: LineInput
) -> tuple[McpServer, ...]:
    """The MCP servers `loopd run` starts: those of ``config``, then the workspace's when trusted.

    Raises `CliError` (exit 2) for a malformed file.
    """
    workspace_file = _workspace_file(workspace)
    if config is None and workspace_file is None:
        return ()
    from loopd.harness.tools import McpConfigError, load_mcp_config  # the MCP SDK: loaded only when used

    servers: list[McpServer] = []
    try:
        if config is not None:
            servers.extend(load_mcp_config(config))
        if workspace_file is not None:
            found = load_mcp_config(workspace_file)
            if found and (trust_workspace or await _ask_trust(workspace_file, found, view, terminal)):
                servers.extend(found)
            elif found:
                view.warning(
                    f"{workspace_file} not loaded: its MCP servers run commands that came with the workspace; "
                    "pass --trust-workspace-mcp to load them"
                )
    except McpConfigError as exc:
        hint = 'the format: {"mcpServers": {"NAME": {"command", "args", "env"} or {"url", "headers"}}}'
        raise CliError(str(exc), hint, exit_code=EXIT_USAGE) from None
    return tuple(servers)


def _workspace_file(workspace: Path) -> Path | None:
    path = workspace / WORKSPACE_MCP_FILE
    return path if path.is_file() else None


async def _ask_trust(path: Path, servers: tuple[McpServer, ...], view: RunView, terminal: LineInput) -> bool:
    from loopd.harness.tools import describe_server

    if not terminal.interactive:
        return False
    lines = "\n".join(f"  • {describe_server(s)}" for s in servers)
    view.warning(f"{path} asks to start these MCP servers:\n{lines}")
    view.note("Only say yes if you trust whoever wrote this workspace. Start them? [y/N] ")
    terminal.discard_pending()
    try:
        line = await terminal.readline()
    except InputInterrupted:
        return False
    view.answered()
    return (line or "").strip().lower() in ("y", "yes")
