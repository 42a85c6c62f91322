"""What `loopd run` tells the user to do next: the resume command works as printed, and usage is never a false 0."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from loopd.cli._run_conversation import _TurnTracker
from loopd.cli._run_view import RunView
from loopd.harness import Usage
from loopd.harness.core.events import TurnInterrupted
from tests.cli_run.conftest import Dirs, run_captured


async def test_the_resume_hint_names_a_non_default_data_dir(dirs: Dirs) -> None:
    result = await run_captured(dirs, prompt="hello")
    assert result.code == 0, result.stderr
    assert f"--data-dir {dirs.data_dir}" in result.stderr
    for line in result.stderr.splitlines():
        if "loopd run --resume" in line:
            assert line.rstrip().endswith(f"--data-dir {dirs.data_dir}"), line


async def test_the_resume_hint_leaves_out_the_default_data_dir(
    dirs: Dirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPD_DATA_DIR", str(tmp_path / "home"))
    result = await run_captured(dirs, data_dir=(tmp_path / "home" / "harness").resolve(), prompt="hello")
    assert result.code == 0, result.stderr
    assert "loopd run --resume" in result.stderr and "--data-dir" not in result.stderr


async def test_resuming_with_the_printed_command_finds_the_session(dirs: Dirs, tmp_path: Path) -> None:
    first = await run_captured(dirs, prompt="hello")
    line = next(x for x in first.stderr.splitlines() if "resume with:" in x)
    words = line.split("resume with: ", 1)[1].split()
    assert words[:3] == ["loopd", "run", "--resume"] and words[4] == "--data-dir"
    again = await run_captured(dirs, resume=words[3], data_dir=Path(words[5]), prompt="and again")
    assert again.code == 0, again.stderr
    assert "resumed" in again.stderr


def test_a_turn_cut_short_mid_stream_reports_its_usage_as_unknown() -> None:
    turn = _TurnTracker()
    turn.streamed = {1: 400, 2: 40}  # step 1 completed (its usage is in the turn's), step 2 was cut short
    turn.replied_steps = {1}
    assert turn.unmetered_chars() == 40
    err = io.StringIO()
    view = RunView(console=Console(file=err, width=300), out=io.StringIO())
    event = TurnInterrupted(loop="main", turn_id="t", reason="Ctrl-C", usage=Usage(), at=0.0)
    view.turn_interrupted(event, unmetered_chars=40)
    assert "0 tokens" in err.getvalue() and "usage unknown (~10 tokens streamed)" in err.getvalue()
    err.truncate(0)
    view.turn_interrupted(event)
    assert "usage unknown" not in err.getvalue()
