"""File tools: read_file, write_file, edit_file, list_dir — confined to the workspace.

Each re-resolves its path at run time and refuses if the real path changed since `prepare` (a symlink swapped
in after approval). Then it opens the path without a check-then-open window: the directory is opened beneath
the workspace root one component at a time with ``O_NOFOLLOW`` (`Workspace.directory`) and the file relative
to that descriptor, again with ``O_NOFOLLOW``, so a directory swapped for a symlink at any moment makes the call
fail rather than read or write outside. Reads accept regular files only (a FIFO would hang). Writes go to a
temporary file in the same directory descriptor, are fsynced and renamed over the target within it
(``os.replace`` with ``src_dir_fd``/``dst_dir_fd``), so a crash never leaves half a file; writes are
serialized per tool set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Final

from pydantic import Field

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.core import EffectKind, Idempotency
from loopd.harness.tools._base import BuiltinTool, Plan, ToolArgs, run_blocking, truncate_middle
from loopd.harness.tools._beneath import READ_FLAGS, is_symlink_error
from loopd.harness.tools._protocol import ToolContext, ToolResult
from loopd.harness.tools._requirements import (
    list_dir_requirement,
    read_file_requirement,
    write_file_requirement,
)
from loopd.harness.tools._workspace import SWAPPED_FOR_SYMLINK, ResolvedPath, Workspace, WorkspaceEscapeError

MAX_READ_BYTES: Final = 8 * 1024 * 1024
MAX_OUTPUT_CHARS: Final = 100_000
MAX_WRITE_CHARS: Final = 5_000_000
MAX_LIST_ENTRIES: Final = 1000
_BINARY_SNIFF_BYTES: Final = 8192
_NEW_FILE_MODE: Final = 0o644


def _rerun_check(workspace: Workspace, relative: str, *, for_write: bool = False) -> ResolvedPath:
    resolved = workspace.resolve(relative, for_write=for_write)
    if resolved.relative != relative:
        raise ToolError(f"{relative} now resolves to {resolved.relative}; refusing a path that changed")
    return resolved


def _parent_and_name(relative: str) -> tuple[str, str]:
    path = PurePosixPath(relative)
    return path.parent.as_posix(), path.name


@contextlib.contextmanager
def _parent_directory(workspace: Workspace, relative: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """The descriptor of ``relative``'s directory (opened beneath the root, no symlink followed) and its name."""
    parent, name = _parent_and_name(relative)
    try:
        dir_fd = workspace.open_directory(parent, create=create)
    except FileNotFoundError as exc:
        raise ToolError(f"no such file: {relative} (its directory does not exist)") from exc
    except NotADirectoryError as exc:
        raise ToolError(f"cannot open {relative}: a part of its path is not a directory") from exc
    try:
        yield dir_fd, name
    finally:
        os.close(dir_fd)


