"""`loopd up` and `loopd server` pace the cyclic collector by their open answers (`paced_collections`)."""

from __future__ import annotations

import gc
import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from loopd._infra.clock import VirtualClock
from loopd.cli import _server, _up
from loopd.cli._server import paced_collections
from loopd.server.chat import OpenAnswers
from tests.support import cycles


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The test process's collector on before, and as it was after (the pacer turns it off and on)."""
    with cycles.collector_on():
        yield


def _server_with(answers: OpenAnswers | None) -> Any:
    return SimpleNamespace(chat=SimpleNamespace(answers=answers))


async def test_collections_wait_while_answers_are_open_for_the_block_only(collector_on: None) -> None:
    answers = OpenAnswers(VirtualClock())
    with paced_collections(_server_with(answers)) as pacer:
        assert pacer is not None
        answers.asked("t-1")
        assert not gc.isenabled()
        answers.answered("t-1")
        assert gc.isenabled()
        answers.asked("t-2")  # the server stops with an answer still open
    assert gc.isenabled() and not pacer.holding
    answers.answered("t-2")
    answers.asked("t-3")  # after the block nothing listens any more
    assert gc.isenabled() and pacer.deferrals == 2


def test_a_server_without_open_answers_is_not_paced() -> None:
    with paced_collections(_server_with(None)) as pacer:
        assert pacer is None


def test_both_serving_commands_pace_while_they_serve() -> None:
    for module, function in ((_up, _up._up), (_server, _server._serve)):
        assert "with paced_collections(server)" in inspect.getsource(function), module.__name__
