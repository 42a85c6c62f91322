"""The README's harness example runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_runs() -> None:
    text = README.read_text()
    block = re.search(r"<!-- readme-example: start -->\n```python\n(.*?)```", text, re.S)
    assert block is not None, "README lost its example"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 40
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("turn_started")
    assert "turn_done" in lines[-2]
    assert lines[-1] == "The tool said pong."
