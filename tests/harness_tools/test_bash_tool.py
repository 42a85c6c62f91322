"""bash: exit codes, output cap, timeout and cancellation kill the process group, scrubbed environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from loopd.harness.core._values import ToolCall
from loopd.harness.tools._bash import BashTool, OutputCapture
from loopd.harness.tools._protocol import ToolContext, ToolResult
from loopd.harness.tools._workspace import Workspace

Call = Callable[..., Awaitable[ToolResult]]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists"; it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_dead(pid: int, timeout: float = 3.0) -> bool:
    async with asyncio.timeout(timeout):
        while alive(pid):
            await asyncio.sleep(0.02)
    return True


async def wait_for_file(path: Path, timeout: float = 5.0) -> str:
    async with asyncio.timeout(timeout):
        while not path.exists() or not path.read_text().strip():
            await asyncio.sleep(0.02)
    return path.read_text().strip()


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


async def test_extra_environment_is_explicit(root: Path, ctx: ToolContext) -> None:
    tool = BashTool(Workspace(root), env={"CI": "1"})
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": "echo $CI"}))
    assert (await tool.run(prepared, ctx)).output == "1\n[exit code: 0]"


async def test_output_is_capped_head_and_tail(root: Path, ctx: ToolContext) -> None:
    tool = BashTool(Workspace(root), output_limit=100)
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


async def test_timeout_kills_the_process_group(root: Path, ctx: ToolContext) -> None:
    tool = BashTool(Workspace(root), kill_grace=0.2)
    command = "sleep 30 & echo $! > child.pid; trap '' TERM; sleep 30"
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command, "timeout": 0.5}))
    result = await tool.run(prepared, ctx)
    assert result.is_error
    assert "timed out after 0.5s" in result.output
    child = int((root / "child.pid").read_text())
    assert await wait_dead(child)


async def test_background_processes_do_not_outlive_the_command(root: Path, call: Call) -> None:
    result = await call("bash", command="sleep 30 & echo $! > bg.pid; echo started")
    assert result.output == "started\n[exit code: 0]"
    assert await wait_dead(int((root / "bg.pid").read_text()))


async def test_cancellation_kills_the_process_group(root: Path, ctx: ToolContext) -> None:
    tool = BashTool(Workspace(root))
    command = "sleep 30 & echo $! > child.pid; sleep 30"
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command}))
    task = asyncio.create_task(tool.run(prepared, ctx))
    child = int(await wait_for_file(root / "child.pid"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(child)


def test_timeout_is_bounded(root: Path) -> None:
    from loopd.harness._errors import ToolArgumentsError

    tool = BashTool(Workspace(root))
    with pytest.raises(ToolArgumentsError, match="timeout"):
        tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": "true", "timeout": 3600}))
    with pytest.raises(ToolArgumentsError, match="blank"):
        tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": "   "}))


async def test_a_process_that_leaves_the_group_cannot_hang_the_call(root: Path, ctx: ToolContext) -> None:
    tool = BashTool(Workspace(root), drain_timeout=0.3)
    command = (
        "setsid bash -c 'echo $$ > escaped.pid; exec sleep 30' & "
        "while [ ! -s escaped.pid ]; do sleep 0.01; done; echo done"
    )
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command}))
    try:
        async with asyncio.timeout(5):
            result = await tool.run(prepared, ctx)
        assert result.output.startswith("done\n[exit code: 0]")
        assert "output may be incomplete" in result.output
    finally:
        pid = int(await wait_for_file(root / "escaped.pid"))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
