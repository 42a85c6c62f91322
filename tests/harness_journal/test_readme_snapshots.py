"""The README's state-snapshot example runs as written (the block marked ``<!-- snapshot-example -->``)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_EXAMPLE = re.compile(r"<!-- snapshot-example -->\n```python\n(.*?)```", re.S)


def test_the_state_snapshot_example_runs() -> None:
    (code,) = _EXAMPLE.findall((ROOT / "README.md").read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    counts, same = out.getvalue().splitlines()
    found = re.fullmatch(r"snapshot at seq (\d+), then (\d+) records; full: (\d+)", counts)
    assert found is not None, counts
    at, tail, total = (int(g) for g in found.groups())
    assert 10 <= at <= total and at + tail == total
    assert same == "same state: True"
