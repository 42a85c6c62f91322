"""No check-then-open window: a directory swapped for a symlink *while* a file tool runs never leads outside.

A swapper thread renames a real directory and a symlink to an outside directory back and forth as fast as it
can while the tools run calls that were prepared (and approved) against the real directory. Every call either
works on the real directory or fails; none may read, list, search or write the outside one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from loopd.harness._errors import ToolError
from loopd.harness.core._values import ToolCall
from loopd.harness.tools._beneath import open_directory, walk
from loopd.harness.tools._protocol import PreparedCall, Tool, ToolContext, ToolResult
from loopd.harness.tools._workspace import Workspace, WorkspaceEscapeError

INSIDE = "inside-the-workspace"
OUTSIDE_TEXT = "top-secret-outside-the-workspace, also inside-the-workspace\n"


class Swapper:
    """Renames ``racedir`` (a real directory) and ``racelink`` (a symlink to outside) into each other's place.

    A write tool may create a new ``racedir`` while the real one is parked (it makes missing directories);
    such a stray directory is moved aside (``stray-N``) and the swapping goes on.
    """

    def __init__(self, root: Path, outside: Path) -> None:
        self.root = root
        self.real = root / "racedir"
        self.parked = root / "racedir.parked"
        self.link = root / "racelink"
        self.link.symlink_to(outside, target_is_directory=True)
        self.swaps = 0
        self.strays = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swapper", daemon=True)

    def _move(self, source: Path, target: Path) -> None:
        while True:
            try:
                os.rename(source, target)
                return
            except OSError as exc:
                if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                self.strays += 1
                os.rename(target, self.root / f"stray-{self.strays}")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._move(self.real, self.parked)  # the real directory steps aside
                self._move(self.link, self.real)  # the symlink to outside takes its name
                self._move(self.real, self.link)
                self._move(self.parked, self.real)
                self.swaps += 1
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Swapper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()
        assert self.error is None, self.error


@pytest.fixture
def racedir(root: Path, outside: Path) -> Path:
    directory = root / "racedir"
    (directory / "sub").mkdir(parents=True)
    (directory / "sub" / "secret.txt").write_text(INSIDE + "\n")
    (outside / "sub").mkdir()
    (outside / "sub" / "secret.txt").write_text(OUTSIDE_TEXT)
    return directory


async def _attempts(
    tool: Tool, arguments: dict[str, Any], ctx: ToolContext, tries: int, *, swapping: tuple[Path, Path]
) -> tuple[list[ToolResult], Swapper]:
    """Prepare the call while ``racedir`` is real (the gate approves it), then run it ``tries`` times while
    the swapper runs."""
    prepared = tool.prepare(ToolCall(id="c1", name=tool.spec.name, arguments=arguments))
    results = []
    with Swapper(*swapping) as swapper:
        for _ in range(tries):
            try:
                results.append(await tool.run(prepared, ctx))
            except ToolError:  # refused (WorkspaceEscapeError is one) or momentarily absent
                continue
    # Once the swapping stops the same call works: the refusals above were the race, not a broken setup.
    results.append(await tool.run(prepared, ctx))
    return results, swapper


async def test_read_file_never_reads_through_a_swapped_directory(
    tools: dict[str, Tool], ctx: ToolContext, secret: str, root: Path, outside: Path, racedir: Path
) -> None:
    results, swapper = await _attempts(
        tools["read_file"], {"path": "racedir/sub/secret.txt"}, ctx, 10_000, swapping=(root, outside)
    )
    assert swapper.swaps > 100, "the swapper barely ran: the race was not exercised"
    assert not [r for r in results if secret in r.output]
    assert INSIDE in results[-1].output


@pytest.mark.parametrize(
    ("tool", "arguments", "tries"),
    [
        ("list_dir", {"path": "racedir/sub"}, 2_000),
        ("glob", {"pattern": "racedir/**/*"}, 1_000),
        ("grep", {"pattern": "secret|inside", "path": "racedir"}, 200),
    ],
)
async def test_listing_and_searching_never_follow_a_swapped_directory(
    tools: dict[str, Tool],
    ctx: ToolContext,
    secret: str,
    root: Path,
    outside: Path,
    racedir: Path,
    tool: str,
    arguments: dict[str, Any],
    tries: int,
) -> None:
    (outside / "sub" / "only-outside.txt").write_text("x\n")
    results, swapper = await _attempts(tools[tool], arguments, ctx, tries, swapping=(root, outside))
    assert swapper.swaps > 10
    assert not [r.output for r in results if secret in r.output or "only-outside" in r.output]
    assert "secret.txt" in results[-1].output or INSIDE in results[-1].output


async def test_writes_never_land_in_a_swapped_directory(
    tools: dict[str, Tool], ctx: ToolContext, outside: Path, racedir: Path
) -> None:
    def prepared(tool: str, **arguments: Any) -> tuple[Tool, PreparedCall]:
        return tools[tool], tools[tool].prepare(ToolCall(id="c1", name=tool, arguments=arguments))

    path = "racedir/sub/secret.txt"
    calls = [
        prepared("write_file", path="racedir/sub/new.txt", content="written"),
        prepared("edit_file", path=path, old_string=INSIDE, new_string=INSIDE.upper()),
        prepared("edit_file", path=path, old_string=INSIDE.upper(), new_string=INSIDE),
    ]
    with Swapper(racedir.parent, outside) as swapper:
        for attempt in range(1_500):
            tool, call = calls[attempt % len(calls)]
            with contextlib.suppress(ToolError):
                await tool.run(call, ctx)
    assert swapper.swaps > 10
    assert sorted(p.name for p in (outside / "sub").iterdir()) == ["secret.txt"]
    assert (outside / "sub" / "secret.txt").read_text() == OUTSIDE_TEXT
    tool, call = calls[0]
    await tool.run(call, ctx)  # without the swapping the same write works
    assert (racedir / "sub" / "new.txt").read_text() == "written"


def test_open_directory_refuses_every_symlink_component(root: Path, outside: Path) -> None:
    (root / "a").mkdir()
    (root / "a" / "link").symlink_to(outside, target_is_directory=True)
    (root / "inner").symlink_to(root / "a", target_is_directory=True)
    workspace = Workspace(root)
    for relative in ("a/link", "inner", "inner/link"):
        with pytest.raises(WorkspaceEscapeError, match="symbolic link"), workspace.directory(relative):
            pass
    root_fd = workspace.open_root()
    try:
        with pytest.raises(OSError, match=r"symbolic link"):
            open_directory(root_fd, ("a", "link"))
        entries, stopped = walk(root_fd)
        assert (("a", "link"), "link") in entries and (("inner",), "link") in entries
        assert not stopped
        assert not [
            p for p, _ in entries if (p[0] == "inner" and len(p) > 1) or (p[:2] == ("a", "link") and len(p) > 2)
        ]
    finally:
        os.close(root_fd)


def test_workspace_directory_refuses_unnormalized_paths(workspace: Workspace) -> None:
    for relative in ("../outside", "/etc", "a//b", "./a"):
        with pytest.raises(WorkspaceEscapeError), workspace.directory(relative):
            pass
