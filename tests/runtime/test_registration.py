"""``rt.register``: renewed every lease/3 on the runtime's clock, failures logged and retried, owned by the runtime."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

import pytest
from starlette.responses import JSONResponse

from loopd._infra.clock import VirtualClock
from loopd.runtime import Unavailable, open_runtime
from loopd.server._composition import RunningServer
from tests.support.waiting import eventually

from .conftest import Scripted, User, put_registration


def _has_puts(scripted: Scripted, count: int) -> bool:
    return _puts(scripted) == count


def _puts(scripted: Scripted) -> int:
    return sum(1 for method, path, _ in scripted.seen if (method, path) == ("PUT", "/v1/operators/echo"))


async def test_registration_renews_every_third_of_its_lease(scripted: Scripted) -> None:
    clock = VirtualClock()
    scripted.fallback = put_registration(lease=30)
    async with open_runtime(scripted.url, token="t", clock=clock) as rt:
        registration = await rt.register("echo", lease_seconds=30)
        assert registration.lease_seconds == 30 and _puts(scripted) == 1
        await clock.advance(9.9)
        assert _puts(scripted) == 1
        for renewals in (2, 3, 4):
            await clock.advance(0.1 if renewals == 2 else 10)
            await eventually(partial(_has_puts, scripted, renewals), what=f"renewal {renewals}")
    count = _puts(scripted)
    await clock.advance(60)  # the runtime is closed: its renewal ended with it
    await asyncio.sleep(0)
    assert _puts(scripted) == count


async def test_a_failed_renewal_is_logged_and_retried_without_stopping_the_operator(
    scripted: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loopd.runtime")
    clock = VirtualClock()
    unavailable = JSONResponse({"error": {"type": "service_unavailable", "message": "db down"}}, status_code=503)
    scripted.fallback = put_registration(lease=12)
    async with open_runtime(scripted.url, token="t", clock=clock) as rt:
        await rt.register("echo", lease_seconds=12)
        scripted.answers = [unavailable, None]  # the next renewal gets a 503, then no answer at all
        await clock.advance(4)  # renewal 1: 503
        await eventually(lambda: _puts(scripted) == 2, what="the failing renewal")
        await clock.advance(1)  # sooner than a period after a failure: no answer, retried by the client
        await clock.run_until(lambda: _puts(scripted) >= 4)
        await eventually(lambda: _puts(scripted) == 4, what="the retried renewal")
        await clock.advance(4)
        await eventually(lambda: _puts(scripted) == 5, what="renewals back on their period")
    failures = [r.getMessage() for r in caplog.records if "renewing the registration" in r.getMessage()]
    assert any("operator:echo" in line and "db down" in line for line in failures), failures


async def test_the_first_registration_raises(scripted: Scripted) -> None:
    scripted.answers = [JSONResponse({"error": {"type": "service_unavailable", "message": "no"}}, status_code=503)]
    async with open_runtime(scripted.url, token="t") as rt:
        with pytest.raises(Unavailable):
            await rt.register("echo")


async def test_a_real_server_lists_the_operator_until_its_lease_lapses(server: RunningServer, user: User) -> None:
    async with open_runtime(data_dir=server.data_dir) as rt:
        await rt.register("echo", display_name="Echo", lease_seconds=1.5)
        await asyncio.sleep(0)

        async def connected() -> bool:
            status = (await user.http.get("/v1/actors/operator/echo")).json()
            return bool(status["connected"])

        assert await connected()
        first_seen = (await user.http.get("/v1/actors/operator/echo")).json()["last_seen"]
        await eventually(lambda: _last_seen_after(user, first_seen), timeout=30, what="a renewal moving last_seen")
    await eventually(lambda: _disconnected(user), timeout=30, what="the lease to lapse after the runtime closed")


async def _last_seen_after(user: User, first: str) -> bool:
    status = (await user.http.get("/v1/actors/operator/echo")).json()
    return bool(status["connected"]) and str(status["last_seen"]) > first


async def _disconnected(user: User) -> bool:
    return not (await user.http.get("/v1/actors/operator/echo")).json()["connected"]
