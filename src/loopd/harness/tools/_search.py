"""Search tools: glob (find paths by pattern) and grep (find lines by regex), confined to the workspace.

Patterns never reach a shell: glob patterns are matched here segment by segment (``*``, ``?``, ``[…]`` within
a segment, ``**`` for any number of segments), so ``;``, ``$(…)`` or ``|`` are plain characters. Patterns may
not be absolute or contain ``..``. Walks never follow symlinks (a symlinked directory is listed, not entered;
grep skips symlinks) and skip ``.git``: the searched directory is opened beneath the workspace root component
by component with ``O_NOFOLLOW``, subdirectories are entered by descriptor (`_beneath.walk`), and the grep
worker opens each file beneath a descriptor of the root it inherits, so a directory swapped for a symlink
mid-search cannot lead outside. The gate sees the directory the search covers, as a tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final

from pydantic import Field

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.core import EffectKind, Idempotency
from loopd.harness.tools import _beneath, _grep_worker
from loopd.harness.tools._base import BuiltinTool, Plan, ToolArgs, run_blocking
from loopd.harness.tools._beneath import split_relative, walk
from loopd.harness.tools._processes import stop_group
from loopd.harness.tools._protocol import ToolContext, ToolResult
from loopd.harness.tools._requirements import read_file_requirement, read_tree_requirement
from loopd.harness.tools._workspace import Workspace, check_relative

MAX_GLOB_RESULTS: Final = 1000
MAX_WALK_ENTRIES: Final = 200_000
MAX_GREP_FILES: Final = 20_000
MAX_GREP_FILE_BYTES: Final = 4 * 1024 * 1024
MAX_LINE_CHARS: Final = 400
GREP_TIMEOUT: Final = 30.0
SKIPPED_DIRS: Final = frozenset({".git"})
_GLOB_CHARS: Final = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class GlobPattern:
    """A validated glob pattern, split into segments."""

    segments: tuple[str, ...]

    @classmethod
    def parse(cls, pattern: str) -> GlobPattern:
        check_relative(pattern, what="pattern")
        segments = tuple(s for s in pattern.split("/") if s not in ("", "."))
        if not segments:
            raise ToolArgumentsError("pattern must name something below the search directory")
        return cls(segments)

    @property
    def literal_prefix(self) -> tuple[str, ...]:
        """Leading segments without wildcards (never the last one): the search can start below them."""
        prefix: list[str] = []
        for segment in self.segments[:-1]:
            if any(c in _GLOB_CHARS for c in segment):
                break
            prefix.append(segment)
        return tuple(prefix)

    def below(self, count: int) -> GlobPattern:
        return GlobPattern(self.segments[count:])

    @property
    def max_depth(self) -> int | None:
        return None if "**" in self.segments else len(self.segments)

    def matches(self, parts: tuple[str, ...]) -> bool:
        """Whether a relative path (as parts) matches, ``**`` spanning zero or more parts."""
        segs = self.segments
        # reach[j]: the pattern prefix consumed so far can end right before parts[j].
        reach = [False] * (len(parts) + 1)
        reach[0] = True
        for seg in segs:
            nxt = [False] * (len(parts) + 1)
            if seg == "**":
                seen = False
                for j in range(len(parts) + 1):
                    seen = seen or reach[j]
                    nxt[j] = seen
            else:
                for j in range(len(parts)):
                    if reach[j] and fnmatch.fnmatchcase(parts[j], seg):
                        nxt[j + 1] = True
            reach = nxt
        return reach[len(parts)]


def _walk(
    workspace: Workspace, relative: str, *, max_depth: int | None
) -> tuple[list[tuple[tuple[str, ...], str]], bool]:
    """Entries below the directory ``relative`` as (parts relative to it, kind), never following a symlink.

    The directory is opened beneath the root component by component and the walk enters subdirectories by
    descriptor (`_beneath.walk`), so swapping a directory for a symlink mid-walk cannot lead it outside.
    Returns the entries and whether the walk stopped early at `MAX_WALK_ENTRIES`; an empty list if the
    directory does not exist or is not a directory.
    """
    try:
        with workspace.directory(relative) as dir_fd:
            return walk(dir_fd, max_depth=max_depth, skip=SKIPPED_DIRS, limit=MAX_WALK_ENTRIES)
    except (FileNotFoundError, NotADirectoryError):
        return [], False
    except OSError as exc:
        raise ToolError(f"cannot search {relative}: {exc.strerror or exc}") from exc


class GlobArgs(ToolArgs):
    pattern: str = Field(
        description="Glob relative to `path`: '*' and '?' within a name, '[abc]' classes, '**' for any depth "
        "(e.g. 'src/**/*.py')."
    )
    path: str = Field(default=".", description="Directory to search, relative to the workspace root.")


class GlobTool(BuiltinTool[GlobArgs]):
    name = "glob"
    description = (
        "Find files and directories in the workspace whose path matches a glob pattern. Returns paths relative "
        "to the workspace root, sorted; directories end with '/'."
    )
    args_model = GlobArgs
    effect_kind = EffectKind.READ
    idempotency_kind = Idempotency.INHERENT

    def _plan(self, args: GlobArgs) -> Plan[GlobArgs]:
        pattern = GlobPattern.parse(args.pattern)
        base = self.workspace.resolve(args.path)
        # Narrow the gate's view to the literal directories the pattern starts with.
        prefix = pattern.literal_prefix
        searched = self.workspace.resolve(str(PurePosixPath(base.relative, *prefix))) if prefix else base
        args = args.model_copy(update={"path": base.relative})
        requirement = read_tree_requirement(self._scope, searched.relative, verb="find files in")
        return Plan(args, (requirement,), f"glob {args.pattern!r} in {base.relative}")

    async def _run(self, args: GlobArgs, ctx: ToolContext) -> ToolResult:
        pattern = GlobPattern.parse(args.pattern)
        base = self.workspace.resolve(args.path)
        if base.relative != args.path:
            raise ToolError(f"{args.path} now resolves to {base.relative}; refusing a path that changed")
        prefix = pattern.literal_prefix
        start = self.workspace.resolve(str(PurePosixPath(base.relative, *prefix))) if prefix else base
        rest = pattern.below(len(prefix))

        def find() -> tuple[list[str], bool]:
            entries, stopped = _walk(self.workspace, start.relative, max_depth=rest.max_depth)
            found = []
            for parts, kind in entries:
                if rest.matches(parts):
                    found.append(PurePosixPath(start.relative, *parts).as_posix() + ("/" if kind == "dir" else ""))
            return sorted(found), stopped

        found, stopped = await run_blocking(find, what="glob")
        if not found:
            return ToolResult(output="no matches" + (" (search stopped early: too many entries)" if stopped else ""))
        output = "\n".join(found[:MAX_GLOB_RESULTS])
        if len(found) > MAX_GLOB_RESULTS:
            output += f"\n[{len(found) - MAX_GLOB_RESULTS} more matches not shown; narrow the pattern]"
        if stopped:
            output += f"\n[search stopped after {MAX_WALK_ENTRIES} entries; narrow the pattern or path]"
        return ToolResult(output=output)


class GrepArgs(ToolArgs):
    pattern: str = Field(min_length=1, max_length=2000, description="Python regular expression, matched per line.")
    path: str = Field(default=".", description="File or directory to search, relative to the workspace root.")
    glob: str | None = Field(
        default=None,
        description="Only search files matching this glob ('*.py' matches names; patterns with '/' match paths).",
    )
    ignore_case: bool = Field(default=False, description="Match case-insensitively.")
    max_results: int = Field(default=200, ge=1, le=1000, description="Stop after this many matching lines.")


class GrepTool(BuiltinTool[GrepArgs]):
    name = "grep"
    description = (
        "Search the contents of workspace files for a regular expression. Returns 'path:line: text' lines. "
        "Binary files, files over 4 MiB and symlinks are skipped."
    )
    args_model = GrepArgs
    effect_kind = EffectKind.READ
    idempotency_kind = Idempotency.INHERENT

    def __init__(self, workspace: Workspace, *, timeout: float = GREP_TIMEOUT) -> None:
        super().__init__(workspace)
        self._timeout = timeout

    def _plan(self, args: GrepArgs) -> Plan[GrepArgs]:
        try:
            re.compile(args.pattern, re.IGNORECASE if args.ignore_case else 0)
        except re.error as exc:
            raise ToolArgumentsError(f"invalid regular expression: {exc}") from exc
        if args.glob is not None:
            GlobPattern.parse(args.glob)
        base = self.workspace.resolve(args.path)
        args = args.model_copy(update={"path": base.relative})
        if base.real.is_file():
            requirement = read_file_requirement(self._scope, base.relative)
        else:
            requirement = read_tree_requirement(self._scope, base.relative, verb="search")
        return Plan(args, (requirement,), f"grep {args.pattern!r} in {base.relative}")

    async def _run(self, args: GrepArgs, ctx: ToolContext) -> ToolResult:
        base = self.workspace.resolve(args.path)
        if base.relative != args.path:
            raise ToolError(f"{args.path} now resolves to {base.relative}; refusing a path that changed")
        name_filter = GlobPattern.parse(args.glob) if args.glob is not None else None

        def collect() -> tuple[list[str], list[list[str]], bool]:
            base_parts = list(split_relative(base.relative))
            kind = self.workspace.kind(base.relative)
            if kind == "file":
                return [base.relative], [base_parts], False
            if kind is None:
                raise ToolError(f"no such file or directory: {args.path}")
            if kind != "dir":
                raise ToolError(f"{args.path} is not a regular file or a directory")
            entries, stopped = _walk(self.workspace, base.relative, max_depth=None)
            shown: list[str] = []
            files: list[list[str]] = []
            for parts, entry_kind in entries:
                if entry_kind != "file":
                    continue  # symlinks, devices, FIFOs and directories are not searched
                if name_filter is not None:
                    probe = parts if len(name_filter.segments) > 1 else parts[-1:]
                    if not name_filter.matches(probe):
                        continue
                shown.append(PurePosixPath(base.relative, *parts).as_posix())
                files.append([*base_parts, *parts])
                if len(files) >= MAX_GREP_FILES:
                    return shown, files, True
            return shown, files, stopped

        shown, files, stopped = await run_blocking(collect, what="grep")
        if not files:
            return ToolResult(output="no files to search")
        reply = await self._search(args, files)
        lines = [f"{shown[index]}:{lineno}: {text}" for index, lineno, text in reply["matches"]]
        output = "\n".join(lines) if lines else "no matches"
        notes = []
        if reply["truncated"]:
            notes.append(f"[stopped after {args.max_results} matches]")
        if stopped:
            notes.append("[not every file was searched: too many files; narrow path or glob]")
        if reply["skipped_binary"] or reply["skipped_large"]:
            notes.append(f"[skipped {reply['skipped_binary']} binary and {reply['skipped_large']} large files]")
        return ToolResult(output="\n".join([output, *notes]))

    async def _search(self, args: GrepArgs, files: list[list[str]]) -> dict[str, Any]:
        # The worker gets a descriptor of the workspace root and opens every file beneath it (no path strings
        # it could be redirected through).
        root_fd = self.workspace.open_root()
        try:
            request = {
                "pattern": args.pattern,
                "ignore_case": args.ignore_case,
                "max_results": args.max_results,
                "max_line_chars": MAX_LINE_CHARS,
                "max_file_bytes": MAX_GREP_FILE_BYTES,
                "root_fd": root_fd,
                "beneath": _beneath.__file__,
                "files": files,
            }
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                _grep_worker.__file__,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env={"LANG": "C.UTF-8"},
                pass_fds=(root_fd,),
            )
        finally:
            os.close(root_fd)
        try:
            async with asyncio.timeout(self._timeout):
                out, err = await process.communicate(json.dumps(request).encode())
        except TimeoutError as exc:
            raise ToolError(
                f"grep timed out after {self._timeout:g}s (a pattern with nested repetition can be very slow)"
            ) from exc
        finally:
            if process.returncode is None:
                await stop_group(process)
        if process.returncode != 0:
            detail = err.decode(errors="replace").strip().splitlines()
            raise ToolError(f"grep failed: {detail[-1] if detail else f'exit code {process.returncode}'}")
        with contextlib.suppress(ValueError):
            reply: dict[str, Any] = json.loads(out)
            return reply
        raise ToolError("grep returned an unreadable reply")
