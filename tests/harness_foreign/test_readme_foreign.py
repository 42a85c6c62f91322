"""The README's foreign-loop example runs as written (the block marked ``<!-- foreign-example -->``)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_EXAMPLE = re.compile(r"<!-- foreign-example -->\n```python\n(.*?)```", re.S)


def test_the_foreign_loop_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example names the scripted CLI by its path in the repository
    (code,) = _EXAMPLE.findall((ROOT / "README.md").read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    hello, tool, bound, again = out.getvalue().splitlines()
    assert re.fullmatch(r"session (claude-\w+) resumed=False: hello", hello)
    assert tool == "Bash was denied: denied by the gate: tool 'Bash' is denied by configuration"
    assert hello.split()[1] == bound
    assert again == f"session {bound} resumed=True: still there?"
