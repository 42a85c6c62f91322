"""The ledger's reads of one Task, conversation or call are found from that scope's lanes, never by scanning.

Every harness call's end reads its unresolved attempts and its usage; when those reads searched every
``attempt.requested`` event in the database (the planner's choice for a join written events-first), each call's
end cost grew with everything the server ever ran (36 ms per call at 1,700 calls). SQLite plans without statistics
by fixed rules, so the plan of each statement on an empty database is the plan it gets at any size: this test asks
SQLite for the plan of every statement the scope reads run and refuses a full scan of a ledger table or an index
search bounded only by an event type. (PostgreSQL plans from its statistics; the same statements give it the lane
filter first too.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from loopd.server.ledger import Scope, SqlLedgerStore
from loopd.server.storage import Database
from loopd.server.storage._tx import TransactionCore


class _Recording:
    """A transaction that remembers every statement a ledger read runs (and runs it)."""

    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.statements.append((sql, tuple(params)))
        return await self._tx.fetch(sql, params)

    async def fetch_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self.statements.append((sql, tuple(params)))
        return await self._tx.fetch_one(sql, params)


def _bad_steps(plan: list[str]) -> list[str]:
    """Plan steps that visit rows of a ledger table not reached from the scope's lanes: a full scan, or an index
    search bounded only by the event type (every event of that type in the database)."""
    return [step for step in plan if step.startswith("SCAN ") or "(event_type=?)" in step]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "scope",
    [Scope(task_id="t1"), Scope(conversation_id="c1"), Scope(harness_call_id="h1")],
    ids=["task", "conversation", "call"],
)
async def test_scope_reads_start_from_the_scope_lanes(db: Database, scope: Scope) -> None:
    async with db.transaction(read_only=True) as tx:
        recording = _Recording(tx)
        store = SqlLedgerStore(transaction=recording)  # type: ignore[arg-type]
        await store.unresolved_attempts(scope)
        await store.usage(scope)
        await store.structure(scope)
        await store.find_lanes(scope)
        await store.load_session("s1")
        await store.load_run("s1", "r1")
        assert len(recording.statements) >= 9
        for sql, params in recording.statements:
            rows = await tx.fetch("EXPLAIN QUERY PLAN " + sql, params)
            plan = [str(row[-1]) for row in rows]
            assert not _bad_steps(plan), f"{sql}\n" + "\n".join(plan)
