"""`loopd run --mode plan|build`: a new session starts in the mode, a resumed one switches to it; bad values are
one-line usage errors."""

from __future__ import annotations

from pathlib import Path

from loopd.harness.models import open_scripted_server
from tests.cli_run.conftest import Dirs, plain, run_captured, session_id_in
from tests.cli_run.test_modes import _run, _Script


async def test_the_mode_flag_starts_and_switches_the_main_loop(dirs: Dirs, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("kinds:\n  fs.write: allow\n")
    script = _Script()
    async with open_scripted_server(script) as url:
        code, _out, err = await _run(dirs, url, b"write in plan\n", policy, mode="plan")
        assert code == 0, err
        assert "write_file" not in script.requests[-1].tool_names  # plan: read-only tools only
        assert "read_file" in script.requests[-1].tool_names
        assert (dirs.workspace / "notes.txt").read_text() == "remember the milk\n"
        session = session_id_in(err)
        code, _out, err = await _run(dirs, url, b"write in build\n", policy, mode="build", resume=session)
        assert code == 0, err
        assert "write_file" in script.requests[-2].tool_names
        assert (dirs.workspace / "notes.txt").read_text() == "write in build\n"


async def test_bad_mode_flags_are_usage_errors(dirs: Dirs) -> None:
    bad = await run_captured(dirs, prompt="hi", mode="fly")
    assert bad.code == 2 and "--mode 'fly': use one of build, plan" in plain(bad.stderr)
    foreign = await run_captured(dirs, prompt="hi", mode="plan", model=None, engine="codex")
    assert foreign.code == 2 and "--mode does not apply to --engine" in plain(foreign.stderr)
