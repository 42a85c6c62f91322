"""Conversation titles: a background run after the first question writes a title and a summary, returned by the
conversations API; it starts when the first answer ends or after a delay, whichever is first (never beside the answer
it names, nor, once its answer ended, beside other answers still running); one cut off by a crash is resumed at
start-up; a model failure leaves no title (state failed)."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

from loopd.harness import ModelPermanentError, ModelRequest, Reply, ScriptedModel
from loopd.server.chat import ConversationTitles, demo_title_reply
from loopd.server.chat._titles import parse_title
from loopd.server.storage import Database, Transaction
from tests.server_http.support import Rig, ask, new_conversation


def _model(answer: str | None = None) -> ScriptedModel:
    def script(request: ModelRequest) -> Reply:
        if answer is None:
            return Reply(error=ModelPermanentError("no titles today"))
        return Reply(text=answer)

    return ScriptedModel(script, model_name="titles")


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.01)


def test_a_title_is_read_from_json_or_else_from_the_first_line() -> None:
    assert parse_title('```json\n{"title": " Trip  to Rome ", "summary": "Plan a\\ntrip."}\n```') == (
        "Trip to Rome",
        "Plan a trip.",
    )
    assert parse_title("Budget review\nmore words") == ("Budget review", "")
    assert parse_title("") == ("", "")
    assert len(parse_title("x" * 500)[0]) == 80
    request = ModelRequest(model="demo", messages=(), tools=())
    assert parse_title(demo_title_reply(request))[0] == "New conversation"


async def test_the_first_question_gets_a_title_and_summary_in_the_background(rig: Rig) -> None:
    model = _model('{"title": "Weekend in Lisbon", "summary": "The user plans a weekend trip."}')
    async with ConversationTitles(rig.db, model, clock=rig.clock, delay=0) as titles:
        rig.chat.asked = titles.note
        user = rig.client()
        cid = await new_conversation(user, "")
        await ask(user, cid, "help me plan a weekend in Lisbon")

        async def titled() -> bool:
            body = (await user.get(f"/v1/conversations/{cid}")).json()
            return bool(body["title"])

        await _until(titled)
        listed = (await user.get("/v1/conversations")).json()["data"][0]
        assert (listed["title"], listed["summary"]) == ("Weekend in Lisbon", "The user plans a weekend trip.")
        assert model.requests[0].messages[0].content == "help me plan a weekend in Lisbon"
        await ask(user, cid, "and a museum?")  # a titled conversation is not titled again
        await _until(lambda: _idle(titles))
        assert len(model.requests) == 1
        async with rig.db.transaction(read_only=True) as tx:
            assert (await tx.conversations.get(cid)).title_state == "done"


async def _idle(titles: ConversationTitles) -> bool:
    return not titles.lanes.busy


async def test_a_failed_title_run_is_recorded_and_the_chat_goes_on(rig: Rig) -> None:
    async with ConversationTitles(rig.db, _model(None), clock=rig.clock, delay=0) as titles:
        rig.chat.asked = titles.note
        user = rig.client()
        cid = await new_conversation(user, "")
        await ask(user, cid, "hello")

        async def failed() -> bool:
            async with rig.db.transaction(read_only=True) as tx:
                return (await tx.conversations.get(cid)).title_state == "failed"

        await _until(failed)
        assert (await user.get(f"/v1/conversations/{cid}")).json()["title"] == ""


async def test_a_title_run_cut_off_by_a_crash_is_resumed_at_start_up(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user, "")
    await ask(user, cid, "compare three laptops")
    async with rig.db.transaction() as tx:  # what a crash leaves: the run started, never ended
        await tx.conversations.set_title_state(cid, "running", run="run-1")
    model = _model('{"title": "Laptop comparison", "summary": "Three laptops compared."}')
    async with ConversationTitles(rig.db, model, clock=rig.clock) as titles:
        assert await titles.resume() == 1
        await _until(lambda: _idle(titles))
    async with rig.db.transaction(read_only=True) as tx:
        conversation = await tx.conversations.get(cid)
    assert (conversation.title, conversation.title_state, conversation.title_run) == (
        "Laptop comparison",
        "done",
        "run-1",
    )


async def test_a_title_waits_for_the_first_answer_or_the_delay(rig: Rig) -> None:
    model = _model('{"title": "Soup", "summary": "A recipe."}')
    async with ConversationTitles(rig.db, model, clock=rig.clock, delay=5.0) as titles:
        rig.chat.asked = titles.note
        user = rig.client()
        first, second = await new_conversation(user, ""), await new_conversation(user, "")
        await ask(user, first, "a soup recipe")
        await ask(user, second, "another soup recipe")
        await ask(user, second, "with lentils")  # still one title waiting for this conversation
        await rig.clock.advance(4.9)
        assert model.requests == [] and not titles.lanes.busy  # both answers still running: nothing started

        titles.answered(first)  # the first conversation's answer ended: its title starts now
        await _until(lambda: _title_state(rig, first, "done"))
        assert len(model.requests) == 1 and await _title_state(rig, second, "")

        await rig.clock.advance(0.2)  # the second answer runs on: its title starts once the delay has passed
        await _until(lambda: _title_state(rig, second, "done"))
        titles.answered(second)  # a late end of its answer starts nothing more
        await _until(lambda: _idle(titles))
        assert len(model.requests) == 2


async def _title_state(rig: Rig, conversation_id: str, state: str) -> bool:
    async with rig.db.transaction(read_only=True) as tx:
        return (await tx.conversations.get(conversation_id)).title_state == state


async def test_a_completed_answer_starts_the_title_at_once(rig: Rig) -> None:
    model = _model('{"title": "Tea", "summary": "About tea."}')
    async with ConversationTitles(rig.db, model, clock=rig.clock, delay=3600.0) as titles:
        rig.chat.asked = titles.note
        rig.task_api.answered = titles.answered  # as loopd up and loopd server wire it
        user = rig.client()
        cid = await new_conversation(user, "")
        task_id = (await ask(user, cid, "green or black tea?"))["task_id"]
        assert model.requests == []
        await rig.task_api.complete(task_id)  # the answer ended (the delay is an hour of virtual time away)
        await _until(lambda: _title_state(rig, cid, "done"))


async def test_a_title_whose_answer_ended_waits_while_the_server_answers_others(rig: Rig) -> None:
    model = _model('{"title": "Bikes", "summary": "About bikes."}')
    answering = True  # other answers still running (the engine's calls, as loopd up wires it)
    async with ConversationTitles(rig.db, model, clock=rig.clock, delay=5.0) as titles:
        titles.busy = lambda: answering
        rig.chat.asked = titles.note
        user = rig.client()
        first, second = await new_conversation(user, ""), await new_conversation(user, "")
        await ask(user, first, "which bike?")
        await ask(user, second, "which helmet?")
        titles.answered(first)  # its answer ended, others still run: the title waits
        titles.idle()  # a call ended but the server is still busy: nothing starts either
        await asyncio.sleep(0.05)
        assert model.requests == [] and not titles.lanes.busy

        answering = False
        titles.idle()  # the last call ended: the waiting title starts; the other one still waits for its answer
        await _until(lambda: _title_state(rig, first, "done"))
        assert len(model.requests) == 1 and await _title_state(rig, second, "")

        answering = True
        titles.answered(second)
        await rig.clock.advance(5.0)  # the server never goes idle: the deadline starts it anyway
        await _until(lambda: _title_state(rig, second, "done"))
        titles.idle()
        await _until(lambda: _idle(titles))
        assert len(model.requests) == 2

        third, fourth = await new_conversation(user, ""), await new_conversation(user, "")
        await ask(user, third, "which lock?")
        await ask(user, fourth, "which light?")
        titles.answered(third)  # still busy: waits
        answering = False
        titles.answered(fourth)  # the last answer ended and nothing else runs: both waiting titles start
        await _until(lambda: _title_state(rig, third, "done"))
        await _until(lambda: _title_state(rig, fourth, "done"))


class _CountingDatabase:
    """The rig's database, counting the transactions the title runs open (read-only and writing)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.reads = 0
        self.writes = 0

    def transaction(self, *, read_only: bool = False) -> AbstractAsyncContextManager[Transaction]:
        if read_only:
            self.reads += 1
        else:
            self.writes += 1
        return self._db.transaction(read_only=read_only)


