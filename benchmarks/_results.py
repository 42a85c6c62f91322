"""Results files (``benchmarks/results/<date>-<sha>.json``, written by ``python -m benchmarks --results``) compared.

A table of one file is matched with the table of the other file that has the same module and title; a row with the
row whose labels are equal — the shortest run of leading cells that tells a table's rows apart ("chats"; "API" and
"at once"; "round") — and every numeric cell after the labels then gives one change.
Pure: reading files is the caller's business.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "compare", "format_changes"]


@dataclass(frozen=True)
class Change:
    """One figure in both files: where it is, its two values, and the change from ``before`` to ``after``."""

    module: str
    title: str
    row: str
    column: str
    before: float
    after: float

    @property
    def ratio(self) -> float | None:
        """after / before (None when before is 0)."""
        return None if self.before == 0 else self.after / self.before

    @property
    def percent(self) -> float | None:
        ratio = self.ratio
        return None if ratio is None else (ratio - 1.0) * 100.0


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.replace(",", "").strip()
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _label_width(*tables: Sequence[Sequence[Any]]) -> int:
    """How many leading cells label a row: the fewest that tell every row of each table apart (at least one)."""
    width = max((len(row) for rows in tables for row in rows), default=1)
    for count in range(1, width + 1):
        if all(len({tuple(str(c) for c in row[:count]) for row in rows}) == len(rows) for rows in tables):
            return count
    return width


def _tables(document: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    tables: dict[tuple[str, str], Mapping[str, Any]] = {}
    for table in document.get("tables") or ():
        if table.get("title") == "environment":
            continue
        tables.setdefault((str(table.get("module", "")), str(table.get("title", ""))), table)
    return tables


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """Every figure present in both results documents, in the order of ``after``'s tables and rows."""
    old = _tables(before)
    changes: list[Change] = []
    for key, table in _tables(after).items():
        previous = old.get(key)
        if previous is None or list(previous.get("columns") or ()) != list(table.get("columns") or ()):
            continue
        columns = [str(c) for c in table.get("columns") or ()]
        rows_after = [list(r) for r in table.get("rows") or ()]
        rows_before = [list(r) for r in previous.get("rows") or ()]
        labels = _label_width(rows_after, rows_before)
        earlier = {tuple(str(c) for c in r[:labels]): r for r in rows_before}
        for row in rows_after:
            match = earlier.get(tuple(str(c) for c in row[:labels]))
            if match is None:
                continue
            label = " / ".join(str(c) for c in row[:labels])
            for index in range(labels, min(len(row), len(match), len(columns))):
                a, b = _number(match[index]), _number(row[index])
                if a is None or b is None:
                    continue
                changes.append(Change(key[0], key[1], label, columns[index], a, b))
    return changes


def format_changes(changes: Iterable[Change]) -> list[tuple[str, str, str, str, str, str]]:
    """Rows for a table: module, row, column, before, after, change."""
    rows: list[tuple[str, str, str, str, str, str]] = []
    for change in changes:
        percent = change.percent
        delta = "n/a" if percent is None else f"{percent:+.1f} %"
        rows.append((change.module, change.row, change.column, f"{change.before:,.3f}", f"{change.after:,.3f}", delta))
    return rows
