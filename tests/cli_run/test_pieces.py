"""The pieces of `loopd run` that need no process: line input, answer parsing, shortening, plain-text output."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from loopd._infra.clock import settle
from loopd.cli._run_conversation import parse_gate_answer
from loopd.cli._run_input import InputInterrupted, LineInput
from loopd.cli._run_view import RunView, shorten
from loopd.harness import ToolOutcome
from loopd.harness.gate import GateAnswer


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


async def test_lines_from_a_pipe_split_anywhere(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    reader = LineInput(read_fd, interactive=False)
    data = "first\r\nsecond “quoted”\nlast without newline".encode()
    pending = asyncio.create_task(reader.readline())
    for i in range(0, len(data), 5):  # splits a multi-byte character too
        os.write(write_fd, data[i : i + 5])
        await asyncio.sleep(0)
    os.close(write_fd)
    assert await asyncio.wait_for(pending, 30) == "first"
    assert await asyncio.wait_for(reader.readline(), 30) == "second “quoted”"
    assert await asyncio.wait_for(reader.readline(), 30) == "last without newline"
    assert await asyncio.wait_for(reader.readline(), 30) is None
    assert await asyncio.wait_for(reader.readline(), 30) is None


async def test_interrupt_wakes_a_pending_read_and_reading_goes_on(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    reader = LineInput(read_fd, interactive=False)
    pending = asyncio.create_task(reader.readline())
    await settle()  # nothing was written: the read cannot end on its own
    assert not pending.done()
    reader.interrupt()
    with pytest.raises(InputInterrupted):
        await asyncio.wait_for(pending, 30)
    os.write(write_fd, b"after\n")
    assert await asyncio.wait_for(reader.readline(), 30) == "after"


async def test_a_regular_file_is_read_without_polling(tmp_path: Path) -> None:
    path = tmp_path / "input.txt"
    path.write_text("one\ntwo\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = LineInput(fd, interactive=False)
        assert [await reader.readline() for _ in range(3)] == ["one", "two", None]
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("typed", "answer"),
    [
        ("a", GateAnswer.APPROVE),
        (" A ", GateAnswer.APPROVE),
        ("yes", GateAnswer.APPROVE),
        ("l", GateAnswer.APPROVE_ALWAYS),
        ("always", GateAnswer.APPROVE_ALWAYS),
        ("d", GateAnswer.DENY),
        ("no", GateAnswer.DENY),
        ("", None),
        ("al", None),
        ("approve always please", None),
    ],
)
def test_gate_answers(typed: str, answer: GateAnswer | None) -> None:
    assert parse_gate_answer(typed) is answer


def test_shorten_says_what_it_left_out() -> None:
    assert shorten("one\ntwo") == "one\ntwo"
    assert shorten("\n".join(str(i) for i in range(10)), lines=3) == "0\n1\n2\n… (+7 more lines)"
    assert shorten("x" * 50, width=10) == "x" * 9 + "…"


def test_text_from_tools_and_models_is_never_markup() -> None:
    err, out = io.StringIO(), io.StringIO()
    view = RunView(console=Console(file=err, width=200), out=out)
    view.text("answer with [bold]brackets[/bold]")
    view.tool_completed(ToolOutcome(call_id="c1", name="read_file", status="ok", output="[red]not red[/red]"))
    view.close()
    assert out.getvalue() == "answer with [bold]brackets[/bold]\n"  # the open answer line is ended first
    assert "✓ read_file → [red]not red[/red]" in err.getvalue()


def test_a_log_line_waits_for_the_end_of_the_answer_it_would_split() -> None:
    err, out, logs = io.StringIO(), io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(logs)  # the view guards the root logger's handlers: this one stands for the CLI's
    root = logging.getLogger()
    root.addHandler(handler)
    logger = logging.getLogger("tests.cli_run.split")
    try:
        view = RunView(console=Console(file=err, width=200), out=out)
        with view.holding_log_lines():
            view.text("You said: “h")
            logger.warning("model x is not in the price table")  # the model client logs as its stream ends
            view.text("ello after”\n\nmore")
            other = threading.Thread(target=logger.warning, args=("from another thread",))
            other.start()
            other.join()
            assert logs.getvalue() == "from another thread\n"  # only the view's own thread is held back
            view.note("  ✓ done")
            assert logs.getvalue() == "from another thread\nmodel x is not in the price table\n"
            logger.warning("between answers")  # no answer open: written at once
            assert logs.getvalue().endswith("between answers\n")
            view.text("cut short")
            logger.warning("left at the end")
            view.close()
            assert logs.getvalue().endswith("left at the end\n")
            view.text("again")
            logger.warning("held at the block's end")
        assert logs.getvalue().endswith("held at the block's end\n")  # the block's end writes what it still holds
        logger.warning("after the block")
        assert logs.getvalue().endswith("after the block\n")
        assert out.getvalue() == "You said: “hello after”\n\nmore\ncut short\nagain"
    finally:
        root.removeHandler(handler)
