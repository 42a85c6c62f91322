"""`benchmarks._results.compare`: figures matched by table and row labels, and `python -m benchmarks --compare`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._results import compare

ROOT = Path(__file__).resolve().parents[2]


def _document(commit: str, rows: list[list[Any]], *, title: str = "chats") -> dict[str, Any]:
    return {
        "commit": commit,
        "load_average_before": [1.0, 1.0, 1.0],
        "tables": [
            {"module": "environment", "title": "environment", "columns": ["what", "value"], "rows": [["CPU", "x"]]},
            {"module": "server_chats", "title": title, "columns": ["chats", "completed", "chats/s"], "rows": rows},
        ],
    }


def test_figures_are_matched_by_their_row_labels_and_text_cells_are_not_figures() -> None:
    before = _document("a", [[1, "1/1", 10.0], [100, "100/100", 12.5]])
    after = _document("b", [[100, "99/100", 25.0], [1, "1/1", 10.0], [1000, "1000/1000", 5.0]])
    changes = compare(before, after)
    # "chats" tells the rows apart: it is the label; "completed" holds text, so it is no figure; 1,000 is new
    assert [(c.row, c.column, c.before, c.after) for c in changes] == [
        ("100", "chats/s", 12.5, 25.0),
        ("1", "chats/s", 10.0, 10.0),
    ]


def test_rows_are_told_apart_by_as_many_leading_cells_as_it_takes() -> None:
    rows_before = [["real", 1, 100.0], ["real", 10, 300.0], ["embedded", 1, 130.0]]
    rows_after = [["real", 1, 110.0], ["real", 10, 330.0], ["embedded", 1, 120.0]]
    before, after = _document("a", rows_before), _document("b", rows_after)
    for document in (before, after):
        document["tables"][1]["columns"] = ["API", "at once", "Tasks/s"]
    assert [(c.row, c.after / c.before) for c in compare(before, after)] == [
        ("real / 1", 110.0 / 100.0),
        ("real / 10", 330.0 / 300.0),
        ("embedded / 1", 120.0 / 130.0),
    ]


def test_a_changed_figure_reports_its_ratio_and_other_tables_are_ignored() -> None:
    before = _document("a", [["one", 10.0]])
    after = _document("b", [["one", 15.0]])
    for document in (before, after):
        document["tables"][1]["columns"] = ["case", "ms"]
    other = _document("b", [["one", 1.0]], title="something else")
    other["tables"][1]["columns"] = ["case", "ms"]
    after["tables"].append(other["tables"][1])
    (change,) = compare(before, after)
    assert (change.row, change.column, change.ratio, change.percent) == ("one", "ms", 1.5, 50.0)


def test_the_command_prints_the_changes_and_refuses_files_without_common_figures(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(_document("a", [[1, "1/1", 10.0]])))
    b.write_text(json.dumps(_document("b", [[1, "1/1", 12.0]])))
    c.write_text(json.dumps(_document("c", [[1, "1/1", 12.0]], title="another table")))
    run = [sys.executable, "-m", "benchmarks", "--compare"]
    done = subprocess.run([*run, str(a), str(b)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "+20.0 %" in done.stdout and "chats/s" in done.stdout
    none = subprocess.run([*run, str(a), str(c)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert none.returncode != 0 and "no figure in common" in none.stderr


def test_a_results_file_records_the_tree_its_run_started_on_and_what_changed_meanwhile() -> None:
    from benchmarks.__main__ import TreeState, changed_during_run

    clean = TreeState("abc1234", frozenset())
    # Edited while the run went on: the run measured the clean commit; the edit is named, not counted as measured.
    edited = TreeState("abc1234", frozenset({" M docs/ARCHITECTURE.md"}))
    assert changed_during_run(clean, edited) == ["docs/ARCHITECTURE.md"]
    assert changed_during_run(clean, clean) == []
    assert changed_during_run(edited, edited) == []  # dirty from the start: the file says so (dirty), nothing more
    committed = TreeState("def5678", frozenset())
    assert changed_during_run(edited, committed) == ["commit abc1234 → def5678", "docs/ARCHITECTURE.md"]


def test_the_docs_header_names_what_changed_during_the_run() -> None:
    from benchmarks._docs import render_section

    document = _document("abc1234", [[1, "1/1", 10.0]])
    document["changed_during_run"] = ["docs/ARCHITECTURE.md"]
    header = render_section(document, "server_chats", "results/x.json").splitlines()[0]
    assert "at commit abc1234," in header and "(uncommitted changes)" not in header
    assert "changed in the checkout during the run, not measured: docs/ARCHITECTURE.md" in header
    del document["changed_during_run"]
    assert "changed in the checkout" not in render_section(document, "server_chats", "results/x.json")
