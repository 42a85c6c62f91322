"""The README's example of modes, primers, model switching, drift and context measurement runs as written."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_modes_example_runs() -> None:
    (code,) = re.findall(r"<!-- modes-example -->\n```python\n(.*?)```", README.read_text(), re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert out.getvalue().splitlines() == [
        "small ['read_file', 'write_file'] Answer in English.",  # build mode, the primer applied
        "large ['read_file'] You are in plan mode: ex",  # plan mode: read-only tools, the other model
        "0.86",  # context_pressure: 860 of a 1000-token window
        "[('loop:main:model', 'small', 'medium')]",  # the refused restore says what changed
        "plan large 860",  # the adopted restore keeps the session's mode, model and measurement
    ]
