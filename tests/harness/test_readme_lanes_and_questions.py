"""The README's background-lane and ask_user examples run as written (blocks marked ``<!-- harness-example -->``)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_EXAMPLE = re.compile(r"<!-- harness-example -->\n```python\n(.*?)```", re.S)


def _run(code: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    return out.getvalue().splitlines()


def test_the_lane_and_question_examples_run() -> None:
    lanes, questions = _EXAMPLE.findall(README.read_text())
    assert set(_run(lanes)) == {"hustle_started", "turn_done", "hustle_completed", "history_compacted"}
    assert _run(questions) == ["Which port? ('8080', '9090')", "['Which port?']", "Using it. (The user answered: 9090)"]
