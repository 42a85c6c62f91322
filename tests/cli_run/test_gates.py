"""The inline permission question: approve once, deny, always (persisted for the workspace)."""

from __future__ import annotations

import asyncio
import json
import stat

from tests.cli_run.conftest import Dirs, Terminal, run_captured

QUESTION = "[a]pprove once / a[l]ways / [d]eny › "


def test_approve_once_and_deny_in_the_repl(dirs: Dirs, terminal: type[Terminal]) -> None:
    t = terminal(dirs.args())
    t.expect("you › ")
    t.send_line("list files")
    t.expect("permission needed")
    t.expect(QUESTION)
    t.send_line("maybe")
    t.expect("is not an answer")
    t.expect(QUESTION)
    t.send_line("a")
    t.expect("✓ approved once")
    t.expect("notes.txt")
    t.expect("✓ done")
    t.expect("you › ")
    t.send_line("read notes.txt")
    t.expect(QUESTION)
    t.send_line("d")
    t.expect("⊘ denied")
    t.expect("✓ done")
    t.expect("you › ")
    t.send_line("/exit")
    assert t.wait_exit() == 0
    out = t.output
    assert 'list_dir(path=".")' in out and "list the workspace root" in out
    assert "▸ list_dir list ." in out and "✓ list_dir → notes.txt" in out
    assert 'read_file(path="notes.txt")' in out and "allow fs.read notes.txt" in out
    assert "⊘ read_file denied → permission denied" in out
    assert "remember the milk" not in out  # the denied read never ran
    assert not dirs.rules_file.exists()  # neither answer stores anything


def test_always_is_stored_and_not_asked_again(dirs: Dirs, terminal: type[Terminal]) -> None:
    t = terminal(dirs.args("read notes.txt"))
    t.expect("a[l]ways stores for this workspace:")
    t.expect(QUESTION)
    t.send_line("l")
    t.expect("✓ approved always")
    assert t.wait_exit() == 0
    assert "remember the milk" in t.output
    stored = json.loads(dirs.rules_file.read_text())["rules"]
    assert [(r["kind"], r["pattern"], r["effect"]) for r in stored] == [("fs.read", "notes.txt", "allow")]
    assert stat.S_IMODE(dirs.rules_file.stat().st_mode) == 0o600  # the workspace's grants: the owner's alone
    assert stat.S_IMODE(dirs.rules_file.parent.stat().st_mode) == 0o700

    # A later run with no one to ask (its questions would be denied) is not asked: the stored rule allows the read.
    again = asyncio.run(run_captured(dirs, prompt="read notes.txt"))
    assert again.code == 0, again.stderr
    assert "permission needed" not in again.stderr
    assert "✓ read_file → remember the milk" in again.stderr
    assert "remember the milk" in again.stdout
