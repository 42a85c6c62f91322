"""`benchmarks.long_conversation`'s pure parts: the questions it sends and how it reads stored bytes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from benchmarks.long_conversation import largest_tables, question, stored_bytes


def test_questions_have_the_asked_size_and_are_told_apart() -> None:
    assert len(question(7, 600)) == 600 and question(7, 600).startswith("question 7: ")
    assert question(1, 600) != question(2, 600)


def test_stored_bytes_are_the_pages_in_use_of_every_database_below(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    for path, rows in ((tmp_path / "a.db", 10), (tmp_path / "harness" / "b.db", 2000)):
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE t (x TEXT)")
            conn.executemany("INSERT INTO t VALUES (?)", [("y" * 100,) for _ in range(rows)])
        conn.close()
    (tmp_path / "notes.db").write_text("not a database")
    biggest = largest_tables(tmp_path, top=1)
    assert biggest[0][:2] == ("harness/b.db", "t") and biggest[0][2] > 200_000
    assert stored_bytes(tmp_path) >= biggest[0][2] + 4096
