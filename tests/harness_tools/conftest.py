"""Fixtures for the built-in and MCP tool tests: a workspace next to an "outside" directory with a secret."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from loopd.harness.core._values import ToolCall
from loopd.harness.tools._builtins import default_tools
from loopd.harness.tools._protocol import PreparedCall, Tool, ToolContext, ToolResult
from loopd.harness.tools._workspace import Workspace

SECRET = "top-secret-outside-the-workspace"


@pytest.fixture
def secret() -> str:
    return SECRET


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text(SECRET + "\n")
    return directory


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    directory = tmp_path / "ws"
    (directory / "src" / "pkg").mkdir(parents=True)
    (directory / "src" / "main.py").write_text("import pkg\nprint('hello')\n")
    (directory / "src" / "pkg" / "util.py").write_text("def helper():\n    return 42\n")
    (directory / "README.md").write_text("# demo\nhello world\n")
    return directory


@pytest.fixture
def workspace(root: Path) -> Workspace:
    return Workspace(root)


@pytest.fixture
def tools(workspace: Workspace) -> dict[str, Tool]:
    return {tool.spec.name: tool for tool in default_tools(workspace)}


@pytest.fixture
def ctx(root: Path) -> ToolContext:
    return ToolContext(session_id="s1", loop="main", call_id="c1", workspace=root)


Prepare = Callable[..., PreparedCall]
Call = Callable[..., Awaitable[ToolResult]]


@pytest.fixture
def prepare(tools: dict[str, Tool]) -> Prepare:
    def _prepare(name: str, **arguments: Any) -> PreparedCall:
        return tools[name].prepare(ToolCall(id="c1", name=name, arguments=arguments))

    return _prepare


@pytest.fixture
def call(tools: dict[str, Tool], prepare: Prepare, ctx: ToolContext) -> Call:
    async def _call(name: str, **arguments: Any) -> ToolResult:
        return await tools[name].run(prepare(name, **arguments), ctx)

    return _call
