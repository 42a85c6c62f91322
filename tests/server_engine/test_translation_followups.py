"""`HarnessTranslator` and users' follow-ups (command ids ``followup:<key>``) on the main loop: a follow-up folded
into the call's turn changes nothing of its end; one still queued when the turn ends makes the next turn (which
the follow-ups start) the call's too; other queued inputs (a subagent's report) do not."""

from __future__ import annotations

from loopd.harness.core import Usage
from loopd.harness.core.events import InputQueued, InputsFolded, QueuedInput, TurnDone, TurnStarted
from loopd.server.engine import Finished, TextSet
from loopd.server.engine._translation import HarnessTranslator, followup_command_id


def _started(turn: str, *ids: str) -> TurnStarted:
    return TurnStarted(loop="main", turn_id=turn, inputs=tuple(QueuedInput(command_id=i, text=i) for i in ids), at=0.0)


def _done(turn: str, text: str) -> TurnDone:
    return TurnDone(loop="main", turn_id=turn, step=1, text=text, step_usage=Usage(), usage=Usage(), at=0.0)


def _finished(updates: list[object]) -> list[Finished]:
    return [u for u in updates if isinstance(u, Finished)]


def test_a_followup_queued_when_the_turn_ends_continues_the_call_into_the_next_turn() -> None:
    translator = HarnessTranslator(main_loop="main")
    key = followup_command_id("m1")
    translator.feed(_started("t1", "prompt"))
    translator.feed(InputQueued(loop="main", command_id=key, text="also bananas"))
    first = translator.feed(_done("t1", "first part"))
    assert not _finished(first) and not translator.finished  # the follow-up starts the next turn: go on
    translator.feed(_started("t2", key))
    second = translator.feed(_done("t2", "bananas"))
    assert _finished(second) == [Finished("bananas")] and translator.finished
    assert [u.text for u in second if isinstance(u, TextSet)] == ["first part\n\nbananas"]
    assert key in translator.followups


def test_a_followup_folded_into_the_turn_ends_the_call_with_that_turn() -> None:
    translator = HarnessTranslator(main_loop="main")
    key = followup_command_id("m1")
    translator.feed(_started("t1", "prompt"))
    translator.feed(InputQueued(loop="main", command_id=key, text="also bananas"))
    translator.feed(InputsFolded(loop="main", turn_id="t1", inputs=(QueuedInput(command_id=key, text="x"),)))
    assert _finished(translator.feed(_done("t1", "with bananas"))) == [Finished("with bananas")]


def test_other_queued_inputs_do_not_continue_the_call() -> None:
    translator = HarnessTranslator(main_loop="main")
    translator.feed(_started("t1", "prompt"))
    translator.feed(InputQueued(loop="main", command_id="agent-report:helper:1", text="report"))
    assert _finished(translator.feed(_done("t1", "done"))) == [Finished("done")]
