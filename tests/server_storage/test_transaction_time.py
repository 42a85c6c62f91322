"""A transaction's time: every `now()` of one transaction is the instant it first asked the clock (as PostgreSQL's
``now()`` is the transaction's start); the next transaction asks again."""

from __future__ import annotations

from loopd._infra.clock import VirtualClock
from loopd.server.storage import Database


async def test_one_transaction_writes_one_instant_and_the_next_asks_the_clock_again(
    db: Database, clock: VirtualClock
) -> None:
    async with db.transaction() as tx:
        first = tx.now()
        await clock.advance(5.0)
        assert tx.now() == first  # the same instant for everything this transaction writes
        conversation = await tx.conversations.create(actor_kind="user", actor_key="alice")
    assert conversation.created_at == first
    async with db.transaction() as tx:
        assert (tx.now() - first).total_seconds() == 5.0
