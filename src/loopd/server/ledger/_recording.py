"""Write-before-execute helpers: events for an attempt's lifecycle, and ``LaneRecorder``.

The rule: append ``attempt.requested`` *before* the external call, and a terminal event (``attempt.completed``
or ``attempt.failed``) after it. An attempt whose request is stored without a terminal event is unresolved:
after a crash, nobody knows whether its effect happened, so it is surfaced (``unresolved_attempts``) and never
silently repeated unless its action's idempotency makes that safe.
Must not do: run the external call (the caller does) or retry an unknown effect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from loopd._infra.ids import new_id

from ._errors import LaneConflict
from ._records import AppendReceipt, Attempt, Lane, NewEvent, Usage
from ._store import LedgerStore
from ._vocabulary import EventType


def requested(attempt: Attempt, actor_id: str, *, payload: dict[str, Any] | None = None) -> NewEvent:
    """``attempt.requested``: append it before the external call starts."""
    return NewEvent(str(EventType.ATTEMPT_REQUESTED), attempt.id, actor_id, payload=dict(payload or {}))


def completed(
    attempt: Attempt,
    actor_id: str,
    *,
    usage: Usage | None = None,
    payload: dict[str, Any] | None = None,
    causation_id: str | None = None,
) -> NewEvent:
    """``attempt.completed``; ``usage`` goes to ``payload["usage"]``, which the cost roll-ups sum."""
    body = dict(payload or {})
    if usage is not None:
        body["usage"] = usage.to_payload()
    return NewEvent(str(EventType.ATTEMPT_COMPLETED), attempt.id, actor_id, payload=body, causation_id=causation_id)


def failed(
    attempt: Attempt,
    actor_id: str,
    *,
    error: dict[str, Any],
    payload: dict[str, Any] | None = None,
    causation_id: str | None = None,
    usage: Usage | None = None,
    usage_estimated: bool = False,
) -> NewEvent:
    """``attempt.failed`` with ``payload["error"]`` (e.g. ``{"code": …, "message": …}``) and, when given, what
    the failed try spent (``usage``, summed by the roll-ups); ``usage_estimated`` marks it as an estimate, or
    — without ``usage`` — as unknown."""
    body = {**(payload or {}), "error": error}
    if usage is not None:
        body["usage"] = usage.to_payload()
    if usage_estimated:
        body["usage_estimated"] = True
        body.setdefault("usage", None)
    return NewEvent(str(EventType.ATTEMPT_FAILED), attempt.id, actor_id, payload=body, causation_id=causation_id)


class LaneRecorder:
    """Serializes the appends of one writer to one lane and caches the lane head.

    On ``LaneConflict`` (another writer moved the lane) the head is reloaded and the error re-raised: the caller
    re-reads and decides again. After an error whose outcome is unknown (``StorageUnavailable``), retry with the
    same ``append_id`` (``receipt`` or the id passed in): the store answers with the original receipt if the
    first try did land.
    """

    def __init__(self, store: LedgerStore, lane: Lane) -> None:
        self._store = store
        self._lane_id = lane.id
        self._last_seq = lane.last_seq
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, store: LedgerStore, lane_id: str) -> LaneRecorder:
        return cls(store, await store.get_lane(lane_id))

    @property
    def lane_id(self) -> str:
        return self._lane_id

    @property
    def last_seq(self) -> int:
        return self._last_seq

    async def append(self, events: Sequence[NewEvent], *, append_id: str | None = None) -> AppendReceipt:
        async with self._lock:
            append_id = append_id or new_id()
            try:
                receipt = await self._store.append(self._lane_id, self._last_seq, append_id, events)
            except LaneConflict:
                self._last_seq = (await self._store.get_lane(self._lane_id)).last_seq
                raise
            self._last_seq = max(self._last_seq, receipt.last_seq)
            return receipt

    async def request(self, attempt: Attempt, actor_id: str, *, payload: dict[str, Any] | None = None) -> AppendReceipt:
        """Record ``attempt.requested``: call before the external call starts."""
        return await self.append([requested(attempt, actor_id, payload=payload)])

    async def complete(
        self, attempt: Attempt, actor_id: str, *, usage: Usage | None = None, payload: dict[str, Any] | None = None
    ) -> AppendReceipt:
        return await self.append([completed(attempt, actor_id, usage=usage, payload=payload)])

    async def fail(
        self, attempt: Attempt, actor_id: str, *, error: dict[str, Any], payload: dict[str, Any] | None = None
    ) -> AppendReceipt:
        return await self.append([failed(attempt, actor_id, error=error, payload=payload)])
