"""MCP tools from a stdio (and streamable HTTP) server: listed, gated and called through the Tool protocol."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.core._values import EffectKind, Idempotency, ToolCall
from loopd.harness.gate import (
    AccessConfig,
    GateAnswer,
    MemoryRuleStore,
    Rule,
    RuleEffect,
    Verdict,
    evaluate,
    resolve_answer,
)
from loopd.harness.tools._mcp import (
    McpConnectError,
    McpHttpServer,
    McpStdioServer,
    McpTool,
    McpToolset,
    open_mcp_toolset,
    tool_name,
)
from loopd.harness.tools._protocol import Tool, ToolContext

SERVER_SCRIPT = Path(__file__).parent / "fixtures" / "mcp_echo_server.py"
CTX = ToolContext(session_id="s", loop="main", call_id="c")


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    with open(tmp_path / "mcp-stderr.log", "w") as f:
        yield f


def connect(errlog: TextIO, **env: str) -> contextlib.AbstractAsyncContextManager[McpToolset]:
    # Entered in each test body: the SDK's task groups must be entered and left by the same task, which an
    # async pytest fixture does not guarantee.
    server = McpStdioServer(name="fixture", command=sys.executable, args=(str(SERVER_SCRIPT),), env=env)
    return open_mcp_toolset(server, connect_timeout=20, call_timeout=10, errlog=errlog)


def by_remote(toolset: McpToolset, name: str) -> McpTool:
    return next(t for t in toolset.tools if t.remote_name == name)


async def test_tools_are_listed_as_loopd_tools(errlog: TextIO) -> None:
    async with connect(errlog) as toolset:
        tools = {t.spec.name: t for t in toolset.tools}
    assert sorted(tools) == ["mcp__fixture__echo", "mcp__fixture__fail", "mcp__fixture__getenv"]
    echo = tools["mcp__fixture__echo"]
    assert isinstance(echo, Tool)
    assert echo.spec.parameters["required"] == ["text"]
    assert "Echo the text back." in echo.spec.description
    assert (echo.effect, echo.idempotency) == (EffectKind.READ, Idempotency.INHERENT)
    fail = tools["mcp__fixture__fail"]
    assert (fail.effect, fail.idempotency) == (EffectKind.UNKNOWN, Idempotency.UNKNOWN)


async def test_the_tool_is_called_through_the_gate(errlog: TextIO) -> None:
    async with connect(errlog) as toolset:
        echo = by_remote(toolset, "echo")
        prepared = echo.prepare(ToolCall(id="call-1", name=echo.spec.name, arguments={"text": "hi"}))
        (requirement,) = prepared.requirements
        assert (requirement.kind, requirement.scope, requirement.match) == ("mcp", "mcp:fixture", "fixture/echo")

        store = MemoryRuleStore()
        decision = evaluate([prepared], access=AccessConfig(), stored=await store.load())
        assert decision.verdict("call-1") is Verdict.GATED
        assert decision.prompt is not None
        resolution = await resolve_answer(decision.prompt, GateAnswer.APPROVE_ALWAYS, store)
        assert resolution.granted

        result = await echo.run(prepared, CTX)
        assert (result.output, result.is_error) == ("echo: hi", False)

        again = evaluate([prepared], access=AccessConfig(), stored=await store.load())
        assert again.verdict("call-1") is Verdict.ALLOW


async def test_a_stored_deny_keeps_the_tool_from_running(errlog: TextIO) -> None:
    async with connect(errlog) as toolset:
        echo = by_remote(toolset, "echo")
        prepared = echo.prepare(ToolCall(id="call-1", name=echo.spec.name, arguments={"text": "hi"}))
    allow = Rule(kind="mcp", pattern="fixture/echo", effect=RuleEffect.ALLOW)
    deny = Rule(kind="mcp", pattern="fixture/*", effect=RuleEffect.DENY)
    decision = evaluate([prepared], access=AccessConfig(), stored=[allow, deny])
    assert decision.verdict("call-1") is Verdict.DENY


async def test_server_errors_are_error_results(errlog: TextIO) -> None:
    async with connect(errlog) as toolset:
        fail = by_remote(toolset, "fail")
        prepared = fail.prepare(ToolCall(id="c", name=fail.spec.name, arguments={"reason": "boom"}))
        result = await fail.run(prepared, CTX)
    assert result.is_error
    assert "boom" in result.output


async def test_secrets_are_not_inherited_by_a_stdio_server(errlog: TextIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    async with connect(errlog, EXPLICIT="given") as toolset:
        getenv = by_remote(toolset, "getenv")
        outputs = {}
        for name in ("OPENAI_API_KEY", "EXPLICIT"):
            prepared = getenv.prepare(ToolCall(id="c", name=getenv.spec.name, arguments={"name": name}))
            outputs[name] = (await getenv.run(prepared, CTX)).output
    assert outputs == {"OPENAI_API_KEY": "<unset>", "EXPLICIT": "given"}


async def test_arguments_are_checked_in_prepare(errlog: TextIO) -> None:
    async with connect(errlog) as toolset:
        echo = by_remote(toolset, "echo")
    with pytest.raises(ToolArgumentsError, match="missing required arguments"):
        echo.prepare(ToolCall(id="c", name=echo.spec.name, arguments={}))


async def test_a_closed_toolset_refuses_calls(errlog: TextIO) -> None:
    async with connect(errlog) as toolset:
        echo = by_remote(toolset, "echo")
    assert toolset.closed
    prepared = echo.prepare(ToolCall(id="c", name=echo.spec.name, arguments={"text": "late"}))
    with pytest.raises(ToolError, match="closed"):
        await echo.run(prepared, CTX)


async def test_a_server_that_cannot_start_is_a_connect_error(errlog: TextIO, tmp_path: Path) -> None:
    server = McpStdioServer(name="broken", command=str(tmp_path / "no-such-binary"))
    with pytest.raises(McpConnectError, match="broken"):
        async with open_mcp_toolset(server, connect_timeout=5, errlog=errlog):
            pass


async def test_a_server_that_never_answers_times_out(errlog: TextIO) -> None:
    server = McpStdioServer(name="silent", command=sys.executable, args=("-c", "import sys; sys.stdin.read()"))
    with pytest.raises(McpConnectError, match=r"did not answer within 0\.5s"):
        async with open_mcp_toolset(server, connect_timeout=0.5, errlog=errlog):
            pass


async def test_errors_in_the_body_propagate_unwrapped(errlog: TextIO) -> None:
    with pytest.raises(LookupError, match="from the body"):
        async with connect(errlog):
            raise LookupError("from the body")


def test_tool_names_are_safe_for_model_apis() -> None:
    assert tool_name("srv", "read") == "mcp__srv__read"
    odd = tool_name("srv", "read.file/v2")
    assert odd.startswith("mcp__srv__read_file_v2_")
    long = tool_name("srv", "x" * 100)
    assert len(long) == 64
    assert long != tool_name("srv", "x" * 99)


async def test_streamable_http_server(errlog: TextIO) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(SERVER_SCRIPT), "--http", stdout=asyncio.subprocess.PIPE, stderr=errlog
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            line = await process.stdout.readline()
        port = int(line.split()[1])
        server = McpHttpServer(name="web", url=f"http://127.0.0.1:{port}/mcp")
        async with open_mcp_toolset(server, connect_timeout=20, call_timeout=10) as toolset:
            echo = by_remote(toolset, "echo")
            assert echo.spec.name == "mcp__web__echo"
            prepared = echo.prepare(ToolCall(id="c", name=echo.spec.name, arguments={"text": "over http"}))
            result = await echo.run(prepared, CTX)
        assert result.output == "echo: over http"
    finally:
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(10):
            await process.wait()
