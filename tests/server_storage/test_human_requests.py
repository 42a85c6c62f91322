"""Human Ask / Confirm: identity by effect key, a deadline fixed at first store, one immutable outcome."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.storage import (
    Conflict,
    Database,
    HumanRequest,
    InvalidRecord,
    NewHumanRequest,
    NewMessage,
    NotFound,
    Transaction,
)
from tests.server_storage.helpers import question, user_conversation

CHOICES = ({"value": "red", "label": "Red"}, {"value": "blue", "label": "Blue", "description": "calm"})


def ask(task_id: str, effect_key: str = "colour", message_id: str | None = None, **changes: Any) -> NewHumanRequest:
    base = NewHumanRequest(
        message_id=message_id or f"m-{effect_key}",
        task_id=task_id,
        conversation_id="c1",
        effect_key=effect_key,
        type="ask",
        title="Pick",
        prompt="Which colour?",
        timeout_seconds=60,
        asker_kind="operator",
        asker_key="router",
        choices=CHOICES,
    )
    return dataclasses.replace(base, **changes)


async def store_question(tx: Transaction, new: NewHumanRequest) -> tuple[HumanRequest, bool]:
    """The Human service's write: the request, and its message only when the request is new."""
    request, created = await tx.human_requests.create(new)
    if created:
        await tx.messages.insert(
            NewMessage(
                new.conversation_id,
                new.asker_kind,
                new.asker_key,
                "human_request",
                {"version": "1.1", "biz": "chat", "meta": {}, "blocks": []},
                task_id=new.task_id,
                status="streaming",
                human_due_at=request.due_at,
                id=new.message_id,
            )
        )
    return request, created


async def test_the_same_effect_key_and_parameters_return_the_original_question(
    db: Database, clock: VirtualClock
) -> None:
    async with db.transaction() as tx:
        conversation = await tx.conversations.create(actor_kind="user", actor_key="alice", id="c1")
        first, created = await store_question(tx, ask("t1"))
    assert created and first.outcome == "pending"
    assert first.created_at == clock.now() and (first.due_at - first.created_at).total_seconds() == 60
    await clock.advance(30)
    async with db.transaction() as tx:
        again, created = await store_question(tx, ask("t1", message_id="m-other"))  # a retry after a crash
        assert not created and again == first  # same message, same deadline: not extended by the retry
        assert len(await tx.messages.find_by_purpose("t1", "human_request")) == 1
        with pytest.raises(Conflict, match="different parameters"):
            await tx.human_requests.create(ask("t1", prompt="Which shade?"))
        other_task, created = await tx.human_requests.create(ask("t2", message_id="m-t2"))
        assert created and other_task.message_id == "m-t2"
    assert conversation.id == "c1"


@pytest.mark.parametrize(
    "changes",
    [
        {"timeout_seconds": 0},
        {"timeout_seconds": -5},
        {"timeout_seconds": float("inf")},
        {"timeout_seconds": float("nan")},
        {"choices": (), "allow_other": False},
        {"choices": ({"value": "a", "label": "A"}, {"value": "a", "label": "Again"})},
        {"choices": ({"value": "", "label": "Empty"},)},
        {"choices": ({"value": "x", "label": ""},)},
        {"type": "confirm"},
        {"type": "poll"},
        {"confirm_label": "Yes"},
        {"asker_kind": "assistant"},
        {"effect_key": ""},
    ],
)
async def test_invalid_questions_are_refused(db: Database, changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidRecord):
        async with db.transaction() as tx:
            await tx.human_requests.create(ask("t1", **changes))


async def test_the_three_ask_modes_and_a_confirm_are_accepted(db: Database) -> None:
    async with db.transaction() as tx:
        await tx.human_requests.create(ask("t1", "closed"))
        await tx.human_requests.create(ask("t1", "open", allow_other=True))
        await tx.human_requests.create(ask("t1", "free", choices=(), allow_other=True))
        confirm, _ = await tx.human_requests.create(
            ask("t1", "go", type="confirm", choices=(), confirm_label="Ship it", decline_label="Hold")
        )
        assert (confirm.confirm_label, confirm.decline_label, confirm.choices) == ("Ship it", "Hold", ())
        assert len(await tx.human_requests.list_pending(task_id="t1")) == 4


