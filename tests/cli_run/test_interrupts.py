"""Ctrl-C in the REPL: it interrupts the running turn, the REPL goes on; twice at the prompt quits."""

from __future__ import annotations

from tests.cli_run.conftest import SLOW_CHUNKS, Dirs, RunningServer, Terminal, journal_last_seq, session_id_in


def test_ctrl_c_interrupts_a_slow_turn_and_the_repl_stays_usable(
    dirs: Dirs, terminal: type[Terminal], scripted_server: RunningServer
) -> None:
    t = terminal(dirs.args("--model", "scripted", "--base-url", scripted_server.url))
    t.expect("you › ")
    t.send_line("be slow")
    t.expect("slow slow")
    t.send("\x03")
    t.expect("interrupting the turn")
    t.expect("■ interrupted")
    t.expect("you › ")
    t.send_line("hello after")
    t.expect("You said: “hello after”")
    t.expect("✓ done")
    t.expect("you › ")
    t.send("\x03")
    t.expect("Ctrl-C again to quit")
    t.expect("you › ")
    t.send("\x03")
    assert t.wait_exit() == 130
    out = t.output
    session_id = session_id_in(out)
    assert f"session {session_id} · 2 turns" in out
    # The cut-short model call never reported its usage: said so (with what streamed), not a bare "0 tokens".
    interrupted = next(line for line in out.splitlines() if "■ interrupted" in line)
    assert "usage unknown (~" in interrupted and "tokens streamed)" in interrupted
    closing = next(line for line in out.splitlines() if line.startswith(f"session {session_id} · 2 turns"))
    assert "usage unknown" in closing
    assert out.count("slow") < SLOW_CHUNKS  # the stream stopped early
    assert scripted_server.disconnects() == 1
    assert journal_last_seq(dirs.data_dir, session_id) > 0
