"""glob and grep: matching, caps, binary files, and patterns that never reach a shell."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.core._values import ToolCall
from loopd.harness.tools._protocol import PreparedCall, ToolContext, ToolResult
from loopd.harness.tools._search import GlobPattern, GrepTool
from loopd.harness.tools._workspace import Workspace, WorkspaceEscapeError

Prepare = Callable[..., PreparedCall]
Call = Callable[..., Awaitable[ToolResult]]

SHELL_PATTERNS = [
    "*.py; touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "*.py | touch pwned",
    "*.py && touch pwned",
    "x > pwned",
]


async def test_glob_matches_by_segment(call: Call) -> None:
    assert (await call("glob", pattern="**/*.py")).output == "src/main.py\nsrc/pkg/util.py"
    assert (await call("glob", pattern="*.py")).output == "no matches"
    assert (await call("glob", pattern="src/*")).output == "src/main.py\nsrc/pkg/"
    assert (await call("glob", pattern="*.py", path="src")).output == "src/main.py"
    assert (await call("glob", pattern="src/**")).output == "src/main.py\nsrc/pkg/\nsrc/pkg/util.py"
    assert (await call("glob", pattern="src/p?g/[tu]*.py")).output == "src/pkg/util.py"


def test_glob_pattern_matching() -> None:
    pattern = GlobPattern.parse("a/**/b/*.py")
    assert pattern.matches(("a", "b", "x.py"))
    assert pattern.matches(("a", "1", "2", "b", "x.py"))
    assert not pattern.matches(("a", "b", "c", "x.py"))
    assert not pattern.matches(("b", "x.py"))
    assert GlobPattern.parse("src/**/*.py").literal_prefix == ("src",)
    assert GlobPattern.parse("src/pkg/util.py").literal_prefix == ("src", "pkg")


@pytest.mark.parametrize("pattern", SHELL_PATTERNS)
async def test_shell_metacharacters_in_glob_patterns_are_literal(root: Path, call: Call, pattern: str) -> None:
    result = await call("glob", pattern=pattern)
    assert result.output == "no matches"
    assert not (root / "pwned").exists()


async def test_a_file_named_with_metacharacters_is_found_literally(root: Path, call: Call) -> None:
    (root / "a;b $(c).txt").write_text("odd name\n")
    assert (await call("glob", pattern="a;b $(c).txt")).output == "a;b $(c).txt"
    assert (await call("grep", pattern="odd", glob="*;b $(c)*")).output == "a;b $(c).txt:1: odd name"


@pytest.mark.parametrize("pattern", SHELL_PATTERNS)
async def test_shell_metacharacters_in_grep_are_plain_regex(root: Path, call: Call, pattern: str) -> None:
    result = await call("grep", pattern=pattern.replace("*", "x").replace("(", r"\(").replace(")", r"\)"))
    assert result.output.startswith("no matches")
    assert not (root / "pwned").exists()
    assert (await call("grep", pattern="hello", glob=pattern)).output == "no files to search"
    assert not (root / "pwned").exists()


@pytest.mark.parametrize("pattern", ["../*", "src/../../*", "/etc/*", "/**"])
@pytest.mark.parametrize("tool", ["glob", "grep"])
def test_escaping_patterns_are_refused(prepare: Prepare, tool: str, pattern: str) -> None:
    arguments = {"pattern": pattern} if tool == "glob" else {"pattern": "x", "glob": pattern}
    with pytest.raises(WorkspaceEscapeError):
        prepare(tool, **arguments)


async def test_glob_skips_git(root: Path, call: Call) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "config.py").write_text("")
    assert ".git" not in (await call("glob", pattern="**/*.py")).output


async def test_grep_finds_lines(call: Call) -> None:
    assert (await call("grep", pattern="hello")).output == "README.md:2: hello world\nsrc/main.py:2: print('hello')"
    assert (await call("grep", pattern="HELLO", ignore_case=True, glob="*.md")).output == "README.md:2: hello world"
    assert (await call("grep", pattern=r"return \d+", path="src")).output == "src/pkg/util.py:2:     return 42"
    assert (await call("grep", pattern="helper", path="src/pkg/util.py")).output == "src/pkg/util.py:1: def helper():"
    assert (await call("grep", pattern="nothing-like-this")).output == "no matches"


async def test_grep_caps_results_and_skips_binary(root: Path, call: Call) -> None:
    (root / "many.txt").write_text("match\n" * 50)
    (root / "blob.bin").write_bytes(b"match\x00match\n")
    result = await call("grep", pattern="match", max_results=5)
    lines = result.output.splitlines()
    assert lines[:5] == [f"many.txt:{i}: match" for i in range(1, 6)]
    assert "[stopped after 5 matches]" in lines
    assert "blob.bin" not in result.output


def test_grep_refuses_an_invalid_regex(prepare: Prepare) -> None:
    with pytest.raises(ToolArgumentsError, match="invalid regular expression"):
        prepare("grep", pattern="(unclosed")


async def test_grep_kills_a_catastrophic_regex(root: Path, ctx: ToolContext) -> None:
    (root / "evil.txt").write_text("a" * 40 + "!\n")
    tool = GrepTool(Workspace(root), timeout=0.5)
    prepared = tool.prepare(ToolCall(id="c1", name="grep", arguments={"pattern": "^(a+)+$"}))
    with pytest.raises(ToolError, match="timed out"):
        await tool.run(prepared, ctx)
