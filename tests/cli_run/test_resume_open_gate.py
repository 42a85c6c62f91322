"""A permission question left open (by quitting, or by a crash) is asked again by `loopd run --resume`."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pexpect

from loopd.harness import SqliteJournal
from tests.cli_run.conftest import Dirs, Terminal, run_captured, session_id_in

QUESTION = "[a]pprove once / a[l]ways / [d]eny › "
_TURN_KINDS = frozenset(
    {"turn_started", "gate_opened", "gate_resolved", "turn_done", "turn_failed", "turn_interrupted"}
)


def turn_kinds(data_dir: Path, session_id: str) -> list[str]:
    """The journal's turn and gate record kinds of ``session_id``, in order."""

    async def read() -> list[str]:
        journal = await SqliteJournal.open(data_dir / "journal.db")
        try:
            return [r.kind for r in await journal.read(session_id) if r.kind in _TURN_KINDS]
        finally:
            await journal.aclose()

    return asyncio.run(read())


def open_a_question(terminal: type[Terminal], dirs: Dirs) -> Terminal:
    t = terminal(dirs.args())
    t.expect("you › ")
    t.send_line("list files")
    t.expect("permission needed")
    t.expect(QUESTION)
    return t


def test_quitting_at_a_question_keeps_it_and_resume_asks_it(dirs: Dirs, terminal: type[Terminal]) -> None:
    t = open_a_question(terminal, dirs)
    t.send("\x03")
    t.expect("Ctrl-C again to quit: the question stays open")
    t.expect(QUESTION)
    t.send("\x03")
    assert t.wait_exit() == 130
    session_id = session_id_in(t.output)
    resume = f"loopd run --resume {session_id} --data-dir {dirs.data_dir}"
    assert f"a permission question stays open: {resume} asks again" in t.output
    assert "interrupted" not in t.output
    assert turn_kinds(dirs.data_dir, session_id) == ["turn_started", "gate_opened"]  # not interrupted, not denied

    again = terminal(dirs.args("--resume", session_id))
    again.expect("a permission question is still waiting for an answer")
    again.expect("permission needed")
    again.expect('list_dir(path=".")')
    again.expect(QUESTION)
    again.send_line("a")
    again.expect("✓ approved once")
    again.expect("notes.txt")
    again.expect("✓ done")
    again.expect("you › ")  # the REPL starts only once the parked turn has ended
    again.send_line("/exit")
    assert again.wait_exit() == 0
    out = again.output
    assert "✓ list_dir → notes.txt" in out
    assert out.index("✓ done") < out.index("you › ")
    assert f"session {session_id} · 1 turn" in out
    assert "stays open" not in out
    assert turn_kinds(dirs.data_dir, session_id) == [
        "turn_started",
        "gate_opened",
        "gate_resolved",
        "turn_done",
    ]


def test_a_question_open_at_a_crash_gets_the_unattended_answer_before_the_prompt(
    dirs: Dirs, terminal: type[Terminal]
) -> None:
    t = open_a_question(terminal, dirs)
    session_id = session_id_in(t.output)
    t.child.kill(signal.SIGKILL)  # a crash: nothing is shut down, the journal ends at the open gate
    t.child.expect(pexpect.EOF)
    t.child.close()
    assert t.child.signalstatus == signal.SIGKILL
    assert turn_kinds(dirs.data_dir, session_id) == ["turn_started", "gate_opened"]

    resumed = asyncio.run(run_captured(dirs, resume=session_id, prompt="and hello"))
    assert resumed.code == 0, resumed.stderr
    err = resumed.stderr
    assert "a permission question is still waiting for an answer" in err
    assert "permission needed" in err and 'list_dir(path=".")' in err
    assert "stdin is not a terminal: answering with the policy's unattended answer (deny)" in err
    assert "⊘ denied" in err
    assert err.index("⊘ denied") < err.index("✓ done")
    assert "You said: “and hello”" in resumed.stdout
    assert f"session {session_id} · 2 turns" in err
    kinds = turn_kinds(dirs.data_dir, session_id)
    assert kinds[:4] == ["turn_started", "gate_opened", "gate_resolved", "turn_done"]
    assert kinds[4:] == ["turn_started", "turn_done"]
