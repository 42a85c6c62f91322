"""`AccessStore.token_actor` remembers a valid token briefly (one read per burst of an operator's requests): a
revocation on the same store forgets at once, another store on the same database (another replica) within the cache
time; unknown tokens are never remembered. Virtual time."""

from __future__ import annotations

from loopd._infra.clock import VirtualClock
from loopd.server.http import AccessStore, Identity
from tests.server_http.support import Rig

ROUTER = Identity("operator", "router")


async def test_a_valid_token_is_read_once_per_cache_time_and_revocation_here_forgets_it_at_once(rig: Rig) -> None:
    clock = VirtualClock()
    access = AccessStore(rig.db, clock=clock)
    token = await access.create_token(ROUTER)
    assert await access.token_actor(token) == Identity("operator", "router", trusted=True)
    other = AccessStore(rig.db, clock=clock)  # another replica of the same database
    assert await other.token_actor(token) is not None
    assert await access.revoke_tokens(ROUTER) == 1
    assert await access.token_actor(token) is None  # this store forgot it with the revocation
    assert await other.token_actor(token) is not None  # remembered there for at most the cache time
    await clock.advance(2.0)
    assert await other.token_actor(token) is None


async def test_an_unknown_token_is_read_every_time(rig: Rig) -> None:
    clock = VirtualClock()
    access = AccessStore(rig.db, clock=clock)
    assert await access.token_actor("n" * 40) is None
    await AccessStore(rig.db).adopt_token(ROUTER, "n" * 40)  # becomes valid: no negative answer was kept
    assert await access.token_actor("n" * 40) == Identity("operator", "router", trusted=True)


async def test_without_a_cache_time_every_lookup_reads(rig: Rig) -> None:
    access = AccessStore(rig.db, token_cache_seconds=0)
    other = AccessStore(rig.db)
    token = await access.create_token(ROUTER)
    assert await access.token_actor(token) is not None
    await other.revoke_tokens(ROUTER)
    assert await access.token_actor(token) is None