async def test_an_outcome_is_set_once_and_never_overwritten(db: Database) -> None:
    async with db.transaction() as tx:
        request, _ = await tx.human_requests.create(ask("t1"))
        answered, changed = await tx.human_requests.resolve(
            request.message_id, "success", value="red", resolved_by="human-1", reply_message_id="r1"
        )
        assert changed and (answered.outcome, answered.value, answered.resolved_by) == ("success", "red", "human-1")
        late, changed = await tx.human_requests.resolve(request.message_id, "timeout")
        assert not changed and late == answered
        contradicting, changed = await tx.human_requests.resolve(request.message_id, "success", value="blue")
        assert not changed and contradicting.value == "red"
        with pytest.raises(InvalidRecord):
            await tx.human_requests.resolve(request.message_id, "pending")
        with pytest.raises(InvalidRecord):
            await tx.human_requests.resolve(request.message_id, "success")  # success carries a value
        with pytest.raises(NotFound):
            await tx.human_requests.resolve("missing", "dismissed")


async def test_concurrent_answers_produce_exactly_one_outcome(db: Database) -> None:
    async with db.transaction() as tx:
        request, _ = await tx.human_requests.create(ask("t1"))
    attempts: list[tuple[str, Any]] = [
        ("success", "red"),
        ("success", "blue"),
        ("dismissed", None),
        ("timeout", None),
        ("failure", None),
        ("success", "red"),
    ]

    async def answer(outcome: str, value: Any) -> tuple[HumanRequest, bool]:
        async with db.transaction() as tx:
            return await tx.human_requests.resolve(
                request.message_id,
                outcome,  # type: ignore[arg-type]
                value=value,
                reason="task_ended" if outcome == "failure" else None,
            )

    results = await asyncio.gather(*(answer(o, v) for o, v in attempts))
    assert sum(changed for _, changed in results) == 1
    final = {(r.outcome, r.value, r.resolved_at) for r, _ in results}
    assert len(final) == 1  # every writer read back the single winner
    async with db.transaction(read_only=True) as tx:
        stored = await tx.human_requests.get(request.message_id)
    assert {(stored.outcome, stored.value, stored.resolved_at)} == final


async def test_due_requests_are_listed_and_pending_ones_fail_with_the_task(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        soon, _ = await tx.human_requests.create(ask("t1", "soon", timeout_seconds=10))
        later, _ = await tx.human_requests.create(ask("t1", "later", timeout_seconds=100))
        other, _ = await tx.human_requests.create(ask("t2", "other", timeout_seconds=5))
        assert await tx.human_requests.list_due() == []
    await clock.advance(20)
    async with db.transaction() as tx:
        assert [r.message_id for r in await tx.human_requests.list_due()] == [other.message_id, soon.message_id]
        await tx.human_requests.resolve(soon.message_id, "timeout")
        assert await tx.human_requests.count_pending("t1") == 1
        assert await tx.human_requests.fail_pending("t1") == 1
        failed = await tx.human_requests.get(later.message_id)
        assert (failed.outcome, failed.reason) == ("failure", "task_ended")
        assert (await tx.human_requests.get(soon.message_id)).outcome == "timeout"  # untouched
        assert await tx.human_requests.count_pending("t1") == 0
        assert [r.message_id for r in await tx.human_requests.list_pending()] == [other.message_id]


async def test_a_question_message_rolls_back_with_its_request(db: Database) -> None:
    async with db.transaction() as tx:
        conversation = await user_conversation(tx)
        await question(tx, conversation, "t1")
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await store_question(tx, ask("t1", conversation_id=conversation.id))
            raise RuntimeError("wake failed")
    async with db.transaction(read_only=True) as tx:
        assert await tx.human_requests.find("t1", "colour") is None
        assert await tx.messages.find_by_purpose("t1", "human_request") == []
