"""`benchmarks._goals`: one table of goals, verdicts met / MISSED / n/a."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.__main__ import print_run_goals
from benchmarks._goals import GOALS, GOALS_TITLE, board, goal_rows, goal_table, goals_of, tally


def test_verdicts_follow_each_goals_direction_and_unmeasured_figures_are_na() -> None:
    rows = {row[0]: row for row in goal_rows("server_chats", {"chats_per_s": 120.0, "ttft_p95_ms": 900.0})}
    assert rows["100 concurrent chats: throughput"][3] == "met"
    assert rows["100 concurrent chats: TTFT p95"][3] == "MISSED"
    assert rows["100 concurrent chats: TTFT p95"][1] == "≤ 500 ms"
    assert rows["1,000 concurrent chats: chats lost"][2:] == ("not measured", "n/a")


def test_every_benchmark_with_an_issue_18_goal_has_goals_and_keys_are_unique() -> None:
    assert {g.module for g in GOALS} == {"server_chats", "server_streams", "peers", "harness_core"}
    assert len({(g.module, g.key) for g in GOALS}) == len(GOALS)
    assert {"p95_ms_1000", "p95_ms_5000"} <= {g.key for g in goals_of("server_streams")}


def test_a_figure_without_a_goal_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        goal_rows("peers", {"no_such_goal": 1.0})


def _recorded(module: str, measured: dict[str, float | None]) -> dict[str, Any]:
    """The goal table ``module`` records for ``measured``, as a run's tables hold it."""
    rows = [list(row) for row in goal_rows(module, measured)]
    columns = ["goal", "target", "measured", "verdict"]
    return {"module": module, "title": GOALS_TITLE + module, "columns": columns, "rows": rows}


def test_a_board_lists_each_modules_goals_once_in_order_and_tallies_them() -> None:
    chats = _recorded("server_chats", {"chats_per_s": 120.0, "ttft_p95_ms": 900.0})
    other = {"module": "server_chats", "title": "chats", "columns": ["x"], "rows": [[1]]}
    tables = [other, chats]
    assert goal_table(tables, "server_chats") == chats["rows"] and goal_table(tables, "peers") is None
    rows = board([("server_chats", chats["rows"], "a.json"), ("server_chats", [["again"]], "b.json")])
    assert len(rows) == len(goals_of("server_chats")) and all(row[0] == "server_chats" for row in rows)
    assert rows[0][-1] == "a.json" and board([("m", [["g", "t", "v", "met"]], None)]) == [["m", "g", "t", "v", "met"]]
    assert tally(rows) == f"1 met, 1 MISSED, {len(rows) - 2} not measured"
    assert tally([["m", "g", "t", "v", "met"]]) == "1 met, 0 MISSED"


def test_a_run_of_several_modules_with_goals_ends_with_all_of_them(capsys: pytest.CaptureFixture[str]) -> None:
    chats = _recorded("server_chats", {"chats_per_s": 120.0})
    streams = _recorded("server_streams", {"p95_ms_1000": 20.0})
    print_run_goals([chats])
    assert capsys.readouterr().out == ""  # one module: its own table was the last one printed
    print_run_goals([chats, {"module": "peers", "title": "steps", "rows": []}, streams])
    out = capsys.readouterr().out
    assert "Every goal of this run: 2 met, 0 MISSED" in out
    assert out.index("100 concurrent chats: throughput") < out.index("1,000 subscribers: delay p95")
