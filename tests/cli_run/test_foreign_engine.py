"""`loopd run --engine claude|codex`: the main loop is a foreign loop (scripted fake CLIs stand in for the CLIs)."""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
from pathlib import Path

from tests.cli_run.conftest import Dirs, Terminal, run_captured, session_id_in

FAKES = Path(__file__).resolve().parents[1] / "harness_foreign"
QUESTION = "[a]pprove once / a[l]ways / [d]eny › "


def _command(kind: str) -> str:
    return shlex.join([sys.executable, str(FAKES / f"fake_{kind}.py")])


def test_a_foreign_engine_answers_resumes_its_session_and_meets_the_gate(dirs: Dirs) -> None:
    engine = {"model": None, "engine": "claude", "engine_command": _command("claude")}
    first = asyncio.run(run_captured(dirs, prompt="hello", **engine))
    assert first.code == 0, first.stderr
    assert "model foreign:claude" in first.stderr and "--engine claude --engine-command" in first.stderr
    match = re.search(r"session (claude-\w+) resumed=False: hello", first.stdout)
    assert match, first.stdout
    session_id = session_id_in(first.stderr)
    again = asyncio.run(run_captured(dirs, prompt="again", resume=session_id, **engine))
    assert again.code == 0, again.stderr
    assert f"session {match.group(1)} resumed=True: again" in again.stdout
    # No terminal: the gate takes the policy's unattended answer (deny), and the CLI is told.
    tool = asyncio.run(run_captured(dirs, prompt="use a tool", resume=session_id, **engine))
    assert "Bash was denied: permission denied" in tool.stdout, tool.stdout + tool.stderr


def test_codex_runs_too_and_bad_engine_flags_are_one_line_errors(dirs: Dirs) -> None:
    done = asyncio.run(run_captured(dirs, prompt="hi", model=None, engine="codex", engine_command=_command("codex")))
    assert done.code == 0 and "resumed=False: hi" in done.stdout, done.stderr
    for changes, says in (
        ({"engine": "gemini"}, "--engine 'gemini': use claude or codex"),
        ({"engine": "claude", "model": "gpt-x"}, "--model and --mcp-config do not apply to --engine"),
        ({"engine_command": "claude"}, "--engine-command needs --engine claude|codex"),
    ):
        bad = asyncio.run(run_captured(dirs, prompt="hi", **{"model": None, **changes}))
        assert bad.code == 2 and says in bad.stderr, bad.stderr


def test_the_cli_s_permission_request_is_asked_in_the_terminal(dirs: Dirs, terminal: type[Terminal]) -> None:
    t = terminal(dirs.args("--engine", "claude", "--engine-command", _command("claude")))
    t.expect("you › ")
    t.send_line("use a tool")
    t.expect("permission needed")
    t.expect("allow foreign claude:Bash")
    t.expect(QUESTION)
    t.send_line("l")  # always: stored for the workspace
    t.expect("Bash said a.txt")
    t.expect("you › ")
    t.send_line("use a tool again")  # the stored rule answers now
    t.expect("Bash said a.txt")
    t.expect("you › ")
    t.send_line("/exit")
    assert t.wait_exit() == 0
    assert t.output.count("permission needed") == 1
    assert "claude:Bash" in dirs.rules_file.read_text()
