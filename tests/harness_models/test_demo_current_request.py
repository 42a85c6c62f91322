"""The demo model reacts to the current request only: a tool asked for earlier in the conversation is not run
again for every later prompt (neither in a harness session's history nor in loop-server's prompt, which carries
the conversation so far before the current request)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from loopd.harness.models._scripted_server import IncomingRequest, current_request, demo_reply
from loopd.server.engine import AdapterRequest, HistoryEntry

TOOLS = tuple({"type": "function", "function": {"name": n, "parameters": {}}} for n in ("list_dir", "read_file"))


def _incoming(*messages: dict[str, Any]) -> IncomingRequest:
    return IncomingRequest(model="demo", messages=messages, tools=TOOLS)


def _server_prompt(text: str, *history: tuple[str, str, str]) -> str:
    """The prompt loop-server's engine sends a harness for a Task: the visible history, then the request."""
    request = AdapterRequest(
        call_id="c",
        target="assistant",
        text=text,
        history=tuple(HistoryEntry(kind, key, said) for kind, key, said in history),
        options={},
        deadline=datetime(2030, 1, 1, tzinfo=UTC),
        timeout=60.0,
    )
    return request.prompt()


EARLIER = (
    ("user", "local", "please list files"),
    ("harness", "assistant", "The `list_dir` tool returned: README.md"),
    ("user", "local", "now read README.md"),
    ("harness", "assistant", "The `read_file` tool returned: # loopd"),
)


@pytest.mark.parametrize("later", ["thanks!", "what is 2+2?", "I read a book yesterday"])
def test_a_later_prompt_after_tools_in_the_history_calls_no_tool(later: str) -> None:
    reply = demo_reply(_incoming({"role": "user", "content": _server_prompt(later, *EARLIER)}))

    assert reply.tool_calls == ()
    assert reply.text.startswith(f"You said: “{later}”")
    assert "Conversation so far" not in reply.text


def test_the_current_request_still_calls_its_tool_whatever_the_history() -> None:
    reply = demo_reply(_incoming({"role": "user", "content": _server_prompt("list files in src", *EARLIER)}))

    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("list_dir", {"path": "src"})]


def test_a_session_history_with_an_earlier_tool_call_does_not_repeat_it() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}
    reply = demo_reply(
        _incoming(
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "Let me call `list_dir` for `.`.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "README.md"},
            {"role": "assistant", "content": "The `list_dir` tool returned: README.md"},
            {"role": "user", "content": "thank you"},
        )
    )

    assert reply.tool_calls == ()
    assert reply.text.startswith("You said: “thank you”")


def test_current_request_is_the_text_after_the_last_marker() -> None:
    assert current_request("  plain question \n") == "plain question"
    assert current_request(_server_prompt("second", ("user", "local", "first"))) == "second"
    assert current_request("Conversation so far:\n[user local] a\n\nCurrent request:\nb\nCurrent request:\nc") == "c"
