"""read_file, write_file, edit_file and list_dir behaviour."""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.tools._protocol import PreparedCall, ToolResult

Prepare = Callable[..., PreparedCall]
Call = Callable[..., Awaitable[ToolResult]]


async def test_read_file_returns_the_text(call: Call) -> None:
    result = await call("read_file", path="src/main.py")
    assert result == ToolResult(output="import pkg\nprint('hello')\n")


async def test_read_file_pages_with_offset_and_limit(root: Path, call: Call) -> None:
    (root / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    result = await call("read_file", path="long.txt", offset=10, limit=3)
    assert result.output.startswith("line 10\nline 11\nline 12\n")
    assert "[lines 10-12 of 100; use offset/limit to read more]" in result.output
    with pytest.raises(ToolError, match="past the end"):
        await call("read_file", path="long.txt", offset=101)


async def test_read_file_refuses_binary_directories_and_fifos(root: Path, call: Call, prepare: Prepare) -> None:
    (root / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02")
    with pytest.raises(ToolError, match="binary"):
        await call("read_file", path="blob.bin")
    with pytest.raises(ToolError, match="directory"):
        await call("read_file", path="src")
    with pytest.raises(ToolArgumentsError, match="root"):
        prepare("read_file", path=".")
    os.mkfifo(root / "pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        await call("read_file", path="pipe")
    with pytest.raises(ToolError, match="no such file"):
        await call("read_file", path="missing.txt")


async def test_read_file_of_an_empty_file(root: Path, call: Call) -> None:
    (root / "empty").write_text("")
    assert (await call("read_file", path="empty")).output == "[empty is empty]"


def test_arguments_are_validated(prepare: Prepare) -> None:
    with pytest.raises(ToolArgumentsError, match="path: Field required"):
        prepare("read_file")
    with pytest.raises(ToolArgumentsError, match="offset"):
        prepare("read_file", path="README.md", offset=0)
    with pytest.raises(ToolArgumentsError, match="Extra inputs"):
        prepare("read_file", path="README.md", mode="rb")


async def test_write_file_creates_parents_and_overwrites(root: Path, call: Call) -> None:
    result = await call("write_file", path="docs/new/guide.md", content="# Guide\n")
    assert result.output == "wrote 8 bytes to docs/new/guide.md"
    assert (root / "docs" / "new" / "guide.md").read_text() == "# Guide\n"
    await call("write_file", path="docs/new/guide.md", content="v2\n")
    assert (root / "docs" / "new" / "guide.md").read_text() == "v2\n"
    assert [p.name for p in (root / "docs" / "new").iterdir()] == ["guide.md"]  # no temporary files left


async def test_write_file_keeps_the_mode_of_an_existing_file(root: Path, call: Call) -> None:
    script = root / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    await call("write_file", path="run.sh", content="#!/bin/sh\necho hi\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


async def test_write_file_through_an_inside_symlink_writes_the_target(root: Path, call: Call) -> None:
    (root / "alias.md").symlink_to(root / "README.md")
    await call("write_file", path="alias.md", content="replaced\n")
    assert (root / "README.md").read_text() == "replaced\n"
    assert (root / "alias.md").is_symlink()


def test_write_file_refuses_a_directory(prepare: Prepare) -> None:
    with pytest.raises(ToolArgumentsError, match="directory"):
        prepare("write_file", path="src", content="x")


async def test_edit_file_replaces_a_unique_match(root: Path, call: Call) -> None:
    result = await call("edit_file", path="src/pkg/util.py", old_string="return 42", new_string="return 43")
    assert result.output == "edited src/pkg/util.py (replacement starts at line 2)"
    assert (root / "src" / "pkg" / "util.py").read_text() == "def helper():\n    return 43\n"


async def test_edit_file_refuses_a_missing_match(root: Path, call: Call) -> None:
    with pytest.raises(ToolError, match="not found"):
        await call("edit_file", path="src/pkg/util.py", old_string="return  42", new_string="x")
    assert (root / "src" / "pkg" / "util.py").read_text() == "def helper():\n    return 42\n"


async def test_edit_file_refuses_an_ambiguous_match(root: Path, call: Call) -> None:
    target = root / "dup.txt"
    target.write_text("a = 1\nb = 1\n")
    with pytest.raises(ToolError, match="occurs 2 times"):
        await call("edit_file", path="dup.txt", old_string=" = 1", new_string=" = 2")
    assert target.read_text() == "a = 1\nb = 1\n"
    await call("edit_file", path="dup.txt", old_string="b = 1", new_string="b = 2")
    assert target.read_text() == "a = 1\nb = 2\n"


async def test_edit_file_matches_exactly(root: Path, call: Call) -> None:
    target = root / "crlf.txt"
    target.write_bytes(b"one\r\ntwo\r\n")
    with pytest.raises(ToolError, match="not found"):
        await call("edit_file", path="crlf.txt", old_string="one\ntwo", new_string="x")
    await call("edit_file", path="crlf.txt", old_string="one\r\ntwo", new_string="1\r\n2")
    assert target.read_bytes() == b"1\r\n2\r\n"


def test_edit_file_refuses_empty_and_identical_strings(prepare: Prepare) -> None:
    with pytest.raises(ToolArgumentsError, match="empty"):
        prepare("edit_file", path="README.md", old_string="", new_string="x")
    with pytest.raises(ToolArgumentsError, match="identical"):
        prepare("edit_file", path="README.md", old_string="x", new_string="x")


async def test_edit_file_of_a_missing_file(call: Call) -> None:
    with pytest.raises(ToolError, match="no such file"):
        await call("edit_file", path="nope.txt", old_string="a", new_string="b")


async def test_list_dir(root: Path, call: Call) -> None:
    (root / "src" / "link.py").symlink_to(root / "src" / "main.py")
    assert (await call("list_dir")).output == "README.md\nsrc/"
    assert (await call("list_dir", path="src")).output == "link.py@\nmain.py\npkg/"
    (root / "empty").mkdir()
    assert (await call("list_dir", path="empty")).output == "empty is empty"
    with pytest.raises(ToolError, match="not a directory"):
        await call("list_dir", path="README.md")
