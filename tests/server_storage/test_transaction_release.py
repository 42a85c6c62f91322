"""An ended transaction is freed by reference counting: its repositories and its callbacks refer back to it, and
`Transaction.release` (the database calls it as the block ends, whatever the outcome) drops them. Left as cycles,
every transaction of a busy server waited for the cyclic collector (a dozen per chat)."""

from __future__ import annotations

import pytest

from loopd.server.storage import Database, Transaction
from loopd.server.storage._database import _REPOSITORIES
from tests.server_storage.helpers import user_conversation
from tests.support.cycles import Watch, collector_off


class Boom(Exception):
    pass


def test_every_repository_of_a_transaction_is_released() -> None:
    assert set(_REPOSITORIES) >= {"conversations", "messages", "message_events", "harness_calls", "leases"}


def _closures_over(tx: Transaction, seen: list[bool]) -> None:
    tx.after_commit(lambda: seen.append(tx.read_only))
    tx.after_sure_commit(lambda: seen.append(tx.outcome_unknown))


@pytest.mark.parametrize("ending", ["commit", "rollback", "read_only"])
async def test_an_ended_transaction_and_its_repositories_are_freed_without_the_collector(
    db: Database, ending: str
) -> None:
    watch = Watch()
    with collector_off():
        try:
            async with db.transaction(read_only=ending == "read_only") as tx:
                watch.add("transaction", tx)
                for name in _REPOSITORIES:
                    watch.add(name, getattr(tx, name))
                if ending != "read_only":
                    await user_conversation(tx)
                seen: list[bool] = []
                _closures_over(tx, seen)
                if ending == "rollback":
                    raise Boom
        except Boom:
            pass
        del tx
        assert watch.alive() == []
    assert seen == ([] if ending == "rollback" else [ending == "read_only", False])
