"""``LedgerFacts``: committed ledger facts that never change, remembered so that a writer need not read them again.

What it holds: the lane of a turn, action or attempt (an entity never moves to another lane), the session of a lane,
and the actors that exist. The ledger never updates or deletes these rows, so a fact read or written by a committed
transaction stays true for every later transaction, on any replica. Facts are added only once their transaction
surely committed (`remember_after_commit`: never after a rollback or an unknown outcome) and are bounded (the oldest
go first), so a process that forgets one reads it again.
Must not do: hold anything that can change (a lane's ``last_seq``, an attempt's progress) or do I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from loopd.server.storage import Transaction, TransactionCore

from ._vocabulary import SubjectKind

DEFAULT_LIMIT: Final = 8192
"""Facts of each kind kept (about 2,000 calls' worth of lanes, turns, actions and attempts)."""


class _Bounded:
    """A small LRU map (no I/O, no locking: one event loop owns it)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: OrderedDict[object, str] = OrderedDict()

    def get(self, key: object) -> str | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: object, value: str) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class LedgerFacts:
    """Immutable ledger facts one process has seen committed (see the module docstring). Share one per writer
    (e.g. per Harness Engine); never share it with a database other than the one it was learnt from."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._entities = _Bounded(limit)
        self._lanes = _Bounded(limit)
        self._actors = _Bounded(limit)

    def entity_lane(self, kind: SubjectKind, entity_id: str) -> str | None:
        """The lane of a turn, action or attempt, if known."""
        return self._entities.get((kind, entity_id))

    def lane_session(self, lane_id: str) -> str | None:
        """The session of a lane, if known."""
        return self._lanes.get(lane_id)

    def actor_exists(self, actor_id: str) -> bool:
        """True when the actor is known to exist (False: unknown, not absent)."""
        return self._actors.get(actor_id) is not None

    def add_entity(self, kind: SubjectKind, entity_id: str, lane_id: str) -> None:
        self._entities.put((kind, entity_id), lane_id)

    def add_lane(self, lane_id: str, session_id: str) -> None:
        self._lanes.put(lane_id, session_id)

    def add_actor(self, actor_id: str) -> None:
        self._actors.put(actor_id, actor_id)

    def __len__(self) -> int:
        return len(self._entities) + len(self._lanes) + len(self._actors)


def remember_after_commit(tx: TransactionCore, learn: Callable[[], None]) -> None:
    """Run ``learn`` once ``tx`` surely committed. A transaction that cannot tell (a bare `TransactionCore`) teaches
    nothing: the fact is read again next time."""
    if isinstance(tx, Transaction):
        tx.after_sure_commit(learn)
