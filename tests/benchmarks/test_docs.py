"""The generated sections of docs/BENCHMARKS.md and docs/SCALING.md: deterministic, and equal to what the results
files they name render."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from benchmarks._docs import (
    BENCHMARKS,
    DOCS,
    GENERATED,
    ONE_RUN,
    SCALING,
    DocsError,
    Section,
    main,
    render_board,
    render_section,
    results_name,
    sections,
    update,
)


def _document(rows: list[list[Any]]) -> dict[str, Any]:
    return {
        "date": "2026-12-02T00:00:00+00:00",
        "commit": "abc1234",
        "dirty": False,
        "command": "python -m benchmarks --results server_chats",
        "load_average_before": [0.5, 0.7, 0.9],
        "tables": [
            {"module": "server_chats", "title": "chats", "columns": ["chats", "chats/s"], "rows": rows, "note": "n"},
            {"module": "peers", "title": "other", "columns": ["peer", "ms"], "rows": [["x", 1.0]], "note": ""},
        ],
    }


TEXT = """# doc

prose before
<!-- generated:server_chats from results/a.json -->
stale
<!-- /generated -->
prose after
"""


def test_rendering_is_deterministic_and_covers_only_the_named_module() -> None:
    document = _document([[100, 123.456789]])
    first = render_section(document, "server_chats", "results/a.json")
    assert first == render_section(json.loads(json.dumps(document)), "server_chats", "results/a.json")
    assert "| 100 | 123.457 |" in first and "abc1234" in first and "other" not in first
    with pytest.raises(DocsError):
        render_section(document, "server_streams", "results/a.json")


def test_update_rewrites_only_between_the_markers_and_repoints_sections_the_new_file_covers() -> None:
    files = {"results/a.json": _document([[100, 1.0]]), "results/b.json": _document([[100, 2.0]])}
    text, changed = update(TEXT, files.__getitem__)
    assert changed == ["server_chats"] and "stale" not in text
    assert text.startswith("# doc\n\nprose before\n") and text.endswith("<!-- /generated -->\nprose after\n")
    again, unchanged = update(text, files.__getitem__)
    assert again == text and unchanged == []  # idempotent
    moved, changed = update(text, files.__getitem__, repoint=("results/b.json", files["results/b.json"]))
    assert changed == ["server_chats"] and "from results/b.json -->" in moved and "| 100 | 2.000 |" in moved
    no_chats = {"date": "x", "tables": [{"module": "peers", "title": "t", "columns": ["a"], "rows": []}]}
    kept, changed = update(text, files.__getitem__, repoint=("results/c.json", no_chats))
    assert kept == text and changed == []  # a file without the module's tables leaves the section alone


def test_a_document_of_one_run_is_repointed_only_by_a_file_with_all_its_sections() -> None:
    two = TEXT + "<!-- generated:peers from results/a.json -->\nstale\n<!-- /generated -->\n"
    only_chats = {**_document([[100, 3.0]]), "tables": _document([[100, 3.0]])["tables"][:1]}
    files = {
        "results/a.json": _document([[100, 1.0]]),
        "results/b.json": _document([[100, 2.0]]),
        "results/c.json": only_chats,
    }
    text, _ = update(two, files.__getitem__)
    apart, changed = update(text, files.__getitem__, repoint=("results/c.json", only_chats))
    assert changed == ["server_chats"]  # sections of separate runs: each follows the file that has it
    assert "server_chats from results/c.json" in apart and "peers from results/a.json" in apart
    kept, changed = update(text, files.__getitem__, repoint=("results/c.json", only_chats), one_run=True)
    assert kept == text and changed == []  # one run's sections: not split between two runs
    whole, changed = update(text, files.__getitem__, repoint=("results/b.json", files["results/b.json"]), one_run=True)
    assert changed == ["server_chats", "peers"] and whole.count("from results/b.json -->") == 2
    assert SCALING in ONE_RUN and DOCS not in ONE_RUN


def test_a_hand_edited_figure_is_caught() -> None:
    files = {"results/a.json": _document([[100, 1.0]])}
    text, _ = update(TEXT, files.__getitem__)
    edited = text.replace("| 100 | 1.000 |", "| 100 | 9.000 |")
    _, changed = update(edited, files.__getitem__)
    assert changed == ["server_chats"]


@pytest.mark.parametrize("document", GENERATED, ids=lambda path: path.name)
def test_each_generated_doc_matches_the_results_files_it_names(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    found = sections(text)
    assert found, f"docs/{document.name} has no generated section"
    for section in found:
        assert (BENCHMARKS / section.file).is_file(), f"{section.file} is not in benchmarks/"
        loaded = json.loads((BENCHMARKS / section.file).read_text(encoding="utf-8"))
        assert section.body == render_section(loaded, section.name, section.file), (
            f"the {section.name} section of docs/{document.name} differs from {section.file}: "
            "regenerate it with python -m benchmarks._docs (figures are never edited by hand)"
        )
    # BENCHMARKS.md shows the marker's form in its prose, and holds the goal board
    examples = 2 if document == DOCS else 0
    assert len(re.findall(r"<!-- generated:", text)) == len(found) + examples
    _, stale = update(text, lambda file: json.loads((BENCHMARKS / file).read_text(encoding="utf-8")))
    assert stale == [], f"docs/{document.name}: {stale} out of date: regenerate with python -m benchmarks._docs"


def test_scaling_md_generates_the_tables_of_the_runs_it_scales_from() -> None:
    names = {section.name for section in sections(SCALING.read_text(encoding="utf-8"))}
    assert {"server_chats", "k8s_tasks", "pg_writes", "replica_wakeup"} <= names


@pytest.mark.parametrize("document", GENERATED, ids=lambda path: path.name)
def test_results_files_named_by_the_docs_are_tracked_by_git(document: Path) -> None:
    for section in sections(document.read_text(encoding="utf-8")):
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", f"benchmarks/{section.file}"],
            capture_output=True,
            text=True,
            cwd=BENCHMARKS.parent,
            timeout=30,
            check=False,
        )
        assert tracked.returncode == 0, f"benchmarks/{section.file} is quoted by docs/{document.name}: commit it"


def test_a_results_file_is_named_from_here_or_from_benchmarks_and_a_wrong_one_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = next(p for p in (BENCHMARKS / "results").glob("*.json"))
    expected = f"results/{named.name}"
    assert results_name(Path("benchmarks") / expected) == expected  # from the repository's root
    assert results_name(Path(expected)) == expected  # relative to benchmarks/, as the markers write it
    assert results_name(named) == expected
    with pytest.raises(DocsError, match=r"no results file results/nope\.json: give one under benchmarks/results/"):
        results_name(Path("results/nope.json"))
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    with pytest.raises(DocsError, match="is not under benchmarks/"):
        results_name(outside)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^no results file") as stopped:
        main(["--from", "missing.json", "--docs", str(tmp_path / "BENCHMARKS.md")])
    assert "\n" not in str(stopped.value)


def _goals(module: str, *rows: tuple[str, str]) -> dict[str, Any]:
    """A results table of ``module``'s goals: (goal, verdict) rows."""
    return {
        "module": module,
        "title": f"Goals: {module}",
        "columns": ["goal", "target", "measured", "verdict"],
        "rows": [[goal, "≥ 1×", "2×" if verdict == "met" else "0.5×", verdict] for goal, verdict in rows],
        "note": "",
    }


