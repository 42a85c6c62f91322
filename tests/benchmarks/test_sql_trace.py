"""`python -m benchmarks._sql_trace`: the statements of a real `loopd up` per chat — the log's parsing, the shapes,
the counts, and one small real run that sees a chat's own writes in each database."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks._sql_trace import Traced, count, parse_log, shape

from benchmarks import _sql_trace


def test_a_log_line_is_database_connection_thread_and_statement_and_others_are_skipped() -> None:
    lines = [
        "loopd.db#3\tMainThread\tBEGIN IMMEDIATE\n",
        "journal.db#12\tloopd-journal-w\tINSERT INTO journal_records (sid) VALUES (4)\n",
        "not a trace line\n",
        "nameless\tMainThread\tSELECT 1\n",
    ]
    assert parse_log(lines) == [
        Traced("loopd.db", 3, "MainThread", "BEGIN IMMEDIATE"),
        Traced("journal.db", 12, "loopd-journal-w", "INSERT INTO journal_records (sid) VALUES (4)"),
    ]


def test_a_shape_hides_strings_blobs_and_numbers_but_keeps_names() -> None:
    sql = "INSERT INTO t2 (a, b, c) VALUES ('it''s', x'00ff', 12.5) RETURNING id"
    assert shape(sql) == "INSERT INTO t2 (a, b, c) VALUES (?, ?, N) RETURNING id"
    assert shape("SELECT 1 FROM m WHERE id = 'a' AND seq > 3") == shape("SELECT 7 FROM m WHERE id = 'b' AND seq > 9")


def test_counts_are_per_chat_by_database_and_by_shape() -> None:
    log = [Traced("a.db", 1, "t", s) for s in ("BEGIN IMMEDIATE", "UPDATE x SET n = 1", "UPDATE x SET n = 2", "COMMIT")]
    log.append(Traced("b.db", 2, "t", "SELECT 1"))
    counts = count(log, chats=2)
    assert counts.total == 2.5
    assert counts.per_database == [("a.db", 2.0, 0.5), ("b.db", 0.5, 0.0)]
    assert counts.per_shape[0] == (1.0, "a.db", "UPDATE x SET n = N")


def test_a_real_round_sees_each_chat_write_its_question_its_task_and_its_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "trace.log"
    _sql_trace.main(["--chats", "2", "--top", "200", "--log", str(log)])
    out = capsys.readouterr().out
    assert "statements/chat" in out and "transactions/chat" in out and "statements per chat in all" in out
    statements = parse_log(log.read_text().splitlines())
    databases = {s.database for s in statements}
    assert {"loopd.db", "resources.db", "journal.db"} <= databases
    counts = count(statements, 1)
    shapes = {sql for _, _, sql in counts.per_shape}
    assert any(s.startswith("INSERT INTO messages ") for s in shapes)  # the question and its response
    assert any(s.startswith("INSERT INTO journal_records ") for s in shapes)  # the harness call's journal
    assert any(s.startswith("INSERT INTO resource_objects ") for s in shapes)  # the chat's Task
