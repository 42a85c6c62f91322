"""bash: exit codes, output cap, timeout and cancellation kill the process group, scrubbed environment.

Every test that runs a command runs twice: unconfined and under bubblewrap (`sandboxes.SANDBOX_NAMES`). Inside the
sandbox's pid namespace ``$!`` is not a host pid, so the tests find processes by a unique argument instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from loopd.harness.core._values import ToolCall
from loopd.harness.tools._bash import BashTool, OutputCapture
from loopd.harness.tools._builtins import default_tools
from loopd.harness.tools._protocol import Tool, ToolContext, ToolResult
from loopd.harness.tools._sandbox import Sandbox
from loopd.harness.tools._workspace import Workspace

from .sandboxes import SANDBOX_NAMES, sandbox_named, wait_gone, wait_running
from .sandboxes import pids_running as pids_running_now

Call = Callable[..., Awaitable[ToolResult]]


@pytest.fixture(params=SANDBOX_NAMES)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return sandbox_named(request.param)


@pytest.fixture
def tools(workspace: Workspace, sandbox: Sandbox) -> dict[str, Tool]:
    return {tool.spec.name: tool for tool in default_tools(workspace, sandbox=sandbox)}


def marker() -> str:
    """A unique ``sleep`` argument (30 s and a random fraction) to find the process by."""
    return f"30.{secrets.randbelow(10**6):06d}"


async def test_output_and_exit_code(call: Call) -> None:
    assert await call("bash", command="echo hi") == ToolResult(output="hi\n[exit code: 0]")
    failed = await call("bash", command="echo oops >&2; exit 3")
    assert failed == ToolResult(output="oops\n[exit code: 3]", is_error=True)


async def test_runs_in_the_workspace_with_home_there(call: Call, root: Path) -> None:
    result = await call("bash", command='pwd; echo "$HOME"; cat README.md | head -1')
    assert result.output == f"{root}\n{root}\n# demo\n[exit code: 0]"


async def test_environment_is_scrubbed(call: Call, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-should-not-leak")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-should-not-leak")
    monkeypatch.setenv("INNOCENT_LOOKING", "also-not-inherited")
    result = await call("bash", command="env")
    assert "should-not-leak" not in result.output
    assert "OPENAI_API_KEY" not in result.output
    assert "INNOCENT_LOOKING" not in result.output
    names = {line.split("=", 1)[0] for line in result.output.splitlines()[:-1]}
    assert names <= {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "PWD", "SHLVL", "_"}


async def test_extra_environment_is_explicit(root: Path, ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = BashTool(Workspace(root), env={"CI": "1"}, sandbox=sandbox)
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": "echo $CI"}))
    assert (await tool.run(prepared, ctx)).output == "1\n[exit code: 0]"


async def test_output_is_capped_head_and_tail(root: Path, ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = BashTool(Workspace(root), output_limit=100, sandbox=sandbox)
    command = "echo START; for i in $(seq 1 2000); do echo line-$i; done; echo END"
    result = await tool.run(tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command})), ctx)
    assert result.output.startswith("START\n")
    assert "bytes of output omitted" in result.output
    assert result.output.endswith("END\n[exit code: 0]")
    assert len(result.output) < 300


def test_output_capture_keeps_head_and_tail() -> None:
    capture = OutputCapture(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        capture.feed(chunk)
    assert capture.total == 26
    assert capture.text() == "abcde\n[… 16 bytes of output omitted …]\nvwxyz"
    small = OutputCapture(10)
    small.feed(b"12345678")
    assert small.text() == "12345678"


async def test_timeout_kills_the_process_group(root: Path, ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = BashTool(Workspace(root), kill_grace=0.2, sandbox=sandbox)
    child, main = marker(), marker()
    command = f"sleep {child} & trap '' TERM; sleep {main}"
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command, "timeout": 1.5}))
    task = asyncio.create_task(tool.run(prepared, ctx))
    pids = await wait_running(child) + await wait_running(main)
    result = await task
    assert result.is_error
    assert "timed out after 1.5s" in result.output
    assert await wait_gone(pids)


async def test_a_timeout_sends_sigterm_to_the_command_before_killing_it(
    root: Path, ctx: ToolContext, sandbox: Sandbox
) -> None:
    tool = BashTool(Workspace(root), kill_grace=5.0, sandbox=sandbox)
    command = f"trap 'echo got SIGTERM; exit 5' TERM; sleep {marker()} & wait"
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command, "timeout": 0.5}))
    result = await tool.run(prepared, ctx)
    assert result.is_error
    assert result.output.startswith("got SIGTERM\n")
    assert "timed out after 0.5s" in result.output


async def test_background_processes_do_not_outlive_the_command(call: Call) -> None:
    background = marker()
    task = asyncio.ensure_future(call("bash", command=f"sleep {background} & sleep 0.3; echo started"))
    pids = await wait_running(background)
    result = await task
    assert result.output == "started\n[exit code: 0]"
    assert await wait_gone(pids)


async def test_cancellation_kills_the_process_group(root: Path, ctx: ToolContext, sandbox: Sandbox) -> None:
    tool = BashTool(Workspace(root), sandbox=sandbox)
    child, main = marker(), marker()
    command = f"sleep {child} & sleep {main}"
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command}))
    task = asyncio.create_task(tool.run(prepared, ctx))
    pids = await wait_running(child) + await wait_running(main)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_gone(pids)


def test_timeout_is_bounded(root: Path) -> None:
    from loopd.harness._errors import ToolArgumentsError

    tool = BashTool(Workspace(root))
    with pytest.raises(ToolArgumentsError, match="timeout"):
        tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": "true", "timeout": 3600}))
    with pytest.raises(ToolArgumentsError, match="blank"):
        tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": "   "}))


async def test_a_process_that_leaves_the_group_cannot_hang_the_call(
    root: Path, ctx: ToolContext, sandbox: Sandbox
) -> None:
    tool = BashTool(Workspace(root), drain_timeout=0.3, sandbox=sandbox)
    escaped = marker()
    command = (
        f"setsid bash -c 'echo $$ > escaped.pid; exec sleep {escaped}' & "
        "while [ ! -s escaped.pid ]; do sleep 0.01; done; echo done"
    )
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command}))
    try:
        async with asyncio.timeout(30):  # bounds a hang only: the 0.3 s drain ends the call
            result = await tool.run(prepared, ctx)
        if sandbox.name == "none":
            # Unconfined, a new session escapes the group: the call ends anyway and says so.
            assert result.output.startswith("done\n[exit code: 0]")
            assert "output may be incomplete" in result.output
        else:
            # The sandbox ends with its command, taking even a process in another session along.
            assert result.output == "done\n[exit code: 0]"
            assert await wait_gone(pids_running_now(escaped))
    finally:
        for pid in pids_running_now(escaped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
