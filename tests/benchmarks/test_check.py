"""`make bench-check`'s comparison logic (pure): tolerances, direction, machine class, baseline choice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmarks._check import ToleranceError, judge, load_rules, machine_class, pace_of, pick_baseline
from benchmarks._results import compare

ROOT = Path(__file__).resolve().parents[2]
RULES = """
[[figure]]
module = "server_chats"
column = "chats/s"
better = "higher"
percent = 30

[[figure]]
module = "*"
column = "*ms*"
better = "lower"
percent = 40
"""


def _results(
    chats_per_s: float,
    p95_ms: float,
    *,
    date: str = "2026-12-02T00:00:00+00:00",
    cpus: str = "2",
    cpu: str = "AMD EPYC",
    quick: bool = True,
    pace: float | None = None,
) -> dict[str, Any]:
    return {
        "date": date,
        **({} if pace is None else {"pace_ms": pace}),
        "quick": quick,
        "machine_class": {"cpus": cpus, "arch": "x86_64", "python": "3.11", "cpu": cpu},
        "load_average_before": [1.0, 1.0, 1.0],
        "tables": [
            {
                "module": "server_chats",
                "title": "chats",
                "columns": ["chats", "chats/s", "TTFT p95 ms", "wall s"],
                "rows": [[20, chats_per_s, p95_ms, 1.0]],
            }
        ],
    }


def test_a_figure_worse_than_its_tolerance_regresses_in_its_own_direction() -> None:
    rules = load_rules(RULES)
    verdicts = {j.change.column: j.verdict for j in judge(compare(_results(100, 100), _results(65, 150)), rules)}
    # chats/s −35 % (higher is better, 30 % allowed); p95 +50 % (lower is better, 40 % allowed); wall s: no rule
    assert verdicts == {"chats/s": "REGRESSED", "TTFT p95 ms": "REGRESSED"}
    verdicts = {j.change.column: j.verdict for j in judge(compare(_results(100, 100), _results(75, 130)), rules)}
    assert verdicts == {"chats/s": "ok", "TTFT p95 ms": "ok"}
    verdicts = {j.change.column: j.verdict for j in judge(compare(_results(100, 100), _results(200, 50)), rules)}
    assert verdicts == {"chats/s": "improved", "TTFT p95 ms": "improved"}


def test_the_first_matching_rule_decides() -> None:
    rules = load_rules('[[figure]]\ncolumn = "*"\nbetter = "higher"\npercent = 0\n' + RULES)
    (judged, *_) = judge(compare(_results(100, 100), _results(100, 101)), rules)
    assert all(j.rule.percent == 0 for j in judge(compare(_results(100, 100), _results(100, 101)), rules))
    assert judged.verdict == "ok"


def test_malformed_tolerances_are_refused() -> None:
    with pytest.raises(ToleranceError):
        load_rules('[[figure]]\nmodule = "x"\nbetter = "sideways"\npercent = 10\n')
    with pytest.raises(ToleranceError):
        load_rules("[[figure]\n")


def test_the_baseline_is_the_newest_of_the_same_machine_class_and_kind() -> None:
    current = _results(100, 100)
    older = ("old.json", _results(90, 100, date="2026-12-01T00:00:00+00:00"))
    newer = ("new.json", _results(95, 100, date="2026-12-01T12:00:00+00:00"))
    other_machine = ("4cpu.json", _results(1, 1, date="2026-12-01T23:00:00+00:00", cpus="4"))
    other_processor = ("xeon.json", _results(1, 1, date="2026-12-01T23:00:00+00:00", cpu="Intel(R) Xeon(R)"))
    full_run = ("full.json", _results(1, 1, date="2026-12-01T23:00:00+00:00", quick=False))
    picked = pick_baseline([older, other_machine, other_processor, newer, full_run], current)
    assert picked is not None and picked[0] == "new.json"
    assert pick_baseline([other_machine, other_processor, full_run], current) is None


def test_the_baseline_ran_at_about_the_current_pace() -> None:
    current = _results(100, 100, pace=40.0)
    near = ("near.json", _results(90, 100, date="2026-12-01T00:00:00+00:00", pace=46.0))  # +15 %
    far_newer = ("far.json", _results(99, 100, date="2026-12-02T00:00:00+00:00", pace=11.0))  # a ×4 faster VM
    unpaced_newest = ("old-kind.json", _results(99, 100, date="2026-12-03T00:00:00+00:00"))
    assert pick_baseline([near, far_newer, unpaced_newest], current) == near
    # none of about this pace: a file from before paces were recorded, never one of another pace
    assert pick_baseline([far_newer, unpaced_newest], current) == unpaced_newest
    assert pick_baseline([far_newer], current) is None
    # a current file without a pace, or a baseline named by hand: the newest of the class, whatever its pace
    assert pick_baseline([near, far_newer], _results(100, 100)) == far_newer
    assert pick_baseline([far_newer], current, pace_tolerance=None) == far_newer
    assert pace_of({"pace_ms": True}) is None and pace_of({"pace_ms": -1}) is None and pace_of({}) is None


def test_a_results_file_records_the_pace_measured_before_its_run(tmp_path: Path) -> None:
    from benchmarks.__main__ import write_results
    from benchmarks._common import machine_pace

    pace = machine_pace(runs=1)
    assert pace > 0
    tables = tmp_path / "tables.jsonl"
    tables.write_text(json.dumps({"module": "m", "title": "t", "columns": ["a"], "rows": [[1]]}) + "\n")
    written = write_results(tables, (0.0, 0.0, 0.0), 1.0, tmp_path / "r.json", quick=True, pace_ms=pace)
    assert pace_of(json.loads(written.read_text())) == pace


def test_machine_class_of_an_older_file_is_read_from_its_environment_table() -> None:
    environment = {"CPUs (os.cpu_count)": "2", "Python": "CPython 3.11.7", "OS": "Linux-6.1-x86_64-glibc"}
    assert machine_class({"environment": {**environment, "CPU": "AMD EPYC"}}) == ("2", "x86_64", "3.11", "AMD EPYC")
    # recorded before the processor model was part of the class: that comes from the environment table
    recorded = {"machine_class": {"cpus": "2", "arch": "x86_64", "python": "3.11"}, "environment": {"CPU": "AMD EPYC"}}
    assert machine_class(recorded) == ("2", "x86_64", "3.11", "AMD EPYC")
    assert machine_class({"environment": environment}) == ("2", "x86_64", "3.11", "?")


def test_the_command_exits_1_on_a_regression_and_0_otherwise(tmp_path: Path) -> None:
    base, bad, good = tmp_path / "base.json", tmp_path / "bad.json", tmp_path / "good.json"
    base.write_text(json.dumps(_results(100, 100)))
    bad.write_text(json.dumps(_results(50, 100)))
    good.write_text(json.dumps(_results(99, 100)))
    run = [sys.executable, "-m", "benchmarks._check", "--baseline", str(base), "--current"]
    failed = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert failed.returncode == 1, failed.stderr
    assert "REGRESSED" in failed.stdout and "1 regressed" in failed.stdout
    passed = subprocess.run([*run, str(good)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert passed.returncode == 0, passed.stderr


def test_a_run_on_a_busy_machine_is_named_beside_the_verdicts(tmp_path: Path) -> None:
    base, busy, quiet = tmp_path / "base.json", tmp_path / "busy.json", tmp_path / "quiet.json"
    base.write_text(json.dumps(_results(100, 100)))
    busy.write_text(json.dumps({**_results(50, 100), "other_cpu_share": {"server_chats": 0.42, "peers": 0.02}}))
    quiet.write_text(json.dumps({**_results(99, 100), "other_cpu_share": {"server_chats": 0.01}}))
    run = [sys.executable, "-m", "benchmarks._check", "--baseline", str(base), "--current"]
    flagged = subprocess.run([*run, str(busy)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert flagged.returncode == 1, flagged.stderr  # still judged: the caution explains, it does not excuse
    assert "caution: other processes took more than 10% of the machine's CPU" in flagged.stdout
    assert "server_chats (42%)" in flagged.stdout and "peers" not in flagged.stdout.split("caution:")[1]
    calm = subprocess.run([*run, str(quiet)], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert calm.returncode == 0 and "caution" not in calm.stdout


def test_without_a_current_file_it_runs_the_quick_benchmarks_into_a_results_file_of_this_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.__main__ import tree_state

    from benchmarks import _check

    base = tmp_path / "base.json"
    base.write_text(json.dumps(_results(100, 100)))
    ran: list[tuple[tuple[str, ...], Path]] = []

    def quick_run(modules: tuple[str, ...], out: Path) -> None:  # the real one runs every quick benchmark
        ran.append((tuple(modules), out))
        out.write_text(json.dumps(_results(99, 100)))

    monkeypatch.setattr(_check, "_run_quick", quick_run)
    try:
        _check.main(["server_chats", "--baseline", str(base)])
        ((modules, out),) = ran
        assert modules == ("server_chats",)
        assert out.name.endswith("-quick.json") and f"-{tree_state().commit}" in out.name
        assert "0 regressed" in capsys.readouterr().out
    finally:
        for _, out in ran:
            out.unlink(missing_ok=True)


def test_a_rule_may_name_rows_and_leave_what_it_matches_unjudged() -> None:
    rules = load_rules(
        """
