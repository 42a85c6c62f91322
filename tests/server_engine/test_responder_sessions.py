"""A conversation's later questions go on from the harness session of that harness's last answer (the responder's
continuation): the call starts as a fork at the end of that session, its history only what was said since. It
starts afresh from the visible history when that answer did not end well, its session is not settled, the harness
cannot fork, or continuing is off; a follow-up handed to the earlier call is not sent again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loopd.resources.client import TASKS, StoreClient
from loopd.server.engine import MODE_OPTION, AdapterRequest, Failed, Finished, HarnessEngine, TextSet
from loopd.server.responder import FOLLOWUP_ANSWER
from loopd.server.responder._responder import HISTORY_PROBE
from loopd.server.storage import Database, NewMessage
from loopd.server.streams import empty_model, open_message

from .conftest import ScriptedAdapter, new_conversation, scripted, until
from .test_responder import StorageChat, _gone, _question, _responding, _task


@dataclass
class ForkingAdapter(ScriptedAdapter):
    """A scripted harness that forks: each session ends settled at seq ``end`` (None: never settled)."""

    end: int | None = 7
    ends_asked: list[str] = field(default_factory=list)

    @property
    def supports_forks(self) -> bool:
        return True

    async def end_point(self, request: AdapterRequest, session_id: str) -> int | None:
        self.ends_asked.append(session_id)
        return self.end


@dataclass
class Sessions:
    db: Database
    client: StoreClient
    engine: HarnessEngine
    adapter: ForkingAdapter
    chat: StorageChat
    conversation: str = ""

    async def answer(self, task_id: str, text: str) -> dict[str, Any]:
        """Ask ``text`` in the conversation as Task ``task_id``, wait until it is answered, return its call's params."""
        response = await _question(self.db, self.conversation, task_id, text, "assistant")
        await self.client.create(TASKS, _task(task_id, "assistant"), namespace="default")
        await until(lambda: _gone(self.client, task_id))
        call = await self.engine.call_for_message(response)
        assert call is not None
        return dict(call.params)

    async def say(self, kind: str, key: str, text: str, *, task_id: str | None = None, purpose: str = "input") -> None:
        """A message by someone else, already complete."""
        async with self.db.transaction() as tx:
            await open_message(
                tx,
                NewMessage(
                    conversation_id=self.conversation,
                    kind=kind,  # type: ignore[arg-type]
                    key=key,
                    purpose=purpose,  # type: ignore[arg-type]
                    content={**empty_model(), "blocks": [{"id": "text", "type": "text", "content": text}]},
                    task_id=task_id,
                ),
            )


async def _sessions(
    sqlite_db: Database, tmp_path: Path, adapter: ForkingAdapter, **options: Any
) -> AsyncIterator[Sessions]:
    async with _responding(sqlite_db, tmp_path, adapter, context_retry=0.05, **options) as it:
        assert it.engine is not None and it.chat is not None
        yield Sessions(sqlite_db, it.client, it.engine, adapter, it.chat, await new_conversation(sqlite_db))


def _answering() -> ForkingAdapter:
    return ForkingAdapter(script=scripted(TextSet("fine"), Finished("fine")))


@pytest.fixture
async def sessions(sqlite_db: Database, tmp_path: Path) -> AsyncIterator[Sessions]:
    async for world in _sessions(sqlite_db, tmp_path, _answering()):
        yield world


def _texts(params: Mapping[str, Any]) -> list[str]:
    return [entry["text"] for entry in params.get("history", [])]


async def test_a_later_question_goes_on_from_the_last_answers_session(sessions: Sessions) -> None:
    first = await sessions.answer("t-1", "apples?")
    assert "fork" not in first and _texts(first) == [] and first["params"] == {}
    second = await sessions.answer("t-2", "pears?")
    call_1, call_2 = sessions.adapter.starts
    assert second["fork"] == {"session": f"scripted/{call_1}", "seq": 7}
    assert _texts(second) == []  # nothing was said since that answer: the session holds the rest
    assert second["params"] == {MODE_OPTION: ""}  # the harness's own mode, not the one that session ended in
    third = await sessions.answer("t-3", "plums?")
    assert third["fork"]["session"] == f"scripted/{call_2}"  # the chain goes on from the latest answer
    assert sessions.adapter.ends_asked == [f"scripted/{call_1}", f"scripted/{call_2}"]


