"""`--fork ID[@SEQ]`: a new session from another one's history (its last finished turn, or a given settled seq);
the original is untouched; bad fork points are one-line usage errors."""

from __future__ import annotations

import asyncio

from tests.cli_run.conftest import Dirs, journal_last_seq, run_captured, session_id_in


def test_fork_continues_from_the_last_finished_turn_and_leaves_the_original(dirs: Dirs) -> None:
    first = asyncio.run(run_captured(dirs, prompt="remember apples"))
    assert first.code == 0, first.stderr
    original = session_id_in(first.stderr)
    before = journal_last_seq(dirs.data_dir, original)

    forked = asyncio.run(run_captured(dirs, fork=original, prompt="and pears"))
    assert forked.code == 0, forked.stderr
    fork = session_id_in(forked.stderr)
    assert fork != original
    # The original ended with session_stopped: its last settled point is that record.
    assert f"forked from session {original} at seq {before}" in forked.stderr
    assert "1 turn so far" in forked.stderr and "last reply: You said: “remember apples”" in forked.stderr
    assert "You said: “and pears”" in forked.stdout
    assert f"session {fork} · 2 turns" in forked.stderr
    assert journal_last_seq(dirs.data_dir, original) == before

    # At seq 1 (the session's start) the fork has no turn yet; a seq inside a turn is refused.
    start = asyncio.run(run_captured(dirs, fork=f"{original}@1", prompt="hello"))
    assert start.code == 0, start.stderr
    assert "0 turns so far" in start.stderr
    inside = asyncio.run(run_captured(dirs, fork=f"{original}@2", prompt="hello"))
    assert inside.code == 2
    assert "inside a turn" in inside.stderr and "the last settled seq before it is 1" in inside.stderr


def test_bad_fork_options_are_usage_errors(dirs: Dirs) -> None:
    first = asyncio.run(run_captured(dirs, prompt="hello"))
    original = session_id_in(first.stderr)
    last = journal_last_seq(dirs.data_dir, original)
    cases = {
        f"{original}@0": "SEQ must be a journal seq",
        f"{original}@x": "SEQ must be a journal seq",
        "@3": "no session id",
        f"{original}@{last + 1}": f"has seqs 1..{last}",
        "no-such-session@1": "no session 'no-such-session'",
    }
    for value, message in cases.items():
        result = asyncio.run(run_captured(dirs, fork=value, prompt="hi"))
        assert result.code == 2, (value, result.stderr)
        assert message in result.stderr, (value, result.stderr)
        assert "resume with" not in result.stderr  # no session was started instead
    both = asyncio.run(run_captured(dirs, fork=original, resume=original, prompt="hi"))
    assert both.code == 2 and "--fork and --resume exclude each other" in both.stderr
