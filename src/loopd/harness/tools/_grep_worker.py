"""Search files for a regular expression, in a child process (``python -I -S _grep_worker.py``).

Python regexes can backtrack catastrophically and a thread cannot be stopped, so grep runs here, where the
parent can kill it on timeout. Standard library only; reads a JSON request on stdin and writes a JSON reply
on stdout. The parent has already confined the file list to the workspace; files are opened with
``O_NOFOLLOW`` and only regular files are read.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from typing import Any

_BINARY_SNIFF_BYTES = 8192


def search(request: dict[str, Any]) -> dict[str, Any]:
    flags = re.IGNORECASE if request["ignore_case"] else 0
    regex = re.compile(request["pattern"], flags)
    max_results: int = request["max_results"]
    max_line: int = request["max_line_chars"]
    max_bytes: int = request["max_file_bytes"]
    matches: list[list[Any]] = []
    skipped_binary = 0
    skipped_large = 0
    truncated = False
    for index, path in enumerate(request["files"]):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
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