async def test_what_others_said_since_the_last_answer_is_the_next_calls_history(sessions: Sessions) -> None:
    await sessions.answer("t-1", "apples?")
    await sessions.say("operator", "router", "the pears are on their way")
    await sessions.say("user", "bob", "make it quick")
    second = await sessions.answer("t-2", "pears?")
    assert second["fork"]["session"] == f"scripted/{sessions.adapter.starts[0]}"
    assert _texts(second) == ["the pears are on their way", "make it quick"]  # not apples?, not its answer


async def test_a_followup_handed_to_the_earlier_call_is_not_sent_again(sessions: Sessions) -> None:
    await sessions.answer("t-1", "apples?")
    # A follow-up that went into the earlier call: its input, and its response saying so (both complete).
    await sessions.say("user", "alice", "green ones", task_id="t-f")
    await sessions.say("harness", "assistant", FOLLOWUP_ANSWER, task_id="t-f", purpose="response")
    await sessions.say("user", "bob", "and red ones")
    second = await sessions.answer("t-2", "pears?")
    assert second["fork"]["session"] == f"scripted/{sessions.adapter.starts[0]}"  # not the follow-up's answer
    assert _texts(second) == ["and red ones"]


async def test_after_an_answer_that_failed_the_next_call_starts_afresh(sqlite_db: Database, tmp_path: Path) -> None:
    outcomes = iter([[Failed("turn_failed", "model exploded")], [TextSet("fine"), Finished("fine")]])
    adapter = ForkingAdapter(script=lambda _call_id: next(outcomes))
    async for world in _sessions(sqlite_db, tmp_path, adapter):
        await world.answer("t-1", "apples?")
        second = await world.answer("t-2", "pears?")
        assert "fork" not in second and second["params"] == {}
        assert _texts(second) == ["apples?"]  # the visible history, as for any fresh call
        assert adapter.ends_asked == []


async def test_a_session_that_did_not_end_settled_is_not_gone_on_from(sqlite_db: Database, tmp_path: Path) -> None:
    adapter = _answering()
    adapter.end = None
    async for world in _sessions(sqlite_db, tmp_path, adapter):
        await world.answer("t-1", "apples?")
        second = await world.answer("t-2", "pears?")
        assert "fork" not in second and _texts(second)[0] == "apples?"
        assert adapter.ends_asked == [f"scripted/{adapter.starts[0]}"]


async def test_continuing_can_be_turned_off(sqlite_db: Database, tmp_path: Path) -> None:
    adapter = _answering()
    async for world in _sessions(sqlite_db, tmp_path, adapter, continue_sessions=False):
        await world.answer("t-1", "apples?")
        second = await world.answer("t-2", "pears?")
        assert "fork" not in second and _texts(second)[0] == "apples?"
        assert adapter.ends_asked == []


async def test_in_a_long_conversation_only_the_newest_messages_are_read_when_the_harness_answered_among_them(
    sessions: Sessions,
) -> None:
    for index in range(HISTORY_PROBE + 4):
        await sessions.say("user", "bob", f"note {index}")
    first = await sessions.answer("t-1", "apples?")
    assert sessions.chat.history_limits == [HISTORY_PROBE, None]  # not answered among the newest: all of it
    assert _texts(first)[0] == "note 0"
    sessions.chat.history_limits.clear()
    await sessions.say("operator", "router", "the pears are on their way")
    second = await sessions.answer("t-2", "pears?")
    assert sessions.chat.history_limits == [HISTORY_PROBE]  # the session of t-1's answer holds everything before
    assert second["fork"]["session"] == f"scripted/{sessions.adapter.starts[0]}"
    assert _texts(second) == ["the pears are on their way"]


async def test_when_a_long_conversation_cannot_go_on_from_the_answer_its_whole_history_is_read(
    sqlite_db: Database, tmp_path: Path
) -> None:
    outcomes = iter([[Failed("turn_failed", "model exploded")], [TextSet("fine"), Finished("fine")]])
    adapter = ForkingAdapter(script=lambda _call_id: next(outcomes))
    async for world in _sessions(sqlite_db, tmp_path, adapter):
        for index in range(HISTORY_PROBE + 4):
            await world.say("user", "bob", f"note {index}")
        await world.answer("t-1", "apples?")
        world.chat.history_limits.clear()
        second = await world.answer("t-2", "pears?")
        assert world.chat.history_limits == [HISTORY_PROBE, None]  # its answer failed: afresh, from all of it
        assert "fork" not in second
        assert _texts(second) == [*(f"note {index}" for index in range(HISTORY_PROBE + 4)), "apples?"]
