"""Tools from MCP servers (stdio or streamable HTTP), exposed as loopd `Tool`s and gated like built-ins.

`open_mcp_toolset(server)` connects with the official ``mcp`` SDK (2.x), lists the server's tools and yields
an `McpToolset`; leaving the context closes the session (and stops a stdio server's process). Each remote
tool becomes ``mcp__<server>__<tool>`` with one requirement: kind ``mcp``, scope ``mcp:<server>``, match
``<server>/<tool>``. Effect and idempotency are unknown unless the server's annotations say ``readOnlyHint``
(read, inherently repeatable) or ``idempotentHint`` (inherently repeatable) — hints from the server, trusted
only for recovery decisions, never for permission.

A stdio server inherits only the SDK's safe environment (HOME, LOGNAME, PATH, SHELL, TERM, USER) plus the
variables configured for it. A tool call is bounded by ``call_timeout``; its text, image, audio and resource
blocks are rendered as text. A server-side error (``isError``) is an error result; a protocol or transport
failure raises `ToolError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Literal, TextIO

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import Field

from loopd.harness._errors import HarnessError, ToolArgumentsError, ToolError
from loopd.harness.core import EffectKind, Frozen, Idempotency, ToolCall
from loopd.harness.gate import escape_pattern as escape
from loopd.harness.models import ToolSpec
from loopd.harness.tools._base import truncate_middle
from loopd.harness.tools._protocol import GrantCandidate, PreparedCall, Requirement, ToolContext, ToolResult

MCP_KIND: Final = "mcp"
CONNECT_TIMEOUT: Final = 30.0
CALL_TIMEOUT: Final = 120.0
MAX_OUTPUT_CHARS: Final = 100_000
MAX_TOOL_NAME: Final = 64
_MAX_LIST_PAGES: Final = 100
_SERVER_NAME: Final = r"^[A-Za-z0-9_-]{1,32}$"
_UNSAFE_NAME_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]")


class McpConnectError(HarnessError):
    """An MCP server could not be started, reached, initialized or listed."""


class McpStdioServer(Frozen):
    """An MCP server run as a child process speaking JSON-RPC on stdin/stdout."""

    transport: Literal["stdio"] = "stdio"
    name: str = Field(pattern=_SERVER_NAME)
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class McpHttpServer(Frozen):
    """An MCP server reached over streamable HTTP."""

    transport: Literal["http"] = "http"
    name: str = Field(pattern=_SERVER_NAME)
    url: str = Field(min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)


McpServer = McpStdioServer | McpHttpServer


def tool_name(server: str, remote: str) -> str:
    """``mcp__<server>__<tool>``, made safe for model APIs (``[A-Za-z0-9_-]``, at most 64 characters)."""
    name = f"mcp__{server}__{_UNSAFE_NAME_CHARS.sub('_', remote)}"
    if len(name) <= MAX_TOOL_NAME and name == f"mcp__{server}__{remote}":
        return name
    digest = hashlib.sha256(remote.encode()).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME - 9]}_{digest}"


def render_content(result: mcp_types.CallToolResult) -> str:
    """The text a model sees for a tool result."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent):
            parts.append(f"[image {block.mime_type}, {len(block.data)} base64 characters]")
        elif isinstance(block, mcp_types.AudioContent):
            parts.append(f"[audio {block.mime_type}, {len(block.data)} base64 characters]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        elif isinstance(block.resource, mcp_types.TextResourceContents):
            parts.append(block.resource.text)
        else:
            parts.append(f"[binary resource {block.resource.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return truncate_middle("\n".join(parts), MAX_OUTPUT_CHARS)


class McpTool:
    """One remote tool as a loopd `Tool`."""

    def __init__(self, toolset: McpToolset, info: mcp_types.Tool) -> None:
        self._toolset = toolset
        self._info = info
        self._name = tool_name(toolset.server, info.name)
        hints = info.annotations
        read_only = bool(hints and hints.read_only_hint)
        self._effect = EffectKind.READ if read_only else EffectKind.UNKNOWN
        repeatable = read_only or bool(hints and hints.idempotent_hint)
        self._idempotency = Idempotency.INHERENT if repeatable else Idempotency.UNKNOWN

    @property
    def remote_name(self) -> str:
        return self._info.name

    @property
    def spec(self) -> ToolSpec:
        description = self._info.description or self._info.title or self._info.name
        return ToolSpec(
            name=self._name,
            description=f"[MCP server {self._toolset.server}] {description}",
            parameters=dict(self._info.input_schema),
        )

    @property
    def effect(self) -> EffectKind:
        return self._effect

    @property
    def idempotency(self) -> Idempotency:
        return self._idempotency

    def prepare(self, call: ToolCall) -> PreparedCall:
        schema = self._info.input_schema
        required = schema.get("required", [])
        missing = [key for key in required if isinstance(key, str) and key not in call.arguments]
        if missing:
            raise ToolArgumentsError(f"missing required arguments for {self._name}: {', '.join(missing)}")
        if schema.get("additionalProperties") is False:
            known = schema.get("properties", {})
            extra = sorted(key for key in call.arguments if key not in known)
            if extra:
                raise ToolArgumentsError(f"unknown arguments for {self._name}: {', '.join(extra)}")
        server = self._toolset.server
        target = f"{server}/{self._info.name}"
        requirement = Requirement(
            kind=MCP_KIND,
            scope=f"mcp:{server}",
            match=escape(target),
            description=f"call MCP tool {target}",
            candidates=(GrantCandidate(kind=MCP_KIND, pattern=escape(target), description=f"call {target}"),),
        )
        return PreparedCall(
            call_id=call.id,
            tool=self._name,
            arguments=dict(call.arguments),
            requirements=(requirement,),
            summary=f"MCP {target}",
        )

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        result = await self._toolset.call(self._info.name, call.arguments)
        return ToolResult(output=render_content(result), is_error=bool(result.is_error))


class McpToolset:
    """The tools of one connected MCP server. Valid only inside `open_mcp_toolset`."""

    def __init__(
        self, server: str, session: ClientSession, tools: Sequence[mcp_types.Tool], *, call_timeout: float
    ) -> None:
        self._server = server
        self._session = session
        self._call_timeout = call_timeout
        self._closed = False
        wrapped = [McpTool(self, info) for info in tools]
        names = [t.spec.name for t in wrapped]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise McpConnectError(f"MCP server {server!r} has tools whose names collide: {duplicates}")
        self._tools = tuple(wrapped)

    @property
    def server(self) -> str:
        return self._server

    @property
    def tools(self) -> tuple[McpTool, ...]:
        return self._tools

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    async def call(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        if self._closed:
            raise ToolError(f"the connection to MCP server {self._server!r} is closed")
        try:
            async with asyncio.timeout(self._call_timeout):
                return await self._session.call_tool(name, arguments, read_timeout_seconds=self._call_timeout)
        except TimeoutError as exc:
            raise ToolError(f"MCP tool {self._server}/{name} timed out after {self._call_timeout:g}s") from exc
        except MCPError as exc:
            raise ToolError(f"MCP tool {self._server}/{name} failed: {exc.message}") from exc
        except Exception as exc:  # transport failures surface as assorted anyio/OS errors
            raise ToolError(f"MCP tool {self._server}/{name} failed: {type(exc).__name__}: {exc}") from exc


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
    raise McpConnectError(f"tool listing did not end after {_MAX_LIST_PAGES} pages")


@contextlib.asynccontextmanager
async def open_mcp_toolset(
    server: McpServer,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    call_timeout: float = CALL_TIMEOUT,
    errlog: TextIO | None = None,
) -> AsyncIterator[McpToolset]:
    """Connect, initialize and list tools within ``connect_timeout``; close everything on exit.

    Enter and leave it in the same task (the SDK's anyio task groups require it). Exceptions from the body
    propagate unchanged (not wrapped in an ``ExceptionGroup``). ``errlog`` receives a stdio server's stderr
    (default: this process's stderr).
    """
    stack = contextlib.AsyncExitStack()
    try:
        async with asyncio.timeout(connect_timeout):
            session = await _connect(stack, server, errlog)
            await session.initialize()
            listing = await _list_tools(session)
        toolset = McpToolset(server.name, session, listing, call_timeout=call_timeout)
    except BaseException as exc:
        # Unwind the transport before raising, so the error is ours and not an anyio ExceptionGroup.
        with contextlib.suppress(Exception):
            await stack.aclose()
        if isinstance(exc, TimeoutError):
            raise McpConnectError(f"MCP server {server.name!r} did not answer within {connect_timeout:g}s") from exc
        if isinstance(exc, McpConnectError):
            raise
        if isinstance(exc, Exception):
            raise McpConnectError(f"cannot connect to MCP server {server.name!r}: {exc}") from exc
        raise
    try:
        yield toolset
    finally:
        toolset.close()
        # Closed without the body's exception, which then propagates as it was.
        await stack.aclose()


async def _connect(stack: contextlib.AsyncExitStack, server: McpServer, errlog: TextIO | None) -> ClientSession:
    if isinstance(server, McpStdioServer):
        params = StdioServerParameters(
            command=server.command, args=list(server.args), env=dict(server.env) or None, cwd=server.cwd
        )
        read, write = await stack.enter_async_context(stdio_client(params, errlog or sys.stderr))
    else:
        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(server.headers)))
        read, write = await stack.enter_async_context(streamable_http_client(server.url, http_client=http))
    return await stack.enter_async_context(ClientSession(read, write))
