"""`AccessStore.adopt_token`: a token made elsewhere (a Kubernetes Secret) becomes an actor's bearer token."""

from __future__ import annotations

import pytest

from loopd.server.http import AccessStore, Identity
from loopd.server.storage import InvalidRecord
from tests.server_http.support import Rig

SHARED = "s" * 40


async def test_an_adopted_token_authenticates_its_actor_and_adopting_again_is_fine(rig: Rig) -> None:
    access = AccessStore(rig.db)
    await access.adopt_token(Identity("operator", "router"), SHARED)
    await access.adopt_token(Identity("operator", "router"), SHARED)  # a second replica starting: no error
    assert await access.token_actor(SHARED) == Identity("operator", "router", trusted=True)
    me = await rig.client(token=False).get("/v1/me", headers={"Authorization": f"Bearer {SHARED}"})
    assert me.json() == {"kind": "operator", "key": "router", "trusted": True}


async def test_a_short_token_a_user_or_another_actors_token_is_refused(rig: Rig) -> None:
    access = AccessStore(rig.db)
    with pytest.raises(InvalidRecord, match="at least 32"):
        await access.adopt_token(Identity("operator", "router"), "short")
    with pytest.raises(InvalidRecord, match="users sign in"):
        await access.adopt_token(Identity("user", "local"), SHARED)
    await access.adopt_token(Identity("operator", "router"), SHARED)
    with pytest.raises(InvalidRecord, match="another actor"):
        await access.adopt_token(Identity("operator", "longhorizon"), SHARED)
