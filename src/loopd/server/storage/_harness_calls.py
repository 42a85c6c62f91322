"""Harness calls: durable identities for external agent executions, made before anything runs.

Table ``harness_calls`` (id, owner_uid, effect_key, UNIQUE (owner_uid, effect_key), params JSON, fingerprint,
target, conversation_id, message_id, phase, result JSON, error JSON, deadline_at, checkpoint, replay_hash,
execution_ref, cancel_requested, created_at, updated_at).

Rules: ``get_or_create`` returns the existing call for the same identity and fingerprint (a replay), and
``Conflict`` for a different fingerprint. A terminal phase (succeeded, failed, cancelled, timed_out, unknown) is
final. The checkpoint only moves forward by compare-and-set. Writes by a lease holder call
``leases.check_token`` first in the same transaction (lock order: lease → call → message).
Must not do: run adapters or decide phases (the Harness Engine does).
"""

from __future__ import annotations

from typing import Any, Final, cast

from ._errors import Conflict, InvalidRecord, NotFound
from ._records import (
    HARNESS_ACTIVE_PHASES,
    HARNESS_PHASES,
    HARNESS_TERMINAL_PHASES,
    HarnessCall,
    HarnessPhase,
    NewHarnessCall,
)
from ._tx import TransactionCore
from ._values import (
    UNSET,
    Unset,
    digest,
    dumps,
    loads,
    page_limit,
    parse_time,
    require_choice,
    require_object,
    require_text,
    time_text,
)

_COLUMNS = (
    "id, owner_uid, effect_key, params, fingerprint, target, conversation_id, message_id, phase, result, error, "
    "deadline_at, checkpoint, replay_hash, execution_ref, cancel_requested, created_at, updated_at"
)
_ACTIVE = ", ".join(f"'{phase}'" for phase in sorted(HARNESS_ACTIVE_PHASES))


def _call(row: tuple[Any, ...]) -> HarnessCall:
    return HarnessCall(
        id=str(row[0]),
        owner_uid=str(row[1]),
        effect_key=str(row[2]),
        params=loads(row[3]),
        fingerprint=str(row[4]),
        target=str(row[5]),
        conversation_id=row[6],
        message_id=row[7],
        phase=cast(HarnessPhase, row[8]),
        result=loads(row[9]),
        error=loads(row[10]),
        deadline_at=parse_time(row[11]),
        checkpoint=int(row[12]),
        replay_hash=str(row[13]),
        execution_ref=row[14],
        cancel_requested=bool(row[15]),
        created_at=parse_time(row[16]),
        updated_at=parse_time(row[17]),
    )


TRACE_PARAM: Final = "trace"
"""The params key holding the W3C trace context (``traceparent`` / ``tracestate``) of the request that created the
call, so a drive on any replica continues its trace. Not part of the fingerprint: a replay of the same submission
from another trace is still the same call."""


def fingerprint(target: str, params: dict[str, Any]) -> str:
    """What makes two submissions under one identity "the same call" (everything but `TRACE_PARAM`)."""
    if TRACE_PARAM in params:
        params = {key: value for key, value in params.items() if key != TRACE_PARAM}
    return digest({"target": target, "params": params})


