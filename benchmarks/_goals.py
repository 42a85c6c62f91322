"""The goals of issue 18 (and the older ones still held), in one table, and their verdicts.

Every benchmark module with a goal measures its figures, then calls `print_goals` with them by key: it prints one
table "Goals: MODULE" (goal, target, measured, verdict: met / MISSED / n/a when the figure was not measured in this
run — a quick run, a peer left out) at the end of its output, so a run as shipped says by itself whether the goals
hold. The table goes into the results file like every other table. Pure apart from `print_goals`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["GOALS", "GOALS_TITLE", "Goal", "board", "goal_rows", "goal_table", "goals_of", "print_goals", "tally"]

GOALS_TITLE: Final = "Goals: "
"""How `print_goals` titles a module's goal table ("Goals: server_chats"), in the output and in results files."""


@dataclass(frozen=True)
class Goal:
    """One goal: a figure (``key``) of a benchmark module that must be ``op`` ``target`` (in ``unit``)."""

    module: str
    key: str
    text: str
    op: Literal["<=", ">="]
    target: float
    unit: str

    def met(self, value: float) -> bool:
        """Whether ``value`` meets the goal."""
        return value <= self.target if self.op == "<=" else value >= self.target

    @property
    def target_text(self) -> str:
        """The target as printed: ``≤ 500 ms``."""
        return f"{'≤' if self.op == '<=' else '≥'} {self.target:g}{_spaced(self.unit)}"


def _spaced(unit: str) -> str:
    return unit if unit in ("×", "") else f" {unit}"


GOALS: tuple[Goal, ...] = (
    # issue 18 §2: 100 concurrent chats to the built-in harness (demo model)
    Goal("server_chats", "chats_per_s", "100 concurrent chats: throughput", ">=", 100, "chats/s"),
    Goal("server_chats", "ttft_p95_ms", "100 concurrent chats: TTFT p95", "<=", 500, "ms"),
    Goal("server_chats", "lost_1000", "1,000 concurrent chats: chats lost", "<=", 0, "chats"),
    Goal("server_chats", "x_langgraph_rate", "chats/s ÷ LangGraph Agent Server's (same run)", ">=", 3, "×"),
    Goal("server_chats", "x_langgraph_ttft", "TTFT p95 ÷ LangGraph Agent Server's (same run)", "<=", 0.2, "×"),
    Goal("server_chats", "x_bare_rate", "chats/s ÷ bare FastAPI + SQLite server's (same run)", ">=", 0.3, "×"),
    # issue 18 §2: live streams, 20 events/s
    Goal("server_streams", "p95_ms_1000", "1,000 subscribers: delay p95", "<=", 100, "ms"),
    Goal("server_streams", "missing_1000", "1,000 subscribers: subscribers missing an event", "<=", 0, ""),
    Goal("server_streams", "p95_ms_5000", "5,000 subscribers: delay p95", "<=", 250, "ms"),
    Goal("server_streams", "missing_5000", "5,000 subscribers: subscribers missing an event", "<=", 0, ""),
    Goal(
        "server_streams", "x_langgraph_join_1000", "1,000 joined subscribers: LangGraph p95 ÷ loopd's", ">=", 100, "×"
    ),
    # issue 18 §2 and issue 6: the journal against raw sqlite3 (÷ the faster raw table), restore
    Goal("harness_core", "journal_1", "journal throughput, 1 session ÷ raw sqlite3", ">=", 0.5, "×"),
    Goal("harness_core", "journal_10", "journal throughput, 10 sessions ÷ raw sqlite3", ">=", 0.5, "×"),
    Goal("harness_core", "journal_100", "journal throughput, 100 sessions ÷ raw sqlite3", ">=", 0.7, "×"),
    Goal("harness_core", "restore_10k_ms", "restore of a 10,000-event session", "<=", 50, "ms"),
    Goal("harness_core", "storage_vs_raw", "storage after 500 steps ÷ raw message bytes", "<=", 2.2, "×"),
    # issue 18 §2 (matched durability) and issue 6
    Goal("peers", "x_langgraph_full", "faster than LangGraph per step at h=500, all FULL", ">=", 20, "×"),
    Goal("peers", "x_langgraph_normal", "faster than LangGraph per step at h=500, all NORMAL", ">=", 20, "×"),
    Goal("peers", "x_agents_full", "faster than the Agents SDK per step at h=500, all FULL", ">=", 50, "×"),
    Goal("peers", "x_agents_normal", "faster than the Agents SDK per step at h=500, all NORMAL", ">=", 50, "×"),
    Goal("peers", "step_ms_normal", "per-step overhead through the real adapter (NORMAL)", "<=", 1, "ms"),
    Goal("peers", "growth_normal", "flat in history: ms/step at the last h ÷ h=50 (NORMAL)", "<=", 1.25, "×"),
    Goal("peers", "storage_vs_langgraph", "storage after 500 steps: LangGraph's bytes ÷ loopd's", ">=", 100, "×"),
    Goal("peers", "storage_vs_raw", "storage after 500 steps: loopd's bytes ÷ raw message bytes", "<=", 2.2, "×"),
)