[[figure]]
row = "*LangGraph*"
better = "ignore"

[[figure]]
module = "server_chats"
column = "chats/s"
better = "higher"
percent = 30
"""
    )
    assert rules[0].better == "ignore" and rules[0].row == "*LangGraph*" and rules[1].row == "*"
    before, after = _results(100, 100), _results(50, 100)
    peer = json.loads(json.dumps(before["tables"][0]))
    peer["rows"] = [["LangGraph Agent Server", 20, 30.0, 100, 1.0]]
    peer["columns"] = ["server", "chats", "chats/s", "TTFT p95 ms", "wall s"]
    peer_after = json.loads(json.dumps(peer))
    peer_after["rows"][0][2] = 5.0
    before["tables"].append(peer)
    after["tables"].append(peer_after)
    judged = judge(compare(before, after), rules)
    assert [(j.change.row, j.verdict) for j in judged] == [("20", "REGRESSED")]  # the peer's drop is not judged
    with pytest.raises(ToleranceError):
        load_rules('[[figure]]\nbetter = "sideways"\n')


def test_a_new_results_file_records_the_processor_in_its_machine_class() -> None:
    from benchmarks.__main__ import machine_class as this_machine
    from benchmarks._common import cpu_model

    recorded = this_machine()
    assert recorded["cpu"] == cpu_model() and recorded["cpu"]
    assert machine_class({"machine_class": recorded}) == (
        recorded["cpus"],
        recorded["arch"],
        recorded["python"],
        recorded["cpu"],
    )


def test_the_shipped_rules_judge_times_lower_and_rates_higher() -> None:
    """The committed tolerances file: a time per step is judged lower-is-better even where a rate rule's pattern
    ("*/s*") also matches its column name ("ms/step" holds "/s")."""
    rules = load_rules((ROOT / "benchmarks" / "tolerances.toml").read_text())

    def loop(steps_per_s: float, ms_per_step: float) -> dict[str, Any]:
        table = {
            "module": "harness_core",
            "title": "loop steps/s",
            "columns": ["", "steps/s", "ms/step"],
            "rows": [["100 concurrent sessions, 12 steps each", steps_per_s, ms_per_step]],
        }
        return {**_results(100, 100), "tables": [table]}

    verdicts = {j.change.column: j.verdict for j in judge(compare(loop(3000, 0.357), loop(4400, 0.227)), rules)}
    assert verdicts == {"steps/s": "improved", "ms/step": "improved"}
    verdicts = {j.change.column: j.verdict for j in judge(compare(loop(4400, 0.227), loop(3000, 0.357)), rules)}
    assert verdicts == {"steps/s": "REGRESSED", "ms/step": "REGRESSED"}
