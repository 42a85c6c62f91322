"""What one chat writes to PostgreSQL, and what a replica on PostgreSQL carries: `loopd server --database`.

A throwaway PostgreSQL (started from the installed binaries, as the tests do) and one `loopd server` on it (the
embedded Tasks live in PostgreSQL too). Chats go to the built-in harness (``harness:assistant``, the demo model: a
short streamed answer) in series: one at a time, ``--concurrent`` at once, then ``--burst`` at once (rounds of that
many chats until ``--chats``). Before and after each series the benchmark reads ``pg_stat_database`` (committed
transactions, rows inserted / updated / deleted) and ``pg_current_wal_lsn()``; the table shows the differences per
chat — counts, which do not depend on the machine's speed or load. Beside them, what the series took: chats per
second over its rounds' wall time, and the CPU per chat of the ``loopd server`` process and of PostgreSQL (the
postmaster and its backends) from the series' start until both are idle. The throwaway server runs without fsync
(``fsync=off``, ``synchronous_commit=off``): that changes time, not counts, and leaves PostgreSQL's CPU per chat a
floor. The figures feed docs/SCALING.md.

python -m benchmarks.pg_writes [--chats 100] [--concurrent 10] [--burst 100] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from benchmarks._server import ServerProcess, running_server, tree_cpu_seconds
from benchmarks.server_chats import run_chats, settle

ROOT: Final = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Counters:
    commits: int
    inserted: int
    updated: int
    deleted: int
    wal_bytes: int

    def minus(self, other: Counters) -> Counters:
        return Counters(
            self.commits - other.commits,
            self.inserted - other.inserted,
            self.updated - other.updated,
            self.deleted - other.deleted,
            self.wal_bytes - other.wal_bytes,
        )


def read_counters(dsn: str) -> Counters:
    """The database's counters now (statistics are flushed first, so they include every committed transaction)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint FROM pg_stat_database WHERE datname = "
            "current_database()"
        ).fetchone()
    assert row is not None
    return Counters(*(int(value) for value in row))


@dataclass(frozen=True)
class Series:
    """One series of chats: the counters' differences, the chats completed, the rounds' wall time, and CPU seconds
    of the server and of PostgreSQL."""

    delta: Counters
    ok: int
    wall: float
    server_cpu: float
    postgres_cpu: float


def postmaster_pid(data_dir: Path) -> int:
    """The pid of the PostgreSQL server on ``data_dir`` (the first line of its ``postmaster.pid``)."""
    return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


async def _series(server: ServerProcess, dsn: str, postgres: int, chats: int, at_once: int, label: str) -> Series:
    await settle([server.pid, postgres])
    before = await asyncio.to_thread(read_counters, dsn)
    cpu = tree_cpu_seconds(server.pid), tree_cpu_seconds(postgres)
    ok, wall = 0, 0.0
    for start in range(0, chats, at_once):
        run = await run_chats(server, min(at_once, chats - start), f"{label}-{start}")
        ok += run.ok
        wall += run.wall
    await settle([server.pid, postgres])  # their trailing work (titles, cleanups, autovacuum) counts too
    server_cpu, postgres_cpu = tree_cpu_seconds(server.pid) - cpu[0], tree_cpu_seconds(postgres) - cpu[1]
    after = await asyncio.to_thread(read_counters, dsn)
    return Series(after.minus(before), ok, wall, server_cpu, postgres_cpu)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=positive_int, default=100, help="chats per series")
    parser.add_argument("--concurrent", type=positive_int, default=10, help="chats at once in the second series")
    parser.add_argument("--burst", type=positive_int, default=100, help="chats at once in the third series")
    parser.add_argument("--repeat", type=positive_int, default=1, help="ignored: counts do not vary between runs")
    parser.add_argument("--quick", action="store_true", help="10 chats per series")
    args = parser.parse_args(argv)
    chats = 10 if args.quick else max(1, args.chats)
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import find_postgres_bin, start_postgres  # the tests' throwaway server

    if find_postgres_bin() is None:
        raise SystemExit("PostgreSQL binaries (initdb, pg_ctl, postgres) are not installed")
    postgres = start_postgres()
    rows: list[tuple[object, ...]] = []
    try:
        dsn = postgres.create_database()
        with (
            tempfile.TemporaryDirectory(prefix="loopd-bench-pg-") as directory,
            running_server(Path(directory), extra_args=["--database", dsn], command_name="server") as server,
        ):

            async def run() -> None:
                await run_chats(server, 3, "warm-up")
                postgres_pid = postmaster_pid(postgres.data_dir)
                for at_once in dict.fromkeys(min(size, chats) for size in (1, args.concurrent, args.burst)):
                    got = await _series(server, dsn, postgres_pid, chats, at_once, f"c{at_once}")
                    delta = got.delta
                    rows.append(
                        (
                            at_once,
                            f"{got.ok}/{chats}",
                            round(delta.commits / chats, 1),
                            round(delta.inserted / chats, 1),
                            round(delta.updated / chats, 1),
                            round(delta.deleted / chats, 1),
                            round(delta.wal_bytes / chats / 1024, 1),
                            round(got.ok / got.wall, 1) if got.wall > 0 else None,
                            round(got.server_cpu * 1000 / chats, 2),
                            round(got.postgres_cpu * 1000 / chats, 2),
                        )
                    )

            asyncio.run(run())
    finally:
        postgres.stop()
    print_table(
        f"PostgreSQL writes per chat (loopd server --database, built-in harness, demo model), {chats} chats per series",
        [
            "chats at once",
            "completed",
            "commits",
            "rows inserted",
            "rows updated",
            "rows deleted",
            "WAL KiB",
            "chats/s",
            "server CPU ms/chat",
            "PostgreSQL CPU ms/chat",
        ],
        rows,
        note="Differences of pg_stat_database and pg_current_wal_lsn() over the series, divided by the chats; "
        "every read of the series (the streams, the watch of Tasks) is included in the commits. chats/s: the "
        "completed chats over the rounds' wall time. CPU: user + system of the loopd server process and of "
        "PostgreSQL's processes from the series' start until both are idle, per chat (clock ticks). PostgreSQL runs "
        "without fsync (fsync=off, synchronous_commit=off): counts are unaffected, its CPU is a floor.",
    )


if __name__ == "__main__":
    run_main(main)