BOARDED = """# doc
<!-- generated:goals -->
<!-- /generated -->
<!-- generated:server_chats from results/a.json -->
<!-- /generated -->
<!-- generated:peers from results/a.json -->
<!-- /generated -->
"""


def test_the_goal_board_lists_each_sections_goals_from_its_file_and_follows_a_repoint() -> None:
    first = _document([[100, 1.0]])
    first["tables"] += [_goals("server_chats", ("fast", "met"), ("cheap", "MISSED")), _goals("peers", ("p", "met"))]
    first["tables"].append(_goals("server_streams", ("not shown here", "met")))  # no section of it: not listed
    second = {**_document([[100, 2.0]]), "commit": "def5678"}
    second["tables"] = [second["tables"][0], _goals("server_chats", ("fast", "met"), ("cheap", "met"))]
    files = {"results/a.json": first, "results/b.json": second}
    text, changed = update(BOARDED, files.__getitem__)
    assert "goals" in changed
    assert "#### Every goal, as shipped: 2 met, 1 MISSED" in text
    assert "| server_chats | cheap | ≥ 1× | 0.5× | MISSED | a.json (abc1234) |" in text
    assert text.index("| server_chats | fast |") < text.index("| peers | p |")  # the sections' order
    assert "not shown here" not in text
    moved, changed = update(text, files.__getitem__, repoint=("results/b.json", second))
    assert changed == ["server_chats", "goals"]
    assert (
        "as shipped: 3 met, 0 MISSED" in moved
        and "| server_chats | cheap | ≥ 1× | 2× | met | b.json (def5678) |" in moved
    )
    assert "| peers | p | ≥ 1× | 2× | met | a.json (abc1234) |" in moved  # peers' section still names a.json


def test_a_hand_edited_verdict_on_the_board_is_caught() -> None:
    document = _document([[100, 1.0]])
    document["tables"].append(_goals("server_chats", ("cheap", "MISSED")))
    files = {"results/a.json": document}
    text, _ = update(BOARDED, files.__getitem__)
    edited = text.replace(
        "| server_chats | cheap | ≥ 1× | 0.5× | MISSED |", "| server_chats | cheap | ≥ 1× | 0.5× | met |"
    )
    assert edited != text
    fixed, changed = update(edited, files.__getitem__)
    assert changed == ["goals"] and fixed == text


def test_the_board_lists_a_module_once_and_sections_without_goals_add_nothing() -> None:
    document = _document([[100, 1.0]])
    document["tables"].append(_goals("server_chats", ("fast", "met")))
    shown = [(Section("server_chats", "results/a.json", ""), document)] * 2
    shown.append((Section("peers", "results/a.json", ""), document))  # a.json has no goals of peers
    body = render_board(shown)
    assert body.count("| server_chats | fast |") == 1 and "1 met, 0 MISSED" in body and "| peers |" not in body