async def test_a_first_questions_title_reads_nothing_and_ends_in_the_write_of_its_title(rig: Rig) -> None:
    counting = _CountingDatabase(rig.db)
    model = _model('{"title": "Kites", "summary": "How kites fly."}')
    async with ConversationTitles(cast(Database, counting), model, clock=rig.clock, delay=0) as titles:
        rig.chat.asked = titles.note
        user = rig.client()
        cid = await new_conversation(user, "")
        await ask(user, cid, "why do kites fly?")
        await _until(lambda: _title_state(rig, cid, "done"))
        await _until(lambda: _idle(titles))
    assert model.requests[0].messages[0].content == "why do kites fly?"
    # running (with the run's id), then title + summary + done in one transaction; the question was kept, not read
    assert (counting.reads, counting.writes) == (0, 2)
    async with rig.db.transaction(read_only=True) as tx:
        conversation = await tx.conversations.get(cid)
    assert (conversation.title, conversation.summary, conversation.title_state) == ("Kites", "How kites fly.", "done")


async def test_a_later_question_titles_the_conversation_by_its_first_one(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user, "")
    await ask(user, cid, "first: a bread recipe")  # no titles yet (as when the queue was full)
    counting = _CountingDatabase(rig.db)
    model = _model('{"title": "Bread", "summary": "A recipe."}')
    async with ConversationTitles(cast(Database, counting), model, clock=rig.clock, delay=0) as titles:
        rig.chat.asked = titles.note
        await ask(user, cid, "second: with rye?")
        await _until(lambda: _title_state(rig, cid, "done"))
        await _until(lambda: _idle(titles))
    assert model.requests[0].messages[0].content == "first: a bread recipe"
    assert (counting.reads, counting.writes) == (1, 2)
