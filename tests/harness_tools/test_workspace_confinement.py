"""Escape attempts: '..', absolute paths and symlinks to outside are refused by every file tool."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.tools._protocol import PreparedCall, Tool, ToolContext, ToolResult
from loopd.harness.tools._workspace import Workspace, WorkspaceEscapeError

Prepare = Callable[..., PreparedCall]
Call = Callable[..., Awaitable[ToolResult]]

PATH_TOOLS = [
    ("read_file", {}),
    ("write_file", {"content": "x"}),
    ("edit_file", {"old_string": "a", "new_string": "b"}),
    ("list_dir", {}),
    ("glob", {"pattern": "*"}),
    ("grep", {"pattern": "secret"}),
]


@pytest.mark.parametrize(("tool", "extra"), PATH_TOOLS)
@pytest.mark.parametrize("path", ["../outside/secret.txt", "src/../../outside", "..", "src/../README.md"])
def test_dotdot_is_refused(prepare: Prepare, tool: str, extra: dict[str, str], path: str) -> None:
    with pytest.raises(WorkspaceEscapeError, match=r"'\.\.' is not allowed"):
        prepare(tool, path=path, **extra)


@pytest.mark.parametrize(("tool", "extra"), PATH_TOOLS)
def test_absolute_paths_are_refused_even_inside(
    prepare: Prepare, root: Path, outside: Path, tool: str, extra: dict[str, str]
) -> None:
    for path in (str(outside / "secret.txt"), str(root / "README.md"), "/etc/passwd"):
        with pytest.raises(WorkspaceEscapeError, match="absolute"):
            prepare(tool, path=path, **extra)


@pytest.fixture
def links(root: Path, outside: Path) -> Path:
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    (root / "out_file.txt").symlink_to(outside / "secret.txt")
    (root / "dangling.txt").symlink_to(outside / "created-by-tool.txt")
    return root


@pytest.mark.usefixtures("links")
@pytest.mark.parametrize(("tool", "extra"), PATH_TOOLS)
@pytest.mark.parametrize("path", ["out_dir", "out_dir/secret.txt", "out_file.txt"])
def test_symlinks_to_outside_are_refused(prepare: Prepare, tool: str, extra: dict[str, str], path: str) -> None:
    with pytest.raises(WorkspaceEscapeError, match="outside the workspace"):
        prepare(tool, path=path, **extra)


@pytest.mark.usefixtures("links")
async def test_writing_through_a_dangling_symlink_to_outside_is_refused(prepare: Prepare, outside: Path) -> None:
    with pytest.raises(WorkspaceEscapeError):
        prepare("write_file", path="dangling.txt", content="pwned")
    assert not (outside / "created-by-tool.txt").exists()


@pytest.mark.usefixtures("links")
async def test_glob_pattern_through_a_symlink_to_outside_is_refused(prepare: Prepare) -> None:
    with pytest.raises(WorkspaceEscapeError):
        prepare("glob", pattern="out_dir/*.txt")


@pytest.mark.usefixtures("links")
async def test_searches_do_not_follow_symlinks(call: Call, secret: str) -> None:
    found = await call("glob", pattern="**/*")
    assert "secret.txt" not in found.output
    assert "out_dir" in found.output  # listed by name, not entered
    grepped = await call("grep", pattern="top-secret")
    assert secret not in grepped.output
    assert grepped.output.startswith("no matches")


@pytest.mark.usefixtures("links")
async def test_list_dir_marks_symlinks_without_following(call: Call) -> None:
    listing = await call("list_dir")
    assert "out_dir@" in listing.output.splitlines()
    assert "secret.txt" not in listing.output


async def test_symlink_inside_is_matched_by_its_real_path(root: Path, prepare: Prepare, call: Call) -> None:
    (root / "alias.md").symlink_to(root / "README.md")
    prepared = prepare("read_file", path="alias.md")
    assert prepared.arguments["path"] == "README.md"
    assert prepared.requirements[0].match == "README.md"
    assert (await call("read_file", path="alias.md")).output.startswith("# demo")


async def test_symlink_swapped_after_approval_is_refused(
    root: Path, outside: Path, prepare: Prepare, tools: dict[str, Tool], ctx: ToolContext, secret: str
) -> None:
    (root / "notes").mkdir()
    (root / "notes" / "a.txt").write_text("fine\n")
    prepared = prepare("read_file", path="notes/a.txt")
    # After the gate approved notes/a.txt, the directory becomes a symlink to outside.
    os.rename(root / "notes", root / "notes.bak")
    (root / "notes").symlink_to(outside, target_is_directory=True)
    (outside / "a.txt").write_text(secret)
    with pytest.raises(ToolArgumentsError):
        await tools["read_file"].run(prepared, ctx)


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_protected_directory_is_not_writable(prepare: Prepare, root: Path, tool: str) -> None:
    (root / ".loopd").mkdir()
    (root / ".loopd" / "gate-rules.json").write_text("{}")
    extra = {"content": "{}"} if tool == "write_file" else {"old_string": "{}", "new_string": "[]"}
    with pytest.raises(WorkspaceEscapeError, match="protected"):
        prepare(tool, path=".loopd/gate-rules.json", **extra)


async def test_protected_directory_is_readable(root: Path, call: Call) -> None:
    (root / ".loopd").mkdir()
    (root / ".loopd" / "notes.txt").write_text("visible\n")
    assert (await call("read_file", path=".loopd/notes.txt")).output == "visible\n"


def test_nul_bytes_and_empty_paths_are_refused(prepare: Prepare) -> None:
    with pytest.raises(WorkspaceEscapeError, match="NUL"):
        prepare("read_file", path="README.md\x00.txt")
    with pytest.raises(ToolArgumentsError, match="empty"):
        prepare("read_file", path="")


def test_workspace_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        Workspace(tmp_path / "file")


def test_workspace_root_is_resolved(tmp_path: Path, root: Path) -> None:
    (tmp_path / "ws-link").symlink_to(root, target_is_directory=True)
    workspace = Workspace(tmp_path / "ws-link")
    assert workspace.root == root.resolve()
    assert workspace.resolve("README.md").relative == "README.md"


async def test_escape_errors_are_tool_argument_errors() -> None:
    assert issubclass(WorkspaceEscapeError, ToolArgumentsError)
    assert issubclass(WorkspaceEscapeError, ToolError)
