"""`loopd run "prompt"`: one turn, streamed, with the session id and an exit code that says how it ended."""

from __future__ import annotations

from tests.cli_run.conftest import Dirs, RunningServer, Terminal, session_id_in


def test_streams_the_answer_and_prints_the_session(dirs: Dirs, terminal: type[Terminal]) -> None:
    t = terminal(dirs.args("hello there"))
    t.expect("resume with: loopd run --resume ")
    t.expect("You said: “hello there”")
    assert t.wait_exit() == 0
    out = t.output
    session_id = session_id_in(out)
    assert "model: demo" in out and "LOOPD_MODEL" in out and "OPENAI_API_KEY" in out
    assert "✓ done · 1 step · " in out and " tokens (" in out and "$0.0000" in out
    # The last line repeats the id with the session's totals.
    assert out.rstrip().splitlines()[-1].startswith(f"session {session_id} · 1 turn · ")


def test_ctrl_c_interrupts_and_exits_130(dirs: Dirs, terminal: type[Terminal], scripted_server: RunningServer) -> None:
    t = terminal(dirs.args("--model", "scripted", "--base-url", scripted_server.url, "be slow"))
    t.expect("slow slow")
    t.send("\x03")
    t.expect("■ interrupted")
    assert t.wait_exit() == 130
    out = t.output
    session_id = session_id_in(out)
    assert f"session {session_id} · 1 turn" in out
    assert scripted_server.disconnects() == 1  # the model stream was closed, not drained
