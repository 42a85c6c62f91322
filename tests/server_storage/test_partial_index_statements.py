"""No statement binds a value where a partial index's condition compares a column with a constant.

SQLite matches ``purpose = ?`` against a partial index ``WHERE purpose = 'response'`` by looking at the value bound
to ``?``, and so prepares the statement again each time it runs with another binding: ≈ 4× the cost of the lookup
itself (measured on ``messages``). Such a column is compared with a literal in the SQL text instead (one statement
per value, each prepared once). This test reads the partial indexes of the migrated schema and every SQL string in
``src/loopd``, and names any WHERE clause that binds one of their columns.
"""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import loopd
from loopd.server.storage import open_database

SOURCE = Path(loopd.__file__).parent
_CONSTANT_TERM = re.compile(r"\b(\w+)\s*(?:=|<>|!=|<=|>=|<|>)\s*'")


async def _partial_index_columns(path: Path) -> dict[str, set[str]]:
    """Column -> the partial indexes whose condition compares it with a constant."""
    async with open_database(path):
        pass
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql LIKE '% WHERE %'")
        found: dict[str, set[str]] = {}
        for name, sql in rows:
            condition = str(sql).split(" WHERE ", 1)[1]
            for column in _CONSTANT_TERM.findall(condition):
                found.setdefault(column, set()).add(str(name))
    return found


def _bound(columns: set[str] | dict[str, set[str]]) -> re.Pattern[str]:
    """A WHERE-clause term that compares one of ``columns`` with a bound value (``?``)."""
    names = "|".join(map(re.escape, sorted(columns)))
    return re.compile(r"\b(" + names + r")\s*(?:=|<>|!=|<=|>=|<|>|\bIN\s*\()\s*\?")


def _sql_strings() -> list[tuple[Path, int, str]]:
    """Every string constant (and the text of every f-string) in the package that holds a WHERE clause."""
    found: list[tuple[Path, int, str]] = []
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(str(part.value) if isinstance(part, ast.Constant) else "{}" for part in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if " WHERE " in text:
                found.append((path, node.lineno, text))
    return found


async def test_no_where_clause_binds_a_column_a_partial_index_compares_with_a_constant(tmp_path: Path) -> None:
    columns = await _partial_index_columns(tmp_path / "loopd.db")
    assert "purpose" in columns  # there is something to look for (messages_open_by_responder)
    bound = _bound(columns)
    offenders = [
        f"{path.relative_to(SOURCE.parent)}:{line}: {match.group(1)} bound in {text.split(' WHERE ', 1)[1][:80]!r}"
        for path, line, text in _sql_strings()
        for match in bound.finditer(text.split(" WHERE ", 1)[1])
    ]
    assert offenders == [], "\n".join(dict.fromkeys(offenders))  # an f-string's text is also its parts' text


def test_the_scan_finds_a_bound_column() -> None:
    """The pattern of the test above names the statement this module was written for."""
    bound = _bound({"purpose"})
    text = "SELECT id FROM messages WHERE task_id = ? AND purpose = ? ORDER BY id LIMIT ?"
    assert [m.group(1) for m in bound.finditer(text.split(" WHERE ", 1)[1])] == ["purpose"]
    assert not list(bound.finditer("task_id = ? AND purpose = 'response'"))
    assert [m.group(1) for m in bound.finditer("a = 1 AND purpose IN (?, ?)")] == ["purpose"]
