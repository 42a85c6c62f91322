"""Registry leases ("recently alive") and fenced leases (who may write)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.storage import Database, Fenced, InvalidRecord, NewHarnessCall


async def test_registered_actors_are_live_until_their_lease_ends(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        await tx.actor_leases.upsert("harness", "builtin", display_name="Built-in", lease_seconds=60)
        router = await tx.actor_leases.upsert("operator", "router", description="plans", lease_seconds=30)
        await tx.actor_leases.upsert("operator", "alpha", lease_seconds=10)
        live = await tx.actor_leases.list_live()
    assert [(a.kind, a.key) for a in live] == [("operator", "alpha"), ("operator", "router"), ("harness", "builtin")]
    await clock.advance(20)
    async with db.transaction() as tx:
        assert [a.key for a in await tx.actor_leases.list_live()] == ["router", "builtin"]
        renewed = await tx.actor_leases.upsert("operator", "router", display_name="Router", lease_seconds=30)
    assert renewed.id == router.id and renewed.display_name == "Router" and renewed.expires_at > router.expires_at
    assert renewed.created_at == router.created_at and renewed.description == ""


@pytest.mark.parametrize(("kind", "key", "lease"), [("operator", "r", 0), ("operator", "r", 301), ("user", "r", 30)])
async def test_registry_rules(db: Database, kind: str, key: str, lease: float) -> None:
    with pytest.raises(InvalidRecord):
        async with db.transaction() as tx:
            await tx.actor_leases.upsert(kind, key, lease_seconds=lease)  # type: ignore[arg-type]


async def test_a_lease_is_exclusive_until_it_expires_and_tokens_only_grow(db: Database, clock: VirtualClock) -> None:
    async with db.transaction() as tx:
        first = await tx.leases.acquire("harness-call/1", "replica-a", 30)
        assert first is not None and first.token == 1
        assert first == await tx.leases.get("harness-call/1")  # what acquire returns is what it stored
        assert await tx.leases.acquire("harness-call/1", "replica-b", 30) is None
        renewed = await tx.leases.renew("harness-call/1", first.token, 30)
        assert renewed.token == 1 and renewed.expires_at == clock.now() + timedelta(seconds=30)
    await clock.advance(31)
    async with db.transaction() as tx:
        second = await tx.leases.acquire("harness-call/1", "replica-b", 30)
        assert second is not None and (second.holder, second.token) == ("replica-b", 2)
        assert second == await tx.leases.get("harness-call/1")  # taken over: the stored row, as returned
        assert await tx.leases.release("harness-call/1", second.token)
        third = await tx.leases.acquire("harness-call/1", "replica-a", 30)
        assert third is not None and third.token == 3


async def test_a_fenced_holder_cannot_write(db: Database, clock: VirtualClock) -> None:
    """Replica A's lease expires and B takes over; A's late write (checked by token) fails and leaves nothing."""
    async with db.transaction() as tx:
        call, _ = await tx.harness_calls.get_or_create(
            NewHarnessCall("task-uid", "work/0", "builtin", {"text": "hi"}, deadline_at=clock.now())
        )
        lease_a = await tx.leases.acquire(f"harness-call/{call.id}", "replica-a", 30)
    assert lease_a is not None
    await clock.advance(45)
    async with db.transaction() as tx:
        lease_b = await tx.leases.acquire(f"harness-call/{call.id}", "replica-b", 30)
    assert lease_b is not None and lease_b.token > lease_a.token
    with pytest.raises(Fenced, match="stale"):
        async with db.transaction() as tx:
            await tx.harness_calls.update(call.id, phase="running")  # would-be write, rolled back below
            await tx.leases.check_token(f"harness-call/{call.id}", lease_a.token)
    with pytest.raises(Fenced):
        async with db.transaction() as tx:
            await tx.leases.renew(f"harness-call/{call.id}", lease_a.token, 30)
    async with db.transaction() as tx:
        assert not await tx.leases.release(f"harness-call/{call.id}", lease_a.token)
        assert (await tx.harness_calls.get(call.id)).phase == "pending"
        await tx.leases.check_token(f"harness-call/{call.id}", lease_b.token)
        await tx.harness_calls.update(call.id, phase="running")
    await clock.advance(31)
    with pytest.raises(Fenced, match="expired"):
        async with db.transaction() as tx:
            await tx.leases.check_token(f"harness-call/{call.id}", lease_b.token)
    with pytest.raises(Fenced, match="no lease"):
        async with db.transaction() as tx:
            await tx.leases.check_token("harness-call/none", 1)


async def test_racing_replicas_get_one_lease(db: Database) -> None:
    async def claim(holder: str) -> int | None:
        async with db.transaction() as tx:
            lease = await tx.leases.acquire("harness-call/race", holder, 30)
        return None if lease is None else lease.token

    tokens = await asyncio.gather(*(claim(f"replica-{i}") for i in range(6)))
    assert sorted(t for t in tokens if t is not None) == [1]


@pytest.mark.parametrize("ttl", [0, -1, float("inf")])
async def test_lease_arguments_are_checked(db: Database, ttl: float) -> None:
    async with db.transaction() as tx:
        with pytest.raises(InvalidRecord):
            await tx.leases.acquire("r", "h", ttl)
        with pytest.raises(InvalidRecord):
            await tx.leases.check_token("r", 0)
