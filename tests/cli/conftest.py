"""Run the real `loopd` console script without a terminal and look at what a user sees on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.server_http.support import backend_fixture, clock, rig

LOOPD = Path(sys.executable).parent / "loopd"
TIMEOUT = 30.0

backend = backend_fixture("sqlite")

__all__ = ["LOOPD", "Result", "backend", "clock", "loopd", "rig"]


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """The non-empty lines of stderr."""
        return [line for line in self.stderr.splitlines() if line.strip()]

    def one_line_error(self, code: int) -> str:
        """Assert the run failed with ``code`` and exactly one line on stderr, no traceback; return that line."""
        assert self.code == code, f"exit {self.code}, wanted {code}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        assert "Traceback" not in self.stderr, self.stderr
        assert len(self.error_lines) == 1, f"not one line on stderr:\n{self.stderr}"
        return self.error_lines[0]


def child_env(data_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LOOPD_"))}
    env.update({"LOOPD_DATA_DIR": str(data_home), "LOOPD_MODEL": "demo", "COLUMNS": "80", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def loopd(args: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None, timeout: float = TIMEOUT) -> Result:
    """`loopd ARGS` with stdin /dev/null and stdout/stderr captured (pipes: not a terminal)."""
    done = subprocess.run(
        [str(LOOPD), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=dict(env),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)
