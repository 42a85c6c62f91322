"""Workspace confinement: turning a model-supplied path into a real path inside the workspace, or refusing.

The rules, in order:

- A path is relative to the workspace root. Absolute paths are refused even when they point inside the
  workspace: the model never needs to know where the workspace lives, and one form means one gate match.
- A ``..`` component is refused, even when the result would stay inside (there is always a shorter spelling).
- The path is resolved to its *real* path (every symlink followed); it must be the root or below it. A symlink
  whose target is outside is refused, including a dangling one (writing through it would create the target).
- Writes are refused at or below protected paths: ``.loopd`` (the workspace's gate rules), so a file tool
  can never grant itself permissions, and git's configuration — ``.git`` at any depth (nested repositories and
  submodules run their own config), ``.gitconfig`` and ``.config/git`` at the root (bash runs with HOME set to
  the workspace) — because git config names programs git runs (``core.fsmonitor``, hooks, diff drivers).
  Names are compared the way case-insensitive filesystems compare them (``.GIT``, ``.Git``, a name with
  Unicode characters HFS+ ignores, trailing dots or spaces NTFS drops), and after symlinks are resolved.

Resolution reads filesystem metadata but changes nothing. The relative real path it returns is what the gate
matches, so a symlink cannot dodge a deny rule by naming the same file differently. Tools re-resolve at run
time and refuse if the answer changed since the call was approved.

That re-check is a courtesy; the guarantee is how tools open paths at run time: `Workspace.directory` walks
the real relative path from a descriptor of the root one component at a time with ``O_NOFOLLOW``
(`_beneath`), and files are opened relative to that directory's descriptor, so a directory swapped for a
symlink between any check and the open makes the open fail instead of leaving the workspace.
"""

from __future__ import annotations

import contextlib
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from loopd.harness._errors import ToolArgumentsError
from loopd.harness.tools._beneath import is_symlink_error, open_directory, split_relative

MAX_PATH_CHARS: Final = 4096
DEFAULT_PROTECTED: Final = (".loopd", ".git", ".gitconfig", ".config/git")
"""Root-relative paths the file tools never write at or below."""
PROTECTED_NAMES: Final = (".git",)
"""Names the file tools never write at or below, at any depth."""

SWAPPED_FOR_SYMLINK: Final = "a part of it is now a symbolic link (the path changed since it was checked)"

# Code points HFS+ ignores when it compares names (as git's own ".git" check does).
_IGNORED_CODE_POINTS: Final = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)


def _folded(name: str) -> str:
    """A name as a case- and normalization-insensitive filesystem compares it."""
    name = unicodedata.normalize("NFC", name.translate(_IGNORED_CODE_POINTS)).casefold()
    return name.rstrip(". ") or name


