"""MCP servers from configuration: the widely used ``mcpServers`` format, loaded into `McpServer` values.

    {"mcpServers": {
        "time":  {"command": "python", "args": ["-m", "mcp_server_time"], "env": {"TZ": "UTC"}},
        "notes": {"type": "http", "url": "https://example.test/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }}

An entry with ``command`` is a stdio server (``args``, ``env``, ``cwd`` optional); one with ``url`` is a
streamable-HTTP server (``headers`` optional; ``type`` may say ``http`` or ``streamable-http``; ``sse`` is refused:
that transport is deprecated and not supported). ``${VAR}`` and ``${VAR:-default}`` in ``command``, ``args``,
``env``, ``cwd``, ``url`` and ``headers`` are read from the environment; an unset variable without a default is an
error naming it. Server names become part of tool names (``mcp__<server>__<tool>``), so they must match
``[A-Za-z0-9_-]{1,32}``. ``disabled: true`` skips an entry.

`open_configured_mcp_tools` connects to every server (each within its own connect timeout); a server that fails
is reported in one line through ``report`` and the others still load. A workspace's ``.mcp.json`` runs commands
written by whoever wrote the workspace: the caller must ask for an explicit opt-in before loading it (see
`loopd run --trust-workspace-mcp`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Final, TextIO

from pydantic import ValidationError

from loopd.harness._errors import HarnessError
from loopd.harness.tools._mcp import (
    CALL_TIMEOUT,
    CONNECT_TIMEOUT,
    McpConnectError,
    McpHttpServer,
    McpServer,
    McpStdioServer,
    McpTool,
    open_mcp_toolset,
)

WORKSPACE_MCP_FILE: Final = ".mcp.json"
_VAR: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_STDIO_KEYS: Final = frozenset({"command", "args", "env", "cwd", "type", "disabled", "description"})
_HTTP_KEYS: Final = frozenset({"url", "headers", "type", "disabled", "description"})
_MAX_FILE: Final = 1024 * 1024


class McpConfigError(HarnessError, ValueError):
    """An ``mcpServers`` configuration is malformed (the message names the file and the entry)."""


def _expand(value: str, env: Mapping[str, str], where: str) -> str:
    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise McpConfigError(f"{where}: ${{{name}}} is not set (set it, or write ${{{name}:-default}})")

    return _VAR.sub(sub, value)


def _strings(value: Any, where: str, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise McpConfigError(f"{where}: {what!r} must be an object of strings")
    return dict(value)


def parse_mcp_servers(
    data: Any, *, source: str, env: Mapping[str, str] | None = None, base_dir: Path | None = None
) -> tuple[McpServer, ...]:
    """The servers of an ``mcpServers`` document (already parsed JSON/YAML); `McpConfigError` when malformed.

    ``source`` names the document in errors; ``base_dir`` resolves a relative ``cwd``.
    """
    env = os.environ if env is None else env
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError(f"{source}: expected an object with an 'mcpServers' object")
    servers: list[McpServer] = []
    for name, entry in data["mcpServers"].items():
        where = f"{source}: mcpServers.{name}"
        if not isinstance(entry, dict):
            raise McpConfigError(f"{where}: must be an object")
        if entry.get("disabled") is True:
            continue
        kind = entry.get("type")
        try:
            if "command" in entry:
                if kind not in (None, "stdio"):
                    raise McpConfigError(f"{where}: 'command' needs type 'stdio', not {kind!r}")
                unknown = set(entry) - _STDIO_KEYS
                if unknown:
                    raise McpConfigError(f"{where}: unknown keys {sorted(unknown)}")
                args = entry.get("args", [])
                if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                    raise McpConfigError(f"{where}: 'args' must be a list of strings")
                if not isinstance(entry["command"], str):
                    raise McpConfigError(f"{where}: 'command' must be a string")
                cwd = entry.get("cwd")
                if cwd is not None:
                    if not isinstance(cwd, str):
                        raise McpConfigError(f"{where}: 'cwd' must be a string")
                    cwd = _expand(cwd, env, where)
                    if base_dir is not None:
                        cwd = str((base_dir / cwd).resolve())
                servers.append(
                    McpStdioServer(
                        name=name,
                        command=_expand(entry["command"], env, where),
                        args=tuple(_expand(a, env, where) for a in args),
                        env={k: _expand(v, env, where) for k, v in _strings(entry.get("env"), where, "env").items()},
                        cwd=cwd,
                    )
                )
            elif "url" in entry:
                if kind == "sse":
                    raise McpConfigError(f"{where}: the SSE transport is not supported; use streamable HTTP")
                if kind not in (None, "http", "streamable-http", "streamable_http"):
                    raise McpConfigError(f"{where}: unknown type {kind!r} (use 'http' or 'stdio')")
                unknown = set(entry) - _HTTP_KEYS
                if unknown:
                    raise McpConfigError(f"{where}: unknown keys {sorted(unknown)}")
                if not isinstance(entry["url"], str):
                    raise McpConfigError(f"{where}: 'url' must be a string")
                url = _expand(entry["url"], env, where)
                if not url.startswith(("http://", "https://")):
                    raise McpConfigError(f"{where}: 'url' must start with http:// or https://")
                headers = {
                    k: _expand(v, env, where) for k, v in _strings(entry.get("headers"), where, "headers").items()
                }
                servers.append(McpHttpServer(name=name, url=url, headers=headers))
            else:
                raise McpConfigError(f"{where}: needs 'command' (stdio) or 'url' (streamable HTTP)")
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise McpConfigError(f"{where}: {field}: {first['msg']} (server names: [A-Za-z0-9_-]{{1,32}})") from None
    return tuple(servers)


def load_mcp_config(path: Path, *, env: Mapping[str, str] | None = None) -> tuple[McpServer, ...]:
    """The servers of the ``mcpServers`` JSON file ``path`` (a relative ``cwd`` is relative to the file)."""
    try:
        if path.stat().st_size > _MAX_FILE:
            raise McpConfigError(f"{path}: larger than {_MAX_FILE} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise McpConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise McpConfigError(f"{path}: not valid JSON: {exc}") from exc
    return parse_mcp_servers(data, source=str(path), env=env, base_dir=path.parent)


def workspace_mcp_file(workspace: Path) -> Path | None:
    """The workspace's ``.mcp.json`` when it has one (a regular file, not a symlink to elsewhere)."""
    path = workspace / WORKSPACE_MCP_FILE
    return path if path.is_file() and not path.is_symlink() else None