def goals_of(module: str) -> tuple[Goal, ...]:
    """The goals of one benchmark module, in table order."""
    return tuple(goal for goal in GOALS if goal.module == module)


def goal_rows(module: str, measured: Mapping[str, float | None]) -> list[tuple[str, str, str, str]]:
    """Rows goal / target / measured / verdict for ``module``; a figure absent or None is "not measured", "n/a"."""
    unknown = set(measured) - {goal.key for goal in goals_of(module)}
    if unknown:
        raise KeyError(f"no goal of {module} is called {sorted(unknown)}")
    rows: list[tuple[str, str, str, str]] = []
    for goal in goals_of(module):
        value = measured.get(goal.key)
        if value is None:
            rows.append((goal.text, goal.target_text, "not measured", "n/a"))
        else:
            rows.append(
                (goal.text, goal.target_text, f"{_figure(value)}{_spaced(goal.unit)}", _verdict(goal.met(value)))
            )
    return rows


def _figure(value: float) -> str:
    size = abs(value)
    digits = 0 if size >= 100 or value == int(value) else 1 if size >= 10 else 2 if size >= 0.1 else 4
    return f"{value:,.{digits}f}"


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_goals(module: str, measured: Mapping[str, float | None]) -> None:
    """Print (and record, like every table) the verdict of every goal of ``module``."""
    from benchmarks._common import print_table

    print_table(
        GOALS_TITLE + module,
        ["goal", "target", "measured", "verdict"],
        goal_rows(module, measured),
        note="n/a: not measured in this run (a smaller run, or a peer left out). Goals: docs/BENCHMARKS.md, "
        "benchmarks/_goals.py.",
    )


def goal_table(tables: Iterable[Mapping[str, Any]], module: str) -> list[list[Any]] | None:
    """The rows of ``module``'s goal table among recorded ``tables`` (a results file's, or a run's); None if none."""
    for table in tables:
        if table.get("module") == module and table.get("title") == GOALS_TITLE + module:
            return [list(row) for row in table.get("rows") or ()]
    return None


def board(entries: Iterable[tuple[str, Iterable[Iterable[Any]], str | None]]) -> list[list[Any]]:
    """One row per goal of every ``(module, goal rows, source)``, in order, a module once: ``[module, goal, target,
    measured, verdict]`` and the source when there is one (e.g. the results file it comes from)."""
    rows: list[list[Any]] = []
    seen: set[str] = set()
    for module, goal_rows_, source in entries:
        if module in seen:
            continue
        seen.add(module)
        rows += [[module, *row, *([source] if source is not None else [])] for row in goal_rows_]
    return rows


def tally(rows: Iterable[list[Any]]) -> str:
    """ "N met, M MISSED" (and ", K not measured") of `board` rows."""
    verdicts = [row[4] for row in rows]
    met, missed = verdicts.count("met"), verdicts.count("MISSED")
    others = len(verdicts) - met - missed
    return f"{met} met, {missed} MISSED" + (f", {others} not measured" if others else "")
