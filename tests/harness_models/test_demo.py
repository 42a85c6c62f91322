"""The demo model: deterministic, friendly, and it shows tools (and so the gate) in action."""

from __future__ import annotations

import json

import pytest

from loopd.harness.core._values import Message, ToolCall
from loopd.harness.models._protocol import ModelRequest
from loopd.harness.models._scripted_server import DemoOptions, IncomingRequest, demo_reply

from .conftest import Serve
from .helpers import LIST_DIR, READ_FILE, ask, collect


def incoming(*messages: dict[str, object], tools: tuple[str, ...] = ()) -> IncomingRequest:
    specs = tuple({"type": "function", "function": {"name": n, "parameters": {}}} for n in tools)
    return IncomingRequest(model="demo", messages=messages, tools=specs)


async def test_the_demo_echoes_and_explains_how_to_configure_a_real_model(serve: Serve) -> None:
    served = await serve(None)

    got = await collect(served.model.stream(ask("What can you do?")))

    assert got.error is None
    assert got.text.startswith("You said: “What can you do?”")
    for hint in ("demo model", "LOOPD_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        assert hint in got.text
    assert got.tool_calls == ()
    assert got.usage.input_tokens > 0


async def test_the_demo_lists_files_with_a_tool_then_shows_the_result(serve: Serve) -> None:
    served = await serve(None)
    request = ask("please list files", tools=(LIST_DIR, READ_FILE))

    first = await collect(served.model.stream(request))

    assert first.tool_calls == (ToolCall(id=first.tool_calls[0].id, name="list_dir", arguments={"path": "."}),)
    call = first.tool_calls[0]
    follow_up = ModelRequest(
        model="",
        tools=request.tools,
        messages=(
            *request.messages,
            Message(role="assistant", content=first.text, tool_calls=(call,)),
            Message(role="tool", content="README.md\nsrc/", tool_call_id=call.id, name="list_dir"),
        ),
    )

    second = await collect(served.model.stream(follow_up))

    assert second.tool_calls == ()
    assert "`list_dir`" in second.text
    assert "README.md\nsrc/" in second.text


def test_the_demo_reads_the_named_file() -> None:
    reply = demo_reply(incoming({"role": "user", "content": "Read docs/ARCHITECTURE.md please"}, tools=("read_file",)))

    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("read_file", {"path": "docs/ARCHITECTURE.md"})]


@pytest.mark.parametrize(
    ("said", "path"),
    [("read README.md", "README.md"), ("open the file ./notes.txt.", "./notes.txt"), ("I read a book", None)],
)
def test_the_demo_reads_only_what_looks_like_a_path(said: str, path: str | None) -> None:
    reply = demo_reply(incoming({"role": "user", "content": said}, tools=("read_file",)))

    assert [c.arguments for c in reply.tool_calls] == ([{"path": path}] if path else [])


def test_the_demo_lists_a_named_directory() -> None:
    reply = demo_reply(incoming({"role": "user", "content": "list files in src/loopd"}, tools=("list_dir",)))

    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("list_dir", {"path": "src/loopd"})]


def test_the_demo_says_so_when_the_tool_is_not_offered() -> None:
    reply = demo_reply(incoming({"role": "user", "content": "list files"}))

    assert reply.tool_calls == ()
    assert "offers no such tool" in reply.text


def test_the_demo_tool_names_are_configurable() -> None:
    options = DemoOptions(list_tool="Ls", read_tool="Read", path_argument="file_path")
    request = incoming({"role": "user", "content": "read a.txt"}, tools=("Ls", "Read"))

    reply = demo_reply(request, options)

    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("Read", {"file_path": "a.txt"})]


def test_the_demo_names_the_tool_from_the_assistant_call_when_the_result_has_no_name() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    request = incoming(
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "hello"},
    )

    assert "`read_file` tool returned" in demo_reply(request).text


def test_the_demo_is_deterministic() -> None:
    request = incoming({"role": "user", "content": "hello there"}, tools=("list_dir",))

    assert demo_reply(request) == demo_reply(request)
    assert json.dumps(demo_reply(request).model_dump()) == json.dumps(demo_reply(request).model_dump())
