"""One process per data directory: an exclusive, non-blocking ``flock`` on a lock file inside it.

Shared by `loopd up` (the whole data directory) and `loopd harness serve` (its harness data directory). The lock
is held by an open descriptor, so it goes away with the process however it ends (kill -9 included); the file
itself stays and records the holder's pid for the error message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from loopd._infra.errors import LoopdError

_MAX_PID_BYTES: Final = 64


class DataDirBusyError(LoopdError, RuntimeError):
    """Another process already holds the lock of this data directory."""

    def __init__(self, data_dir: Path, holder: str, pid: int | None) -> None:
        by = f"another {holder}" + (f" (pid {pid})" if pid is not None else "")
        super().__init__(f"{data_dir} is in use by {by}")
        self.data_dir = data_dir
        self.holder = holder
        self.pid = pid


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, _MAX_PID_BYTES, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextlib.contextmanager
def data_dir_lock(data_dir: Path, lock_name: str, *, holder: str) -> Iterator[None]:
    """Hold ``data_dir/lock_name`` exclusively for the block; `DataDirBusyError` at once when another process does.

    ``holder`` names the kind of process in the error ("loopd up", "loopd harness serve").
    """
    path = data_dir / lock_name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DataDirBusyError(data_dir, holder, _read_pid(fd)) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


__all__ = ["DataDirBusyError", "data_dir_lock"]
