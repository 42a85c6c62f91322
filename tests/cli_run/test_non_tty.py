"""Without a terminal: the answer alone on stdout, questions answered by the policy's `unattended` answer."""

from __future__ import annotations

from tests.cli_run.conftest import Dirs, run_plain, session_id_in


def test_one_shot_denies_a_question_by_default(dirs: Dirs) -> None:
    result = run_plain(dirs.args("read notes.txt"))
    assert result.returncode == 0, result.stderr
    assert "stdin is not a terminal: answering with the policy's unattended answer (deny)" in result.stderr
    assert "⊘ read_file denied" in result.stderr
    assert "remember the milk" not in result.stdout + result.stderr
    # stdout holds the answer only; the session line and the tool lines went to stderr.
    assert "Let me call `read_file`" in result.stdout
    assert "session " not in result.stdout and "permission" not in result.stdout.split("```")[0]
    session_id_in(result.stderr)


def test_a_policy_can_approve_unattended_questions(dirs: Dirs) -> None:
    policy = dirs.workspace / "policy.yaml"
    policy.write_text("version: 1\nunattended: approve\n")
    result = run_plain(dirs.args("--policy", str(policy), "read notes.txt"))
    assert result.returncode == 0, result.stderr
    assert "unattended answer (approve)" in result.stderr
    assert "remember the milk" in result.stdout
    assert not dirs.rules_file.exists()  # an unattended approval is never "always"


def test_a_repl_reads_turns_from_a_pipe(dirs: Dirs) -> None:
    result = run_plain(dirs.args(), stdin="first line\n\nsecond line\n/exit\nnever sent\n")
    assert result.returncode == 0, result.stderr
    assert "you › first line" in result.stderr and "you › second line" in result.stderr
    assert "You said: “first line”" in result.stdout and "You said: “second line”" in result.stdout
    assert "never sent" not in result.stdout + result.stderr
    assert f"session {session_id_in(result.stderr)} · 2 turns" in result.stderr