def describe_server(server: McpServer) -> str:
    """One line saying what a server runs or reaches (for a trust prompt)."""
    if isinstance(server, McpStdioServer):
        return f"{server.name}: runs {' '.join([server.command, *server.args])}"
    return f"{server.name}: connects to {server.url}"


@contextlib.asynccontextmanager
async def open_configured_mcp_tools(
    servers: tuple[McpServer, ...],
    *,
    report: Callable[[str], None],
    connect_timeout: float = CONNECT_TIMEOUT,
    call_timeout: float = CALL_TIMEOUT,
    errlog: TextIO | None = None,
) -> AsyncIterator[tuple[McpTool, ...]]:
    """Connect to every server; yield all their tools. A server that fails is reported (one line) and skipped.

    Enter and leave in the same task (the MCP SDK requires it); leaving stops every server. ``errlog`` receives
    the stdio servers' stderr (default: this process's).
    """
    tools: list[McpTool] = []
    async with contextlib.AsyncExitStack() as stack:
        seen: set[str] = set()
        for server in servers:
            if server.name in seen:
                report(f"MCP server {server.name!r} not loaded: the name is used twice")
                continue
            seen.add(server.name)
            try:
                toolset = await stack.enter_async_context(
                    open_mcp_toolset(server, connect_timeout=connect_timeout, call_timeout=call_timeout, errlog=errlog)
                )
            except McpConnectError as exc:
                report(f"MCP server {server.name!r} not loaded: {_one_line(str(exc))}")
                continue
            tools.extend(toolset.tools)
        yield tuple(tools)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:297] + "..."
