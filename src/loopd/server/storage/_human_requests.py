"""Human Ask / Confirm requests and their one immutable outcome.

Table ``human_requests`` (message_id PRIMARY KEY — the ``human_request`` message —, task_id, conversation_id,
effect_key, params_hash, request_type, title, prompt, choices JSON, allow_other, confirm/decline labels, asker,
timeout_seconds, due_at, outcome, outcome_value JSON, outcome_reason, reply_message_id, resolved_by,
resolved_at, created_at; UNIQUE (task_id, effect_key)).

Rules: the same (task, effect key) with the same parameters is the same question (its original deadline and
state are returned); different parameters are a ``Conflict``. ``due_at`` is fixed when first stored. The outcome
goes from ``pending`` to exactly one terminal value, once: the write is a conditional update on
``outcome = 'pending'``, so concurrent writers on either backend produce one winner and every loser reads the
winner's outcome back.
Must not do: decide who may answer (the Human service checks identity and ``reply_to_message_id``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from ._errors import Conflict, InvalidRecord, NotFound
from ._records import (
    HUMAN_REQUEST_TYPES,
    HUMAN_TERMINAL_OUTCOMES,
    MESSAGE_KINDS,
    HumanOutcome,
    HumanRequest,
    HumanRequestType,
    MessageKind,
    NewHumanRequest,
)
from ._tx import TransactionCore
from ._values import (
    digest,
    dumps,
    loads,
    optional_time,
    page_limit,
    parse_time,
    require_choice,
    require_text,
    seconds,
    time_text,
)

_COLUMNS = (
    "message_id, task_id, conversation_id, effect_key, params_hash, request_type, title, prompt, choices, "
    "allow_other, confirm_label, decline_label, asker_kind, asker_key, timeout_seconds, due_at, outcome, "
    "outcome_value, outcome_reason, reply_message_id, resolved_by, resolved_at, created_at"
)


def _request(row: tuple[Any, ...]) -> HumanRequest:
    return HumanRequest(
        message_id=str(row[0]),
        task_id=str(row[1]),
        conversation_id=str(row[2]),
        effect_key=str(row[3]),
        params_hash=str(row[4]),
        type=cast(HumanRequestType, row[5]),
        title=str(row[6]),
        prompt=str(row[7]),
        choices=tuple(loads(row[8])),
        allow_other=bool(row[9]),
        confirm_label=row[10],
        decline_label=row[11],
        asker_kind=cast(MessageKind, row[12]),
        asker_key=str(row[13]),
        timeout_seconds=float(row[14]),
        due_at=parse_time(row[15]),
        outcome=cast(HumanOutcome, row[16]),
        value=loads(row[17]),
        reason=row[18],
        reply_message_id=row[19],
        resolved_by=row[20],
        resolved_at=optional_time(row[21]),
        created_at=parse_time(row[22]),
    )


def _validate(new: NewHumanRequest) -> None:
    for what in ("message_id", "task_id", "conversation_id", "effect_key", "title", "asker_key"):
        require_text(getattr(new, what), f"human request {what}")
    if not isinstance(new.prompt, str):
        raise InvalidRecord("human request prompt must be a string")
    require_choice(new.type, HUMAN_REQUEST_TYPES, "human request type")
    require_choice(new.asker_kind, MESSAGE_KINDS, "human request asker_kind")
    seconds(new.timeout_seconds, "human request timeout")
    if new.type == "confirm":
        if new.choices or new.allow_other:
            raise InvalidRecord("a confirm takes neither choices nor allow_other")
        return
    if new.confirm_label is not None or new.decline_label is not None:
        raise InvalidRecord("confirm and decline labels belong to a confirm, not an ask")
    if not new.choices and not new.allow_other:
        raise InvalidRecord("an ask needs choices, allow_other, or both")
    values: set[str] = set()
    for choice in new.choices:
        if not isinstance(choice, dict):
            raise InvalidRecord("each choice must be an object with value and label")
        value, label = choice.get("value"), choice.get("label")
        if not isinstance(value, str) or not value or not isinstance(label, str) or not label:
            raise InvalidRecord("each choice needs a non-empty value and label")
        if value in values:
            raise InvalidRecord(f"choice value {value!r} appears twice")
        values.add(value)


class HumanRequests:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def create(self, new: NewHumanRequest) -> tuple[HumanRequest, bool]:
        """Store a question, or return the one already stored under (task, effect key); ``(request, created)``.

        Different parameters under the same identity are a ``Conflict``. Store the ``human_request`` message in
        the same transaction only when ``created`` is true.
        """
        _validate(new)
        params_hash = digest(new.params())
        now = self._tx.now()
        due_at = now + seconds(new.timeout_seconds, "human request timeout")
        inserted = await self._tx.execute(
            f"INSERT INTO human_requests ({_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, NULL, NULL, ?) "
            "ON CONFLICT DO NOTHING",
            (
                new.message_id,
                new.task_id,
                new.conversation_id,
                new.effect_key,
                params_hash,
                new.type,
                new.title,
                new.prompt,
                dumps(list(new.choices)),
                bool(new.allow_other),
                new.confirm_label,
                new.decline_label,
                new.asker_kind,
                new.asker_key,
                float(new.timeout_seconds),
                time_text(due_at),
                time_text(now),
            ),
        )
        if inserted == 1:
            return await self.get(new.message_id), True
        existing = await self.find(new.task_id, new.effect_key)
        if existing is None:
            raise Conflict(f"message {new.message_id} already carries another human request")
        if existing.params_hash != params_hash:
            raise Conflict(
                f"task {new.task_id} already asked {new.effect_key!r} with different parameters; "
                "use a new effect key for a new question"
            )
        return existing, False

    async def get(self, message_id: str) -> HumanRequest:
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM human_requests WHERE message_id = ?", (message_id,))
        if row is None:
            raise NotFound(f"human request {message_id} not found")
        return _request(row)

    async def find(self, task_id: str, effect_key: str) -> HumanRequest | None:
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM human_requests WHERE task_id = ? AND effect_key = ?", (task_id, effect_key)
        )
        return None if row is None else _request(row)

    async def resolve(
        self,
        message_id: str,
        outcome: HumanOutcome,
        *,
        value: Any = None,
        reason: str | None = None,
        resolved_by: str | None = None,
        reply_message_id: str | None = None,
    ) -> tuple[HumanRequest, bool]:
        """Set the terminal outcome if none is set yet; returns ``(request, changed)``.

        When an outcome is already stored it is returned unchanged with ``changed=False``: a second, late or
        contradictory answer never overwrites the first.
        """
        require_choice(outcome, HUMAN_TERMINAL_OUTCOMES, "human outcome")
        if reason is not None and not isinstance(reason, str):
            raise InvalidRecord("outcome reason must be a string")
        if outcome == "success" and value is None:
            raise InvalidRecord("a success outcome carries a value")
        if outcome == "failure" and not reason:
            raise InvalidRecord("a failure outcome carries a reason")
        changed = await self._tx.execute(
            "UPDATE human_requests SET outcome = ?, outcome_value = ?, outcome_reason = ?, resolved_by = ?, "
            "reply_message_id = ?, resolved_at = ? WHERE message_id = ? AND outcome = 'pending'",
            (
                outcome,
                None if value is None else dumps(value),
                reason,
                resolved_by,
                reply_message_id,
                time_text(self._tx.now()),
                message_id,
            ),
        )
        return await self.get(message_id), changed == 1

    async def list_pending(self, *, task_id: str | None = None, limit: int = 100) -> list[HumanRequest]:
        page_limit(limit)
        sql = f"SELECT {_COLUMNS} FROM human_requests WHERE outcome = 'pending'"
        params: list[Any] = []
        if task_id is not None:
            sql += " AND task_id = ?"
            params.append(task_id)
        sql += " ORDER BY due_at, message_id LIMIT ?"
        params.append(limit)
        return [_request(row) for row in await self._tx.fetch(sql, params)]

    async def list_due(self, *, now: datetime | None = None, limit: int = 100) -> list[HumanRequest]:
        """Pending requests whose deadline has passed (oldest deadline first): the server times them out."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM human_requests WHERE outcome = 'pending' AND due_at <= ? "
            "ORDER BY due_at, message_id LIMIT ?",
            (time_text(now or self._tx.now()), limit),
        )
        return [_request(row) for row in rows]

    async def count_pending(self, task_id: str) -> int:
        row = await self._tx.fetch_one(
            "SELECT COUNT(*) FROM human_requests WHERE task_id = ? AND outcome = 'pending'", (task_id,)
        )
        return int(row[0]) if row is not None else 0

    async def fail_pending(self, task_id: str, reason: str = "task_ended") -> int:
        """Give every pending request of a task the outcome ``failure(reason)``; returns how many changed."""
        require_text(reason, "failure reason")
        return await self._tx.execute(
            "UPDATE human_requests SET outcome = 'failure', outcome_reason = ?, resolved_at = ? "
            "WHERE task_id = ? AND outcome = 'pending'",
            (reason, time_text(self._tx.now()), task_id),
        )
