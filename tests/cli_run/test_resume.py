"""`--resume ID`: a recap of the session from the journal, then the same session goes on."""

from __future__ import annotations

import asyncio

from tests.cli_run.conftest import Dirs, Terminal, journal_last_seq, run_captured, session_id_in


def test_resume_shows_a_recap_and_continues_the_session(dirs: Dirs, terminal: type[Terminal]) -> None:
    first = asyncio.run(run_captured(dirs, prompt="remember apples"))
    assert first.code == 0, first.stderr
    session_id = session_id_in(first.stderr)
    before = journal_last_seq(dirs.data_dir, session_id)

    t = terminal(dirs.args("--resume", session_id))
    t.expect(f"session {session_id} · resume with")
    t.expect("resumed")
    t.expect("you › ")
    t.send_line("and pears")
    t.expect("You said: “and pears”")
    t.expect("✓ done")
    t.expect("you › ")
    t.send("\x04")  # Ctrl-D
    assert t.wait_exit() == 0
    out = t.output
    assert "resumed · 1 turn so far" in out
    assert "last reply: You said: “remember apples”" in out
    assert f"session {session_id} · 2 turns" in out
    middle = journal_last_seq(dirs.data_dir, session_id)
    assert middle > before

    # One more prompt on the same session.
    last = asyncio.run(run_captured(dirs, resume=session_id, prompt="and plums"))
    assert last.code == 0, last.stderr
    assert "resumed · 2 turns so far" in last.stderr
    assert "last reply: You said: “and pears”" in last.stderr
    assert "You said: “and plums”" in last.stdout
    assert f"session {session_id} · 3 turns" in last.stderr
    assert journal_last_seq(dirs.data_dir, session_id) > middle
