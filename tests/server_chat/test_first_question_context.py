"""A conversation's first question to a harness hands its Task's context to the responder (`QuestionWindow`): the
transaction that stored it knows all of it, so the responder's first reconcile takes it instead of reading it back.
What is handed over equals what `TaskApi.task_context` reads; it is taken once, kept for a bounded number of
questions, and only a first question to a harness leaves one (a later question or one to an operator is read)."""

from __future__ import annotations

from loopd.server.chat import QuestionWindow, TaskContext
from tests.server_http.support import Rig, ask, new_conversation


async def test_a_first_questions_context_is_handed_over_as_the_task_api_reads_it(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user, "plans")
    task_id = (await ask(user, cid, "plan a trip", target="harness:assistant"))["task_id"]
    handed = rig.chat.questions.handed_over(task_id)
    read = await rig.task_api.task_context(task_id)
    assert handed is not None
    assert handed == read  # conversation (as the question left it), input, response, history, fork: all equal
    assert [m.id for m in handed.history] == [handed.input.id] and not handed.has_earlier
    assert rig.chat.questions.handed_over(task_id) is None  # taken once

    second = (await ask(user, cid, "and the hotel?", target="harness:assistant"))["task_id"]
    assert rig.chat.questions.handed_over(second) is None  # not the first: its history is read

    other = await new_conversation(user, "echo")
    echoed = (await ask(user, other, "hello", target="operator:echo"))["task_id"]
    assert rig.chat.questions.handed_over(echoed) is None  # an operator reads its Task through the API


async def test_handed_over_contexts_are_bounded_oldest_first(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid, "one", target="harness:assistant"))["task_id"]
    context = await rig.task_api.task_context(task_id)
    window = QuestionWindow(kept=2)
    for name in ("t-1", "t-2", "t-3"):
        window.hand_over(TaskContext(name, context.conversation, context.input, context.response, [], False))
    assert window.handed_over("t-1") is None
    assert [c.task_id for c in (window.handed_over("t-2"), window.handed_over("t-3")) if c] == ["t-2", "t-3"]
