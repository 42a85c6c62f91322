"""Search files for a regular expression, in a child process (``python -I -S _grep_worker.py``).

Python regexes can backtrack catastrophically and a thread cannot be stopped, so grep runs here, where the
parent can kill it on timeout. Standard library only; reads a JSON request on stdin and writes a JSON reply
on stdout. The parent has already confined the file list to the workspace and passes it as path components
relative to the workspace root, whose descriptor (``root_fd``) this process inherits. Each file is opened
beneath that descriptor one component at a time with ``O_NOFOLLOW`` (the parent's `_beneath` module, loaded
by path: ``-I`` keeps loopd off ``sys.path``), and only regular files are read — a directory swapped for a
symlink after the parent listed it makes that file unreadable, not a way outside.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
import sys
from types import ModuleType
from typing import Any

_BINARY_SNIFF_BYTES = 8192


def _load_beneath(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_loopd_beneath", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Opener:
    """Opens files beneath the root, keeping the descriptor of the last directory (files arrive grouped)."""

    def __init__(self, beneath: ModuleType, root_fd: int) -> None:
        self._beneath = beneath
        self._root_fd = root_fd
        self._dir: tuple[str, ...] | None = None
        self._dir_fd = -1

    def open(self, parts: list[str]) -> int:
        directory = tuple(parts[:-1])
        if directory != self._dir:
            self.close()
            self._dir_fd = self._beneath.open_directory(self._root_fd, directory)
            self._dir = directory
        fd: int = os.open(parts[-1], self._beneath.READ_FLAGS, dir_fd=self._dir_fd)
        return fd

    def close(self) -> None:
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
        self._dir, self._dir_fd = None, -1


def search(request: dict[str, Any]) -> dict[str, Any]:
    flags = re.IGNORECASE if request["ignore_case"] else 0
    regex = re.compile(request["pattern"], flags)
    max_results: int = request["max_results"]
    max_line: int = request["max_line_chars"]
    max_bytes: int = request["max_file_bytes"]
    opener = _Opener(_load_beneath(request["beneath"]), request["root_fd"])
    matches: list[list[Any]] = []
    skipped_binary = 0
    skipped_large = 0
    truncated = False
    try:
        for index, parts in enumerate(request["files"]):
            try:
                fd = opener.open(parts)
            except OSError:
                opener.close()
                continue
            with os.fdopen(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    continue
                if info.st_size > max_bytes:
                    skipped_large += 1
                    continue
                data = f.read(max_bytes + 1)
            if b"\x00" in data[:_BINARY_SNIFF_BYTES]:
                skipped_binary += 1
                continue
            for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                if regex.search(line):
                    matches.append([index, lineno, line[:max_line]])
                    if len(matches) >= max_results:
                        truncated = True
                        break
            if truncated:
                break
    finally:
        opener.close()
    return {
        "matches": matches,
        "truncated": truncated,
        "skipped_binary": skipped_binary,
        "skipped_large": skipped_large,
    }


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    json.dump(search(request), sys.stdout)


if __name__ == "__main__":
    main()
