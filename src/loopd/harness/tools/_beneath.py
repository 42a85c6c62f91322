"""Opening paths beneath a directory descriptor without following symbolic links (openat-style). Stdlib only.

A path is opened one component at a time, each relative to its parent's descriptor with ``O_NOFOLLOW``
(``O_DIRECTORY`` for directories). Nothing is checked first and opened later, so a directory swapped for a
symlink at any moment cannot redirect an open: the open of that component fails instead (``ELOOP`` for a
symlink, ``ENOTDIR`` for a file). Callers pass paths that contain no symlink (the workspace resolves them when a call
is prepared) and treat such a failure as "the path changed".

The grep worker loads this file by path (it runs as ``python -I -S`` and cannot import loopd), so it must
import nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
"""What ``open`` with ``O_NOFOLLOW`` reports for a symlink (Linux and macOS: ELOOP; FreeBSD: EMLINK)."""


def split_relative(relative: str) -> tuple[str, ...]:
    """The components of a normalized relative POSIX path (``.`` is the empty tuple). Raises ValueError."""
    if relative in ("", "."):
        return ()
    parts = tuple(relative.split("/"))
    if relative.startswith("/") or any(part in ("", ".", "..") or "\x00" in part for part in parts):
        raise ValueError(f"not a normalized relative path: {relative!r}")
    return parts


def open_directory(root_fd: int, parts: tuple[str, ...], *, create: bool = False, mode: int = 0o777) -> int:
    """A new descriptor for the directory ``parts`` below ``root_fd``; no component may be a symlink.

    With ``create``, missing directories are made (each one then opened with ``O_NOFOLLOW`` like the rest).
    The caller closes the descriptor. Raises OSError (``ELOOP``/``EMLINK`` for a symlink component).
    """
    current = os.open(".", DIRECTORY_FLAGS, dir_fd=root_fd)
    try:
        for name in parts:
            try:
                child = _open_child(current, name)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made concurrently: the open below checks it
                    os.mkdir(name, mode, dir_fd=current)
                child = _open_child(current, name)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


def _open_child(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except NotADirectoryError:
        # Linux reports a symlink opened with O_DIRECTORY | O_NOFOLLOW as "not a directory": say what it is.
        try:
            is_link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            is_link = False
        if is_link:
            raise OSError(errno.ELOOP, f"{name} is a symbolic link; refusing to follow it") from None
        raise


def is_symlink_error(exc: OSError) -> bool:
    return exc.errno in SYMLINK_ERRNOS


def entry_kind(entry: os.DirEntry[str]) -> str:
    """``link``, ``dir``, ``file`` or ``other``, never following a symlink."""
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "other"


def walk(
    top_fd: int, *, max_depth: int | None = None, skip: frozenset[str] = frozenset(), limit: int | None = None
) -> tuple[list[tuple[tuple[str, ...], str]], bool]:
    """Every entry below the directory ``top_fd`` as (parts relative to it, `entry_kind`), top-down.

    Directories are entered by descriptor with ``O_NOFOLLOW``, never through a symlink; one that cannot be
    entered (swapped, removed, unreadable) is listed but not searched. Names in ``skip`` are neither listed
    nor entered. ``max_depth`` counts levels below the top (1: its own entries). Holds one descriptor per level.
    Returns the entries and whether the walk stopped early because ``limit`` entries were seen.
    """
    out: list[tuple[tuple[str, ...], str]] = []
    frames: list[tuple[int, tuple[str, ...], list[str]]] = []

    def visit(fd: int, rel: tuple[str, ...]) -> None:
        try:
            with os.scandir(fd) as it:
                listed = []
                for entry in it:
                    if entry.name in skip:
                        continue
                    try:
                        listed.append((entry.name, entry_kind(entry)))
                    except OSError:
                        continue  # vanished while listing
        except OSError:
            listed = []
        listed.sort()
        out.extend(((*rel, name), kind) for name, kind in listed)
        deeper = max_depth is None or len(rel) + 1 < max_depth
        subdirs = [name for name, kind in listed if kind == "dir"] if deeper else []
        frames.append((fd, rel, subdirs[::-1]))

    visit(os.open(".", DIRECTORY_FLAGS, dir_fd=top_fd), ())
    try:
        while frames:
            if limit is not None and len(out) >= limit:
                return out, True
            fd, rel, pending = frames[-1]
            if not pending:
                os.close(fd)
                frames.pop()
                continue
            name = pending.pop()
            try:
                child = os.open(name, DIRECTORY_FLAGS | os.O_NONBLOCK, dir_fd=fd)  # a symlink fails
            except OSError:
                continue
            visit(child, (*rel, name))
        return out, False
    finally:
        for fd, _, _ in frames:
            os.close(fd)
