"""`python -m benchmarks._first_text`: a profile of a real `loopd up` from a round's start until most answers show
text — the watcher in the generated sitecustomize, the report's helpers, and one small real run."""

from __future__ import annotations

import cProfile
import re
from pathlib import Path

import pytest

from benchmarks import _first_text


def _first_text_pattern() -> re.Pattern[str]:
    line = next(line for line in _first_text.SITECUSTOMIZE.splitlines() if "re.compile" in line)
    found = re.search(r're\.compile\(r"(.*)"\)', line)
    assert found is not None
    return re.compile(found.group(1))


def test_the_watcher_counts_an_answers_first_event_after_its_start_only() -> None:
    pattern = _first_text_pattern()
    assert pattern.match("INSERT INTO message_events (message_id, seq, event) VALUES ('01a2-b3', 2, '{}')")
    # a question's opening (its start and end, then its response's start) begins with event 1: not an answer's text
    opening = "INSERT INTO message_events (message_id, seq) VALUES ('01a2-b3', 1, 'x'), ('01a2', 2, 'y')"
    assert not pattern.match(opening)
    assert not pattern.match("INSERT INTO message_events (message_id, seq) VALUES ('01a2-b3', 12, 'x')")
    assert not pattern.match("UPDATE messages SET seq = 2")


def _work() -> int:
    return sum(range(1000))


def test_the_report_sums_an_entry_point_and_own_time_by_package(tmp_path: Path) -> None:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        _work()
    profile.disable()
    path = tmp_path / "window.prof"
    profile.dump_stats(str(path))
    window = _first_text.load(path)
    assert window.total > 0
    assert 0 < _first_text.cumulative(window, "test_first_text.py", "_work") <= window.total + 1e-9
    assert _first_text.cumulative(window, "test_first_text.py", "absent") == 0.0
    packages = dict(_first_text.by_package(window))
    assert pytest.approx(sum(packages.values())) == window.total
    assert any(name.startswith(("stdlib: ", "built-in: ")) for name in packages)


def test_a_share_outside_zero_to_one_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _first_text.main(["--share", "1.5"])
    assert "--share must be above 0 and at most 1" in capsys.readouterr().err


def test_a_real_round_profiles_the_window_before_first_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "first-text.prof"
    _first_text.main(["--chats", "4", "--share", "1", "--out", str(out)])
    report = capsys.readouterr().out
    assert out.is_file()
    assert "where the server's time went" in report and "Own time by package" in report
    window = _first_text.load(out)
    for suffix, function in (("chat/_requests.py", "ask"), ("engine/_engine.py", "start")):
        assert _first_text.cumulative(window, suffix, function) > 0, (suffix, function)
