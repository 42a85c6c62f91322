"""`benchmarks._goals`: one table of goals, verdicts met / MISSED / n/a."""

from __future__ import annotations

import pytest
from benchmarks._goals import GOALS, goal_rows, goals_of


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