def _read_regular(dir_fd: int, name: str, relative: str, limit: int) -> bytes:
    """Read at most ``limit`` + 1 bytes of the regular file ``name`` in ``dir_fd``, never through a symlink."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise ToolError(f"no such file: {relative}") from exc
    except OSError as exc:
        if is_symlink_error(exc):
            raise WorkspaceEscapeError(relative, SWAPPED_FOR_SYMLINK) from exc
        raise ToolError(f"cannot open {relative}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{relative} is a directory; use list_dir")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{relative} is not a regular file")
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_atomically(dir_fd: int, name: str, relative: str, data: bytes) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data``: a temporary file in the same directory, fsynced, renamed
    over the target within the directory descriptor. Keeps an existing file's permissions."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        mode = _NEW_FILE_MODE
    else:
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{relative} is a directory")
        mode = stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else _NEW_FILE_MODE
    tmp_name = f".{name[:100]}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        # Renaming replaces whatever is at ``name`` now (a symlink swapped in is replaced, not followed).
        os.replace(tmp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # some filesystems refuse to fsync a directory
        os.fsync(dir_fd)


def _decode_text(data: bytes, name: str) -> str:
    if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        raise ToolError(f"{name} looks like a binary file")
    return data.decode("utf-8", errors="replace")


class ReadFileArgs(ToolArgs):
    path: str = Field(description="File path relative to the workspace root.")
    offset: int = Field(default=1, ge=1, description="First line to return (1-based).")
    limit: int = Field(default=2000, ge=1, le=10_000, description="Maximum number of lines to return.")


class ReadFileTool(BuiltinTool[ReadFileArgs]):
    name = "read_file"
    description = (
        "Read a UTF-8 text file in the workspace. Returns up to `limit` lines starting at line `offset`; "
        "a note at the end says when more lines exist."
    )
    args_model = ReadFileArgs
    effect_kind = EffectKind.READ
    idempotency_kind = Idempotency.INHERENT

    def _plan(self, args: ReadFileArgs) -> Plan[ReadFileArgs]:
        resolved = self.workspace.resolve(args.path)
        if resolved.is_root:
            raise ToolArgumentsError("path names the workspace root, which is a directory; use list_dir")
        args = args.model_copy(update={"path": resolved.relative})
        return Plan(args, (read_file_requirement(self._scope, resolved.relative),), f"read {resolved.relative}")

    async def _run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        _rerun_check(self.workspace, args.path)

        def read() -> bytes:
            with _parent_directory(self.workspace, args.path) as (dir_fd, name):
                return _read_regular(dir_fd, name, args.path, MAX_READ_BYTES)

        data = await run_blocking(read, what="read_file")
        cut = len(data) > MAX_READ_BYTES
        text = _decode_text(data[:MAX_READ_BYTES], args.path)
        lines = text.splitlines(keepends=True)
        if not lines:
            return ToolResult(output=f"[{args.path} is empty]")
        start = args.offset - 1
        if start >= len(lines):
            raise ToolError(f"offset {args.offset} is past the end of {args.path} ({len(lines)} lines)")
        shown = lines[start : start + args.limit]
        output = truncate_middle("".join(shown), MAX_OUTPUT_CHARS)
        end = start + len(shown)
        notes = []
        if start > 0 or end < len(lines):
            notes.append(f"[lines {start + 1}-{end} of {len(lines)}; use offset/limit to read more]")
        if cut:
            notes.append(f"[only the first {MAX_READ_BYTES} bytes of the file were read]")
        if notes:
            output = output + ("" if output.endswith("\n") or not output else "\n") + "\n".join(notes)
        return ToolResult(output=output)


class WriteFileArgs(ToolArgs):
    path: str = Field(description="File path relative to the workspace root; parent directories are created.")
    content: str = Field(max_length=MAX_WRITE_CHARS, description="The complete new content of the file.")


class WriteFileTool(BuiltinTool[WriteFileArgs]):
    name = "write_file"
    description = "Create or overwrite a file in the workspace with the given content (UTF-8)."
    args_model = WriteFileArgs
    effect_kind = EffectKind.WRITE
    # Writing the same content again leaves the same file.
    idempotency_kind = Idempotency.INHERENT

    def __init__(self, workspace: Workspace, *, write_lock: asyncio.Lock | None = None) -> None:
        super().__init__(workspace)
        self._lock = write_lock or asyncio.Lock()

    def _plan(self, args: WriteFileArgs) -> Plan[WriteFileArgs]:
        resolved = self.workspace.resolve(args.path, for_write=True)
        if resolved.is_root or resolved.real.is_dir():
            raise ToolArgumentsError(f"{args.path} is a directory")
        args = args.model_copy(update={"path": resolved.relative})
        summary = f"write {resolved.relative} ({len(args.content)} characters)"
        return Plan(args, (write_file_requirement(self._scope, resolved.relative),), summary)

    async def _run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        _rerun_check(self.workspace, args.path, for_write=True)
        data = args.content.encode("utf-8")

        def write() -> None:
            # Missing directories are made one at a time, each opened with O_NOFOLLOW like the rest.
            with _parent_directory(self.workspace, args.path, create=True) as (dir_fd, name):
                _write_atomically(dir_fd, name, args.path, data)

        async with self._lock:
            try:
                await run_blocking(write, what="write_file")
            except OSError as exc:
                raise ToolError(f"cannot write {args.path}: {exc.strerror or exc}") from exc
        return ToolResult(output=f"wrote {len(data)} bytes to {args.path}")


class EditFileArgs(ToolArgs):
    path: str = Field(description="File path relative to the workspace root.")
    old_string: str = Field(description="Exact text to replace; it must occur exactly once in the file.")
    new_string: str = Field(max_length=MAX_WRITE_CHARS, description="The replacement text.")


class EditFileTool(BuiltinTool[EditFileArgs]):
    name = "edit_file"
    description = (
        "Replace one exact occurrence of `old_string` with `new_string` in a workspace file. `old_string` must "
        "match the file byte for byte (whitespace included) and occur exactly once; add surrounding lines "
        "to make it unique."
    )
    args_model = EditFileArgs
    effect_kind = EffectKind.WRITE
    idempotency_kind = Idempotency.NONE

    def __init__(self, workspace: Workspace, *, write_lock: asyncio.Lock | None = None) -> None:
        super().__init__(workspace)
        self._lock = write_lock or asyncio.Lock()

    def _plan(self, args: EditFileArgs) -> Plan[EditFileArgs]:
        if not args.old_string:
            raise ToolArgumentsError("old_string must not be empty")
        if args.old_string == args.new_string:
            raise ToolArgumentsError("old_string and new_string are identical; nothing would change")
        resolved = self.workspace.resolve(args.path, for_write=True)
        if resolved.is_root:
            raise ToolArgumentsError("path names the workspace root, which is a directory")
        args = args.model_copy(update={"path": resolved.relative})
        # Editing needs to read the file too, but writing is the permission that matters.
        return Plan(args, (write_file_requirement(self._scope, resolved.relative),), f"edit {resolved.relative}")

    async def _run(self, args: EditFileArgs, ctx: ToolContext) -> ToolResult:
        _rerun_check(self.workspace, args.path, for_write=True)

        def edit() -> int:
            with _parent_directory(self.workspace, args.path) as (dir_fd, name):
                return edit_in(dir_fd, name)

        def edit_in(dir_fd: int, name: str) -> int:
            data = _read_regular(dir_fd, name, args.path, MAX_READ_BYTES)
            if len(data) > MAX_READ_BYTES:
                raise ToolError(f"{args.path} is larger than {MAX_READ_BYTES} bytes")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ToolError(f"{args.path} is not UTF-8 text") from exc
            count = text.count(args.old_string)
            if count == 0:
                raise ToolError(f"old_string was not found in {args.path}")
            if count > 1:
                raise ToolError(
                    f"old_string occurs {count} times in {args.path}; include more surrounding text to make it unique"
                )
            _write_atomically(
                dir_fd, name, args.path, text.replace(args.old_string, args.new_string, 1).encode("utf-8")
            )
            return text[: text.index(args.old_string)].count("\n") + 1

        async with self._lock:
            try:
                line = await run_blocking(edit, what="edit_file")
            except OSError as exc:
                raise ToolError(f"cannot edit {args.path}: {exc.strerror or exc}") from exc
        return ToolResult(output=f"edited {args.path} (replacement starts at line {line})")


class ListDirArgs(ToolArgs):
    path: str = Field(default=".", description="Directory relative to the workspace root.")


class ListDirTool(BuiltinTool[ListDirArgs]):
    name = "list_dir"
    description = (
        "List a workspace directory (not recursive). Directories end with '/', symlinks with '@'. "
        "Use glob to find files recursively."
    )
    args_model = ListDirArgs
    effect_kind = EffectKind.READ
    idempotency_kind = Idempotency.INHERENT

    def _plan(self, args: ListDirArgs) -> Plan[ListDirArgs]:
        resolved = self.workspace.resolve(args.path)
        args = args.model_copy(update={"path": resolved.relative})
        return Plan(args, (list_dir_requirement(self._scope, resolved.relative),), f"list {resolved.relative}")

    async def _run(self, args: ListDirArgs, ctx: ToolContext) -> ToolResult:
        _rerun_check(self.workspace, args.path)

        def listing() -> list[str]:
            entries: list[str] = []
            with self.workspace.directory(args.path) as dir_fd, os.scandir(dir_fd) as it:
                for entry in it:
                    if entry.is_symlink():
                        entries.append(entry.name + "@")
                    elif entry.is_dir(follow_symlinks=False):
                        entries.append(entry.name + "/")
                    else:
                        entries.append(entry.name)
            return sorted(entries)

        try:
            entries = await run_blocking(listing, what="list_dir")
        except NotADirectoryError as exc:
            raise ToolError(f"{args.path} is not a directory") from exc
        except FileNotFoundError as exc:
            raise ToolError(f"no such directory: {args.path}") from exc
        except OSError as exc:
            raise ToolError(f"cannot list {args.path}: {exc.strerror or exc}") from exc
        if not entries:
            return ToolResult(output=f"{args.path} is empty")
        shown = entries[:MAX_LIST_ENTRIES]
        output = "\n".join(shown)
        if len(entries) > len(shown):
            output += f"\n[{len(entries) - len(shown)} more entries not shown]"
        return ToolResult(output=output)
