"""Shared helpers: medians, tables (Rich on the terminal, optionally Markdown to a file), the machine description.

Setting ``LOOPD_BENCH_MARKDOWN=/path`` (``python -m benchmarks --markdown PATH`` does it) makes every table
printed by any benchmark module also be appended to that file as Markdown, so one run yields the tables that
docs/BENCHMARKS.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

MARKDOWN_ENV = "LOOPD_BENCH_MARKDOWN"
RESULTS_ENV = "LOOPD_BENCH_RESULTS"
"""When set (``python -m benchmarks --results`` sets it), every table is also appended to this JSON-lines file."""
MODULE_ENV = "LOOPD_BENCH_MODULE"
"""The benchmark module running now (recorded with each table in the results file)."""
DISTRIBUTIONS = (
    "pyloopd",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langchain-core",
    "aiosqlite",
    "openai-agents",
    "pyinstrument",
)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], note: str = "") -> None:
    table = Table(title=title, caption=note or None)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*(cell(v) for v in r))
    Console(width=160).print(table)
    target = os.environ.get(MARKDOWN_ENV)
    if target:
        append_markdown(Path(target), title, columns, rows, note)
    results = os.environ.get(RESULTS_ENV)
    if results:
        append_result(Path(results), title, columns, rows, note)


def append_result(
    path: Path, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], note: str = ""
) -> None:
    """One table as one JSON line: module, title, columns, raw rows (numbers unrounded), note."""
    record = {
        "module": os.environ.get(MODULE_ENV, ""),
        "title": title,
        "columns": list(columns),
        "rows": [[v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for v in r] for r in rows],
        "note": note,
    }
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")


def append_markdown(
    path: Path, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], note: str = ""
) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(markdown_table(title, columns, rows, note) + "\n\n")


def markdown_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], note: str = "") -> str:
    """One table as Markdown (a ``####`` heading, the table, the note): pure, so docs regenerate byte for byte."""

    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [f"#### {title}", "", "| " + " | ".join(esc(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines.extend("| " + " | ".join(esc(cell(v)) for v in r) + " |" for r in rows)
    if note:
        lines += ["", note]
    return "\n".join(lines)


class ChildFailed(RuntimeError):
    """A benchmark subprocess failed or printed no result."""


def run_child(module: str, args: Sequence[str], *, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` in a fresh interpreter and parse the JSON object on its last stdout line."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", module, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ChildFailed(f"{' '.join(command[2:])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if not isinstance(result, dict):
        raise ChildFailed(f"{module} printed {lines[-1][:200]!r}")
    return result


def version_of(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_rows() -> list[tuple[str, str]]:
    """The machine and the library versions, read now."""
    rows = [
        ("CPUs (os.cpu_count)", str(os.cpu_count())),
        ("CPU", cpu_model()),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("OS", platform.platform()),
        ("SQLite", sqlite3.sqlite_version),
        ("load average at start (1/5/15 min)", " / ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("scheduling policy (chrt)", scheduling_policy()),
    ]
    rows.extend((name, version_of(name)) for name in DISTRIBUTIONS)
    return rows


def scheduling_policy() -> str:
    """This process's scheduling policy: ``SCHED_OTHER`` as started, or e.g. ``SCHED_FIFO priority 10`` under
    ``chrt -f 10`` (which its child processes inherit: figures then suffer less from other load)."""
    try:
        policy = os.sched_getscheduler(0)
        priority = os.sched_getparam(0).sched_priority
    except (AttributeError, OSError):
        return "unknown"
    names = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}
    name = names.get(policy, str(policy))
    return f"{name} priority {priority}" if priority else name


def print_environment() -> None:
    print_table("environment", ["what", "value"], environment_rows())


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), e.g. "AMD EPYC" or "Intel(R) Xeon(R) Processor"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is too small: give at least {least}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a size, a count, repetitions), or a one-line usage error."""
    return _whole_number(text, 1)


def count_or_zero(text: str) -> int:
    """An argparse type: a whole number of at least 0 (where 0 skips something), or a one-line usage error."""
    return _whole_number(text, 0)


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a rate, seconds), or a one-line usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range: give a number above 0")
    return value


def seconds_or_zero(text: str) -> float:
    """An argparse type: a finite number of at least 0 (seconds, where 0 skips something), or a one-line usage
    error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range: give a number of at least 0")
    return value


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 (e.g. subscriber counts ``100,1000``)."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one number (comma-separated)")
    return values


def machine_pace(runs: int = 5) -> float:
    """Milliseconds this machine takes, now, for a fixed piece of plain Python (the best of ``runs``; lower is
    faster): calls, dict and list operations, string formatting, small objects — the kind of work a loopd server
    does between its I/O. Two VMs of one processor name can differ by ×4 in it, and `make bench-check` compares
    only results of about the same pace. Deterministic work, so it varies only with the machine and its load."""

    class Item:
        __slots__ = ("key", "value")

        def __init__(self, key: str, value: int) -> None:
            self.key, self.value = key, value

    def work() -> int:
        table: dict[str, Item] = {}
        total = 0
        for i in range(20_000):
            key = f"k{i % 997}:{i & 7}"
            item = table.get(key)
            if item is None:
                item = table[key] = Item(key, i)
            item.value += i
            total += len(key) + sum([item.value & 15, i % 13])
        return total + len(sorted(table, key=lambda k: table[k].value))

    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 3)


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")