class HarnessCalls:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def get_or_create(self, new: NewHarnessCall) -> tuple[HarnessCall, bool]:
        """The call for (owner, effect key): created ``pending`` now, or the stored one; ``(call, created)``."""
        require_text(new.owner_uid, "harness call owner_uid")
        require_text(new.effect_key, "harness call effect_key")
        require_text(new.target, "harness call target")
        require_object(new.params, "harness call params")
        print_ = fingerprint(new.target, new.params)
        now = time_text(self._tx.now())
        call_id = self._tx.new_id()
        inserted = await self._tx.fetch(
            f"INSERT INTO harness_calls ({_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, ?, 0, '', NULL, FALSE, ?, ?) "
            f"ON CONFLICT (owner_uid, effect_key) DO NOTHING RETURNING {_COLUMNS}",
            (
                call_id,
                new.owner_uid,
                new.effect_key,
                dumps(new.params),
                print_,
                new.target,
                new.conversation_id,
                new.message_id,
                time_text(new.deadline_at),
                now,
                now,
            ),
        )
        if inserted:  # the new row as stored, in the same statement
            return _call(inserted[0]), True
        existing = await self.find(new.owner_uid, new.effect_key)
        if existing is None:  # pragma: no cover - the conflicting row cannot vanish inside this transaction
            raise Conflict(f"harness call {new.owner_uid}/{new.effect_key} could not be created")
        if existing.fingerprint != print_:
            raise Conflict(
                f"harness call {new.effect_key!r} of {new.owner_uid} already exists with different parameters"
            )
        return existing, False

    async def get(self, call_id: str) -> HarnessCall:
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM harness_calls WHERE id = ?", (call_id,))
        if row is None:
            raise NotFound(f"harness call {call_id} not found")
        return _call(row)

    async def lock(self, call_id: str) -> HarnessCall:
        """Read a call and hold its row lock until the transaction ends."""
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM harness_calls WHERE id = ?{self._tx.for_update}", (call_id,)
        )
        if row is None:
            raise NotFound(f"harness call {call_id} not found")
        return _call(row)

    async def find(self, owner_uid: str, effect_key: str) -> HarnessCall | None:
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM harness_calls WHERE owner_uid = ? AND effect_key = ?", (owner_uid, effect_key)
        )
        return None if row is None else _call(row)

    async def find_by_message(self, message_id: str) -> HarnessCall | None:
        """The call that streams (or streamed) into the message ``message_id`` (one at most)."""
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM harness_calls WHERE message_id = ?", (message_id,))
        return None if row is None else _call(row)

    async def list_active(self, *, after: str | None = None, limit: int = 100) -> list[HarnessCall]:
        """Calls not yet terminal, by id: what a replica scans to drive or recover."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM harness_calls WHERE phase IN ({_ACTIVE}) AND id > ? ORDER BY id LIMIT ?",
            (after or "", limit),
        )
        return [_call(row) for row in rows]

    async def list_by_owner(self, owner_uid: str, *, limit: int = 100) -> list[HarnessCall]:
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM harness_calls WHERE owner_uid = ? ORDER BY id LIMIT ?", (owner_uid, limit)
        )
        return [_call(row) for row in rows]

    async def count_active(self) -> int:
        """How many calls hold a capacity slot (every phase that is not terminal)."""
        row = await self._tx.fetch_one(f"SELECT COUNT(*) FROM harness_calls WHERE phase IN ({_ACTIVE})")
        return int(row[0]) if row is not None else 0

    async def update(
        self,
        call_id: str,
        *,
        phase: HarnessPhase | Unset = UNSET,
        result: Any = UNSET,
        error: dict[str, Any] | Unset | None = UNSET,
        execution_ref: str | Unset | None = UNSET,
        conversation_id: str | Unset | None = UNSET,
        message_id: str | Unset | None = UNSET,
    ) -> HarnessCall:
        """Change a call that is not terminal yet; a terminal call is final (``Conflict``)."""
        sets: list[str] = []
        params: list[Any] = []
        if not isinstance(phase, Unset):
            sets.append("phase = ?")
            params.append(require_choice(phase, HARNESS_PHASES, "harness call phase"))
        if not isinstance(result, Unset):
            sets.append("result = ?")
            params.append(None if result is None else dumps(result))
        if not isinstance(error, Unset):
            sets.append("error = ?")
            params.append(None if error is None else dumps(require_object(error, "harness call error")))
        for column, value in (
            ("execution_ref", execution_ref),
            ("conversation_id", conversation_id),
            ("message_id", message_id),
        ):
            if not isinstance(value, Unset):
                if value is not None and not isinstance(value, str):
                    raise InvalidRecord(f"harness call {column} must be a string")
                sets.append(f"{column} = ?")
                params.append(value)
        return await self._conditional(call_id, sets, params, "")

    async def advance_checkpoint(
        self, call_id: str, *, expected_checkpoint: int, checkpoint: int, replay_hash: str
    ) -> HarnessCall:
        """Move the checkpoint forward from ``expected_checkpoint``; anything else is a ``Conflict``."""
        for value in (expected_checkpoint, checkpoint):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRecord(f"a checkpoint is a non-negative integer, not {value!r}")
        if checkpoint <= expected_checkpoint:
            raise InvalidRecord("a checkpoint only moves forward")
        if not isinstance(replay_hash, str):
            raise InvalidRecord("replay_hash must be a string")
        return await self._conditional(
            call_id,
            ["checkpoint = ?", "replay_hash = ?"],
            [checkpoint, replay_hash],
            " AND checkpoint = ?",
            [expected_checkpoint],
        )

    async def request_cancel(self, call_id: str) -> HarnessCall:
        """Flag the call for cancellation (idempotent; a terminal call is returned as it is)."""
        call = await self.get(call_id)
        if call.is_terminal or call.cancel_requested:
            return call
        return await self._conditional(call_id, ["cancel_requested = TRUE"], [], "")

    async def _conditional(
        self, call_id: str, sets: list[str], params: list[Any], extra_where: str, extra: list[Any] | None = None
    ) -> HarnessCall:
        terminal = ", ".join(f"'{phase}'" for phase in sorted(HARNESS_TERMINAL_PHASES))
        sets = [*sets, "updated_at = ?"]
        args = [*params, time_text(self._tx.now()), call_id, *(extra or [])]
        rows = await self._tx.fetch(
            f"UPDATE harness_calls SET {', '.join(sets)} WHERE id = ? AND phase NOT IN ({terminal}){extra_where} "
            f"RETURNING {_COLUMNS}",
            args,
        )
        if len(rows) != 1:
            current = await self.get(call_id)
            if current.is_terminal:
                raise Conflict(f"harness call {call_id} is already {current.phase}")
            raise Conflict(f"harness call {call_id} is at checkpoint {current.checkpoint}: re-read it")
        return _call(rows[0])  # the row as updated, in the same statement
