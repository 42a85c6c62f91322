"""Shared helpers: repeated runs, medians, a Rich table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*(f"{v:,.3f}" if isinstance(v, float) else str(v) for v in r))
    Console().print(table)
