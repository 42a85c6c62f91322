"""Files: private ones (what only the user running loopd may read: transcripts, databases, tokens) and atomic
replacement.

Owns: ``ensure_private_dir`` (0700), ``ensure_private_file`` (0600, and a SQLite file's ``-wal``/``-shm``/
``-journal`` companions) and ``write_atomically`` (replace a file's content all or nothing, durably).
Must not do: decide where loopd keeps its state (``loopd._paths`` does).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def ensure_private_dir(path: Path, *, tighten: bool = True) -> Path:
    """Create ``path`` (and any missing parents) with mode 0700; with ``tighten``, an existing ``path`` gets 0700 too.

    Parents that already exist keep their mode. Returns ``path``.
    """
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created meanwhile: tightened below when it is ``path``
            directory.mkdir(mode=PRIVATE_DIR_MODE)
    if tighten and path.stat().st_mode & 0o777 != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)
    return path


def ensure_private_file(path: Path) -> Path:
    """Create ``path`` empty with mode 0600 if it does not exist; tighten it to 0600 if it does. Returns ``path``.

    For SQLite files: a database file created this way makes SQLite create its ``-wal`` and ``-shm`` files with
    the same mode; existing ones are tightened here too.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o777 != PRIVATE_FILE_MODE:
            with contextlib.suppress(PermissionError):  # someone else's file: used as it is
                os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        side = path.with_name(path.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            if side.stat().st_mode & 0o777 != PRIVATE_FILE_MODE and side.stat().st_uid == os.getuid():
                os.chmod(side, PRIVATE_FILE_MODE)
    return path


def write_atomically(path: Path, payload: bytes) -> None:
    """Replace ``path``'s content with ``payload``, all or nothing: a temporary file in the same directory (0600),
    fsync, ``os.replace``, fsync of the directory. Raises ``OSError``; a failure before the replace leaves the old
    file as it was (and removes the temporary file)."""
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
