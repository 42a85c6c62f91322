"""`loopd up`: "Approve always" on a git command does not stretch to git's escapes (issue 10, item 2, end to end).

The assistant works in a git repository; a scripted model runs whatever command a question names. The user
approves `git diff HEAD` *always*; later, `git diff --stat` runs without a question, while `git diff --no-index
<outside file>` and `git log --output=<outside file>` each open a new question (denied here), and writing
`.git/config` is refused by the tool before anyone is asked. The outside secret never reaches the model.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx

from loopd.harness.models import ServerReply
from loopd.harness.models._scripted_server import IncomingRequest, ServerToolCall
from tests.e2e.test_loopd_up import _answer_gate, _ask, _pending_gate, _response, _wait
from tests.e2e.test_loopd_up_sandbox import scripted_model_rule, start

SECRET = f"outside-secret-{secrets.token_hex(8)}"


def _request_of(request: IncomingRequest) -> str:
    """The current question: the text after the last ``Current request:`` line of the last user message."""
    for message in reversed(request.messages):
        if message.get("role") == "user":
            text = str(message.get("content", ""))
            return text.rsplit("Current request:", 1)[-1].strip()
    return ""


def _rule(seen: list[str]) -> Any:
    def rule(request: IncomingRequest) -> ServerReply:
        last = request.last_message or {}
        if last.get("role") == "tool":
            seen.append(json.dumps(last.get("content")))
            return ServerReply(text="done")
        asked = _request_of(request)
        tool, _, argument = asked.partition(" ")
        if tool == "WRITE":
            return ServerReply(
                tool_calls=(ServerToolCall(name="write_file", arguments={"path": argument, "content": "[x]\n"}),)
            )
        return ServerReply(tool_calls=(ServerToolCall(name="bash", arguments={"command": argument}),))

    return rule


def _git_repository(workspace: Path) -> None:
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("one\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for argv in (["git", "init", "-q"], ["git", "add", "notes.txt"], ["git", "commit", "-qm", "one"]):
        subprocess.run(argv, cwd=workspace, check=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=30)
    (workspace / "notes.txt").write_text("two\n")


def _turn(client: httpx.Client, text: str, answer: str | None) -> dict[str, Any]:
    """Ask; answer a question with ``answer`` (None: there must be none); return the finished response."""
    conversation_id, asked = _ask(client, text)
    response_id = asked["response"]["id"]

    def settled() -> dict[str, Any] | None:
        message = _response(client, conversation_id, response_id)
        return message if message["status"] != "streaming" or _pending_gate(message) else None

    message = _wait(settled, what=f"an answer or a question for {text!r}")
    gate = _pending_gate(message)
    if answer is None:
        assert gate is None, f"{text!r} was asked about although 'always' covers it: {gate}"
    else:
        assert gate is not None, f"{text!r} ran without a question"
        _answer_gate(client, gate, answer)
    return dict(
        _wait(
            lambda: (m := _response(client, conversation_id, response_id))["status"] != "streaming" and m,
            what=f"the end of {text!r}",
        )
    )


def test_always_on_git_diff_does_not_grant_reads_writes_or_config(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    workspace = tmp_path / "data-workspaces" / "assistant"
    _git_repository(workspace)
    seen: list[str] = []
    with scripted_model_rule(_rule(seen)) as base_url:
        up = start(data_dir, tmp_path, base_url)
        try:
            with up.client() as client:
                _turn(client, "RUN git diff HEAD", "always")
                _turn(client, "RUN git diff --stat", None)
                _turn(client, "RUN git diff --no-index ../../secret.txt /dev/null", "deny")
                _turn(client, "RUN git log --output=../../written.txt", "deny")
                _turn(client, "WRITE .git/config", None)  # refused before any question
        finally:
            up.kill(signal.SIGTERM)
    assert "two" in seen[0] and "notes.txt" in seen[1]  # the approved diff and the covered --stat ran
    assert all(SECRET not in output for output in seen)
    assert not (tmp_path / "written.txt").exists()
    assert "[x]" not in (workspace / ".git" / "config").read_text()
    assert ".git" in seen[-1]  # the write was refused by the tool, approval or not
    assert "git diff *" in (workspace / ".loopd" / "gate-rules.json").read_text()
