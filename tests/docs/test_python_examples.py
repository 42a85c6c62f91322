"""Python examples in the docs marked ``<!-- testing-example -->`` run as written (in a fresh namespace each)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.docs._doctest import DOC_FILES, ROOT

_EXAMPLE = re.compile(r"<!-- testing-example -->\n```python\n(.*?)```", re.S)


def _examples() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in DOC_FILES:
        text = path.read_text()
        for match in _EXAMPLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append((f"{path.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def test_the_docs_have_cassette_examples() -> None:
    assert {where.split(":")[0] for where, _ in _examples()} >= {"README.md", "docs/testing.md"}


@pytest.mark.parametrize(("where", "code"), _examples(), ids=[where for where, _ in _examples()])
def test_the_example_runs(where: str, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPD_MODEL_CASSETTE_MODE", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {"__name__": "docs_example"})
    lines = out.getvalue().splitlines()
    assert lines, f"{where} printed nothing"
    assert lines[0] == lines[1], f"{where}: the replay differs from the recording: {lines}"
