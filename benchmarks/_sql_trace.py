"""Every SQLite statement a `loopd up` runs for a round of chats, counted per chat: where a chat's writes go.

python -m benchmarks._sql_trace [--chats 10] [--top 40] [--log FILE]

The server runs as `benchmarks.server_chats` runs it (the demo model), with a ``sitecustomize`` module on its path
that gives every ``sqlite3`` connection it opens a trace callback writing each statement SQLite runs (with
``BEGIN``/``COMMIT``, on whichever thread) to a log. After a warm-up round of 3 chats and a pause, one round of
``--chats`` concurrent chats runs and the server settles (2 s); the statements logged meanwhile are counted per
chat: per database file (statements, transactions begun), and per statement shape (literals replaced by ``?`` and
``N``), most frequent first. Background work that runs in the window (lease renewals, sweeps) is counted too, so
use rounds of 10 or more chats. ``--log FILE`` keeps the raw log (database#connection, thread, statement per line).
Counts, not time: what a change that removes a statement or a transaction saves per chat.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from benchmarks._server import running_server
from benchmarks.server_chats import run_chats

TRACE_ENV = "LOOPD_BENCH_SQL_TRACE"
SETTLE = 2.0
SITECUSTOMIZE = f'''"""Written by benchmarks._sql_trace: every sqlite3 connection traced to ${TRACE_ENV}."""
import os
import sqlite3
import threading

_path = os.environ.get("{TRACE_ENV}")
if _path:
    _log = open(_path, "a", buffering=1, encoding="utf-8")
    _connect = sqlite3.connect
    _count = [0]

    def _traced(*args, **kwargs):
        conn = _connect(*args, **kwargs)
        _count[0] += 1
        name = "%s#%d" % (os.path.basename(str(args[0] if args else kwargs.get("database"))), _count[0])

        def trace(sql, name=name):
            _log.write("%s\\t%s\\t%s\\n" % (name, threading.current_thread().name, " ".join(sql.split())))

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = _traced
'''
_STRING = re.compile(r"'(?:[^']|'')*'")
_BLOB = re.compile(r"\bx\?")
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")


@dataclass(frozen=True)
class Traced:
    """One logged statement: its database file, the connection's number in the process, its thread and SQL."""

    database: str
    connection: int
    thread: str
    sql: str


def parse_log(lines: Iterable[str]) -> list[Traced]:
    """The statements of a trace log (lines that are not three tab-separated fields are skipped)."""
    out: list[Traced] = []
    for line in lines:
        parts = line.rstrip("\n").split("\t", 2)
        if len(parts) != 3:
            continue
        name, thread, sql = parts
        database, _, number = name.rpartition("#")
        if not database or not number.isdigit():
            continue
        out.append(Traced(database, int(number), thread, sql))
    return out


def shape(sql: str) -> str:
    """A statement with its literals replaced: strings and blobs by ``?``, numbers by ``N``."""
    return _NUMBER.sub("N", _BLOB.sub("?", _STRING.sub("?", sql)))


def is_begin(sql: str) -> bool:
    return sql.upper().startswith("BEGIN")


@dataclass(frozen=True)
class Counts:
    per_database: list[tuple[str, float, float]]
    """(database file, statements per chat, transactions begun per chat), most statements first."""
    per_shape: list[tuple[float, str, str]]
    """(per chat, database file, statement shape), most frequent first."""
    total: float
    """Statements per chat, every database."""


def count(statements: Sequence[Traced], chats: int) -> Counts:
    by_database: Counter[str] = Counter()
    begins: Counter[str] = Counter()
    shapes: Counter[tuple[str, str]] = Counter()
    for s in statements:
        by_database[s.database] += 1
        begins[s.database] += is_begin(s.sql)
        shapes[(s.database, shape(s.sql))] += 1
    per_database = [(db, n / chats, begins[db] / chats) for db, n in by_database.most_common()]
    per_shape = [(n / chats, db, sql) for (db, sql), n in shapes.most_common()]
    return Counts(per_database, per_shape, len(statements) / chats)


def trace_round(chats: int, log: Path) -> list[Traced]:
    """Run a warm-up and a round of ``chats`` on a traced `loopd up`; the statements of the round (and its settling)."""
    with tempfile.TemporaryDirectory(prefix="loopd-sql-trace-") as directory:
        site = Path(directory) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        env = {"PYTHONPATH": str(site), TRACE_ENV: str(log)}
        with running_server(Path(directory), env=env) as server:
            asyncio.run(run_chats(server, 3, "warm"))
            time.sleep(SETTLE)
            start = log.stat().st_size if log.exists() else 0
            asyncio.run(run_chats(server, chats, "traced"))
            time.sleep(SETTLE)
            with log.open("rb") as f:
                f.seek(start)
                window = f.read().decode("utf-8", errors="replace")
    return parse_log(window.splitlines())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=positive_int, default=10, help="concurrent chats in the traced round")
    parser.add_argument("--top", type=positive_int, default=40, help="statement shapes listed")
    parser.add_argument("--log", type=Path, default=None, help="keep the raw trace log here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="loopd-sql-log-") as keep:
        log = args.log or Path(keep) / "trace.log"
        if log.exists():
            log.unlink()
        statements = trace_round(args.chats, log)
    counts = count(statements, args.chats)
    print_table(
        f"Statements per chat ({args.chats} chats)",
        ["database", "statements/chat", "transactions/chat"],
        [(db, f"{n:.1f}", f"{t:.1f}") for db, n, t in counts.per_database],
        note=f"{counts.total:.1f} statements per chat in all, BEGIN and COMMIT included.",
    )
    print_table(
        f"The {args.top} most frequent statement shapes, per chat",
        ["per chat", "database", "statement"],
        [(f"{n:.1f}", db, sql[:110]) for n, db, sql in counts.per_shape[: args.top]],
    )


if __name__ == "__main__":
    run_main(main)
