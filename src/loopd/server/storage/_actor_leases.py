"""Actor leases: operators and harnesses that announced themselves under a stable key with a lease.

Table ``registry_actors`` (PRIMARY KEY (kind, actor_key), id, display_name, description, expires_at,
created_at, updated_at). A lease means "recently alive", not a lock: replicas of one operator share a row, and
nothing is deleted when they exit.
Must not do: renew in the background (the loop-runtime does).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, cast

from ._errors import InvalidRecord, NotFound
from ._records import REGISTRY_KINDS, RegisteredActor, RegistryKind
from ._tx import TransactionCore
from ._values import page_limit, parse_time, require_choice, require_text, seconds, time_text

DEFAULT_LEASE_SECONDS: Final = 30.0
MAX_LEASE_SECONDS: Final = 300.0

_COLUMNS = "id, kind, actor_key, display_name, description, expires_at, created_at, updated_at"


def _actor(row: tuple[Any, ...]) -> RegisteredActor:
    return RegisteredActor(
        id=str(row[0]),
        kind=cast(RegistryKind, row[1]),
        key=str(row[2]),
        display_name=str(row[3]),
        description=str(row[4]),
        expires_at=parse_time(row[5]),
        created_at=parse_time(row[6]),
        updated_at=parse_time(row[7]),
    )


class ActorLeases:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def upsert(
        self,
        kind: RegistryKind,
        key: str,
        *,
        display_name: str = "",
        description: str = "",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> RegisteredActor:
        """Register or renew: the lease runs ``lease_seconds`` (at most five minutes) from now."""
        require_choice(kind, REGISTRY_KINDS, "registry kind")
        require_text(key, "registry key")
        if not isinstance(display_name, str) or not isinstance(description, str):
            raise InvalidRecord("display_name and description must be strings")
        lease = seconds(lease_seconds, "lease")
        if lease_seconds > MAX_LEASE_SECONDS:
            raise InvalidRecord(f"lease must be at most {MAX_LEASE_SECONDS:g} seconds, not {lease_seconds!r}")
        now = self._tx.now()
        await self._tx.execute(
            f"INSERT INTO registry_actors ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (kind, actor_key) DO UPDATE SET display_name = excluded.display_name, "
            "description = excluded.description, expires_at = excluded.expires_at, updated_at = excluded.updated_at",
            (
                self._tx.new_id(),
                kind,
                key,
                display_name,
                description,
                time_text(now + lease),
                time_text(now),
                time_text(now),
            ),
        )
        return await self.get(kind, key)

    async def get(self, kind: RegistryKind, key: str) -> RegisteredActor:
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM registry_actors WHERE kind = ? AND actor_key = ?", (kind, key)
        )
        if row is None:
            raise NotFound(f"{kind} {key!r} is not registered")
        return _actor(row)

    async def list_live(self, *, now: datetime | None = None, limit: int = 1000) -> list[RegisteredActor]:
        """Actors whose lease has not expired: operators first, then harnesses, each by key."""
        page_limit(limit)
        rows = await self._tx.fetch(
            f"SELECT {_COLUMNS} FROM registry_actors WHERE expires_at > ? "
            "ORDER BY CASE kind WHEN 'operator' THEN 0 ELSE 1 END, actor_key LIMIT ?",
            (time_text(now or self._tx.now()), limit),
        )
        return [_actor(row) for row in rows]
