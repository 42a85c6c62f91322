"""`python -m benchmarks._chats_ab`: two source trees side by side, rounds alternating — its errors and one small
real run (the same tree on both sides)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import _chats_ab

ROOT = Path(__file__).resolve().parents[2]


def test_a_directory_that_is_not_a_source_tree_is_one_line_saying_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _chats_ab.main(["--base", str(tmp_path)])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is not a loopd source tree" in error and "git worktree add --detach" in error
    with pytest.raises(SystemExit):
        _chats_ab.main(["--base", str(ROOT), "--pairs", "0"])
    assert "--pairs and --chats must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("paced", [[], ["--paced", "0.005"]], ids=["demo", "paced"])
def test_a_small_run_compares_two_servers_pair_by_pair(capsys: pytest.CaptureFixture[str], paced: list[str]) -> None:
    _chats_ab.main(["--base", str(ROOT), "--head", str(ROOT), "--pairs", "2", "--chats", "3", *paced])
    out = capsys.readouterr().out
    assert sum(line.startswith("  pair ") for line in out.splitlines()) == 2
    # the table's note wraps at the terminal's width, which depends on where it runs
    assert "12 of 12 chats completed" in " ".join(out.split())
    for figure in ("chats/s", "server CPU ms/chat", "TTFT p95 ms"):
        assert figure in out
