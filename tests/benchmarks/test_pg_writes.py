"""`python -m benchmarks pg_writes`: per series of chats on a PostgreSQL-backed `loopd server`, the writes per chat
(counts) beside what the series took (chats/s, the server's and PostgreSQL's CPU per chat) — docs/SCALING.md's
source for a replica on PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.availability import missing
from tests.support.postgres import find_postgres_bin

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_each_series_reports_its_writes_its_rate_and_both_cpus(tmp_path: Path) -> None:
    if find_postgres_bin() is None:
        missing("PostgreSQL binaries (initdb, pg_ctl, postgres) are not installed")
    out = tmp_path / "pg.json"
    command = [sys.executable, "-m", "benchmarks", "--results", "--out", str(out), "pg_writes"]
    done = subprocess.run(
        [*command, "--chats", "4", "--concurrent", "2", "--burst", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (table,) = [t for t in json.loads(out.read_text())["tables"] if t["module"] == "pg_writes"]
    columns = table["columns"]
    assert columns[-3:] == ["chats/s", "server CPU ms/chat", "PostgreSQL CPU ms/chat"]
    rows = [dict(zip(columns, row, strict=True)) for row in table["rows"]]
    assert [row["chats at once"] for row in rows] == [1, 2, 4]
    for row in rows:
        assert row["completed"] == "4/4"
        assert row["commits"] > 0 and row["rows inserted"] > 0 and row["WAL KiB"] > 0
        assert row["chats/s"] > 0
        assert row["server CPU ms/chat"] > 0 and row["PostgreSQL CPU ms/chat"] >= 0