class WorkspaceEscapeError(ToolArgumentsError):
    """A path or pattern would leave the workspace (absolute, ``..``, or a symlink pointing outside)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path!r} is refused: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ResolvedPath:
    """A path inside the workspace: the real absolute path and its POSIX form relative to the root."""

    real: Path
    relative: str

    @property
    def is_root(self) -> bool:
        return self.relative == "."


class Workspace:
    """The directory tools are confined to."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        protected: Iterable[str] = DEFAULT_PROTECTED,
        protected_names: Iterable[str] = PROTECTED_NAMES,
    ) -> None:
        real = Path(os.path.realpath(root))
        if not real.is_dir():
            raise NotADirectoryError(f"workspace root {str(root)!r} is not a directory")
        self._root = real
        self._protected = frozenset(tuple(_folded(p) for p in PurePosixPath(path).parts) for path in protected)
        self._protected_names = frozenset(_folded(name) for name in protected_names)

    @property
    def root(self) -> Path:
        return self._root

    def __repr__(self) -> str:
        return f"Workspace({str(self._root)!r})"

    def resolve(self, path: str, *, for_write: bool = False) -> ResolvedPath:
        """Resolve a model-supplied path; raise `WorkspaceEscapeError` (a `ToolArgumentsError`) to refuse it."""
        check_relative(path, what="path")
        try:
            real = Path(os.path.realpath(self._root / path))
        except (OSError, RuntimeError, ValueError) as exc:
            raise WorkspaceEscapeError(path, f"cannot be resolved ({exc})") from exc
        relative = self.relative_to_root(real)
        if relative is None:
            raise WorkspaceEscapeError(path, "it resolves outside the workspace (through a symlink)")
        if for_write:
            self.check_writable(relative, shown=path)
        return ResolvedPath(real=real, relative=relative)

    def check_writable(self, relative: str, *, shown: str | None = None) -> None:
        """Raise `WorkspaceEscapeError` if ``relative`` (a real path relative to the root) is protected."""
        protected = self.protected_prefix(relative)
        if protected is not None:
            raise WorkspaceEscapeError(shown or relative, f"{protected} is protected from the file tools")

    def open_directory(self, relative: str, *, create: bool = False) -> int:
        """A new descriptor of the directory ``relative`` (a real path relative to the root); the caller closes it.

        No component is followed if it is a symlink: that raises `WorkspaceEscapeError` ("the path changed").
        With ``create``, missing directories are made. Other failures raise `OSError` (``FileNotFoundError``,
        ``NotADirectoryError`` …) for the caller to word.
        """
        try:
            parts = split_relative(relative)
        except ValueError as exc:
            raise WorkspaceEscapeError(relative, str(exc)) from exc
        root_fd = self.open_root()
        try:
            return open_directory(root_fd, parts, create=create)
        except OSError as exc:
            if is_symlink_error(exc):
                raise WorkspaceEscapeError(relative, SWAPPED_FOR_SYMLINK) from exc
            raise
        finally:
            os.close(root_fd)

    @contextlib.contextmanager
    def directory(self, relative: str, *, create: bool = False) -> Iterator[int]:
        """`open_directory` for the duration of a ``with`` block."""
        fd = self.open_directory(relative, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def kind(self, relative: str) -> str | None:
        """What is at ``relative`` (``dir``, ``file``, ``link`` or ``other``), following no symlink on the way;
        None if nothing is. Raises `WorkspaceEscapeError` if a directory on the way is a symlink."""
        try:
            parts = split_relative(relative)
        except ValueError as exc:
            raise WorkspaceEscapeError(relative, str(exc)) from exc
        if not parts:
            return "dir"
        try:
            with self.directory("/".join(parts[:-1]) or ".") as dir_fd:
                mode = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(mode):
            return "link"
        if stat.S_ISDIR(mode):
            return "dir"
        return "file" if stat.S_ISREG(mode) else "other"

    def open_root(self) -> int:
        """A new descriptor of the workspace root (the caller closes it)."""
        return os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def relative_to_root(self, real: Path) -> str | None:
        """The POSIX path of ``real`` relative to the root, or None if it is not the root or below it."""
        if real == self._root:
            return "."
        try:
            return real.relative_to(self._root).as_posix()
        except ValueError:
            return None

    def contains(self, real: Path) -> bool:
        return self.relative_to_root(real) is not None

    def is_protected(self, relative: str) -> bool:
        return self.protected_prefix(relative) is not None

    def protected_prefix(self, relative: str) -> str | None:
        """The protected path ``relative`` is at or below (as spelled in ``relative``), or None."""
        parts = PurePosixPath(relative).parts if relative != "." else ()
        folded = tuple(_folded(part) for part in parts)
        for index, name in enumerate(folded):
            if name in self._protected_names:
                return "/".join(parts[: index + 1])
        for prefix in self._protected:
            if folded[: len(prefix)] == prefix:
                return "/".join(parts[: len(prefix)])
        return None


def check_relative(text: str, *, what: str) -> None:
    """Refuse empty text, NUL bytes, absolute paths and ``..`` components (for paths and glob patterns)."""
    if not text:
        raise ToolArgumentsError(f"{what} must not be empty")
    if len(text) > MAX_PATH_CHARS:
        raise ToolArgumentsError(f"{what} is longer than {MAX_PATH_CHARS} characters")
    if "\x00" in text:
        raise WorkspaceEscapeError(text, f"{what} contains a NUL byte")
    if text.startswith("/") or PurePosixPath(text).is_absolute():
        raise WorkspaceEscapeError(text, f"absolute {what}s are not accepted; use a path relative to the workspace")
    if ".." in PurePosixPath(text).parts:
        raise WorkspaceEscapeError(text, f"'..' is not allowed in a {what}")
