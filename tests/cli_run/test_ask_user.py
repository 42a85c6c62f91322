"""`loopd run` and ask_user: the model's question is shown, the user's next line answers it."""

from __future__ import annotations

import io
import os

from rich.console import Console

from loopd.cli._run import RunOptions, run_harness
from loopd.cli._run_input import LineInput
from loopd.harness.models import IncomingRequest, ServerReply, ServerToolCall, open_scripted_server
from tests.cli_run.conftest import Dirs


def _script(request: IncomingRequest) -> ServerReply:
    last = request.last_message or {}
    if last.get("role") == "tool":
        return ServerReply(text=f"Noted. {last.get('content')}")
    assert "ask_user" in request.tool_names
    question = {"question": "Which database should I use?", "choices": ["sqlite", "postgres"]}
    return ServerReply(tool_calls=(ServerToolCall(name="ask_user", arguments=question, id="ask-1"),))


async def _run(dirs: Dirs, url: str, stdin: bytes) -> tuple[int, str, str]:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, stdin)
    os.close(write_fd)
    err, out = io.StringIO(), io.StringIO()
    options = RunOptions(
        workspace=dirs.workspace, data_dir=dirs.data_dir, model="scripted", base_url=url, prompt="set up the project"
    )
    try:
        code = await run_harness(
            options, console=Console(file=err, width=200), out=out, terminal=LineInput(read_fd, interactive=False)
        )
    finally:
        os.close(read_fd)
    return code, out.getvalue(), err.getvalue()


async def test_the_next_line_answers_the_question_and_a_number_picks_a_choice(dirs: Dirs) -> None:
    async with open_scripted_server(_script) as url:
        code, out, err = await _run(dirs, url, b"2\n")
    assert code == 0, err
    assert "the model asks" in err and "Which database should I use?" in err and "2. postgres" in err
    assert "Noted. The user answered: postgres" in out


async def test_end_of_input_answers_that_there_is_no_answer(dirs: Dirs) -> None:
    async with open_scripted_server(_script) as url:
        code, out, err = await _run(dirs, url, b"")
    assert code == 0, err
    assert "Noted. The user answered: (the user's input ended without an answer)" in out


def _two_questions(request: IncomingRequest) -> ServerReply:
    last = request.last_message or {}
    if last.get("role") == "tool":
        answers = [str(m.get("content")) for m in request.messages if m.get("role") == "tool"]
        return ServerReply(text="Noted. " + " | ".join(answers))
    first = {"question": "Which database?", "choices": ["sqlite", "postgres"]}
    second = {"question": "Which colour for the logo?"}
    return ServerReply(
        tool_calls=(
            ServerToolCall(name="ask_user", arguments=first, id="ask-1"),
            ServerToolCall(name="ask_user", arguments=second, id="ask-2"),
        )
    )


async def test_two_questions_in_one_step_are_asked_in_turn(dirs: Dirs) -> None:
    async with open_scripted_server(_two_questions) as url:
        code, out, err = await _run(dirs, url, b"2\nblue\n")
    assert code == 0, err
    assert "the model asks (1 more question after this)" in err
    assert err.index("Which database?") < err.index("Which colour for the logo?")
    assert "The user answered: postgres | The user answered: blue" in out
