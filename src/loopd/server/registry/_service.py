"""`RegistryService`: operators and harnesses announce themselves with a lease; the responder picker lists them.

A lease means "recently alive" (default 30 s, at most 5 min; the loop-runtime renews every third of it). The
server's own targets (``builtin_actors``, e.g. ``harness:assistant`` served by the Harness Engine) are always
listed and never expire. Time is the database clock (injectable).
Must not do: renew leases (clients do) or delete rows (an expired actor simply stops being listed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from loopd.server.storage import DEFAULT_LEASE_SECONDS, Database, NotFound, RegisteredActor

ActorKind = Literal["operator", "harness"]


@dataclass(frozen=True, slots=True)
class ActorInfo:
    """A responder the picker can offer."""

    kind: ActorKind
    key: str
    display_name: str = ""
    description: str = ""
    modes: tuple[str, ...] = ()
    """The modes its calls can start in (a built-in harness: ``build``, ``plan``); () when it has none."""
    mode: str | None = None
    """The mode its calls start in unless a conversation sets one (None: it has no modes)."""

    def __post_init__(self) -> None:
        if self.kind not in ("operator", "harness") or not self.key:
            raise ValueError("an actor is an operator or a harness with a non-empty key")


@dataclass(frozen=True, slots=True)
class ActorStatus:
    """Whether a responder is connected now, and when it last renewed its lease (None: built in, or never seen)."""

    kind: ActorKind
    key: str
    connected: bool
    last_seen: datetime | None = None


class RegistryService:
    def __init__(self, db: Database, *, builtin_actors: Sequence[ActorInfo] = ()) -> None:
        self._db = db
        self._builtin = tuple(builtin_actors)

    @property
    def builtin_actors(self) -> tuple[ActorInfo, ...]:
        return self._builtin

    async def register(
        self,
        kind: ActorKind,
        key: str,
        *,
        display_name: str = "",
        description: str = "",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> RegisteredActor:
        """Register or renew ``kind:key`` for ``lease_seconds`` from now (``InvalidRecord`` beyond five minutes)."""
        async with self._db.transaction() as tx:
            return await tx.actor_leases.upsert(
                kind, key, display_name=display_name, description=description, lease_seconds=lease_seconds
            )

    async def list_live(self) -> list[ActorInfo]:
        """Built-in and live registered actors: operators first, then harnesses, each by key."""
        async with self._db.transaction(read_only=True) as tx:
            live = await tx.actor_leases.list_live()
        found: dict[tuple[str, str], ActorInfo] = {(a.kind, a.key): a for a in self._builtin}
        for actor in live:
            found.setdefault(
                (actor.kind, actor.key), ActorInfo(actor.kind, actor.key, actor.display_name, actor.description)
            )
        return sorted(found.values(), key=lambda a: (a.kind != "operator", a.key))

    async def status(self, kind: ActorKind, key: str) -> ActorStatus:
        """Connected (built in, or a live lease) or not, with the time of its last registration or renewal."""
        if any(a.kind == kind and a.key == key for a in self._builtin):
            return ActorStatus(kind, key, connected=True)
        async with self._db.transaction(read_only=True) as tx:
            try:
                actor = await tx.actor_leases.get(kind, key)
            except NotFound:
                return ActorStatus(kind, key, connected=False)
            now = tx.now()
        return ActorStatus(kind, key, connected=actor.expires_at > now, last_seen=actor.updated_at)

    async def is_known(self, kind: str, key: str) -> bool:
        """Whether ``kind:key`` is built in or has ever registered (an expired lease may be renewed soon)."""
        if any(a.kind == kind and a.key == key for a in self._builtin):
            return True
        if kind not in ("operator", "harness"):
            return False
        async with self._db.transaction(read_only=True) as tx:
            try:
                await tx.actor_leases.get(kind, key)  # type: ignore[arg-type]  # checked just above
            except NotFound:
                return False
        return True
