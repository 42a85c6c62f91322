"""Rate limits: the pure token-bucket core (properties) and the limiter's queue on a virtual clock."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd._infra.clock import VirtualClock, settle
from loopd.harness.models._config import ModelConfig, rate_limits_from
from loopd.harness.models._ratelimit import (
    Bucket,
    RateLimit,
    RateLimitConfigError,
    RateLimiter,
    RateLimitQueueFull,
    bucket_charge,
    bucket_refill,
    bucket_take,
    bucket_wait,
    parse_rate_limits,
)

capacities = st.floats(min_value=1, max_value=10_000, allow_nan=False)
rates = st.floats(min_value=0.01, max_value=1_000, allow_nan=False)
steps = st.lists(
    st.tuples(st.floats(min_value=0, max_value=120, allow_nan=False), st.floats(min_value=0, max_value=20_000)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(capacity=capacities, rate=rates, steps=steps)
def test_admitted_tokens_never_exceed_the_burst_plus_the_refill(
    capacity: float, rate: float, steps: list[tuple[float, float]]
) -> None:
    """Whatever the arrivals, what a bucket has let through by time T is at most capacity + rate·T, plus the excess
    of the last call over the capacity (an oversized call starts only from a full bucket and leaves it in debt), and
    waiting `bucket_wait` always makes a take admissible."""
    bucket = Bucket.full(capacity, rate, 0.0)
    now = 0.0
    admitted = 0.0
    for gap, amount in steps:
        now += gap
        now += bucket_wait(bucket, now, amount)
        current = bucket_refill(bucket, now)
        tolerance = 1e-9 * (capacity + rate * now + admitted + amount)
        assert current.level >= min(amount, capacity) - tolerance  # the wait was enough
        assert current.level <= capacity + tolerance  # never above full
        bucket = bucket_take(bucket, now, amount)
        admitted += amount
        assert admitted <= capacity + rate * now + max(0.0, amount - capacity) + tolerance * 10


@settings(max_examples=200, deadline=None)
@given(
    capacity=capacities,
    rate=rates,
    at=st.floats(min_value=0, max_value=1e6),
    later=st.floats(min_value=0, max_value=1e6),
)
def test_refill_is_monotone_and_capped(capacity: float, rate: float, at: float, later: float) -> None:
    bucket = bucket_take(Bucket.full(capacity, rate, at), at, capacity * 2)  # in debt
    first = bucket_refill(bucket, at + later / 2)
    second = bucket_refill(bucket, at + later)
    assert bucket.level <= first.level <= second.level <= capacity
    assert bucket_refill(bucket, at - 1) == bucket  # time never runs backwards


@settings(max_examples=100, deadline=None)
@given(capacity=capacities, rate=rates, refund=st.floats(min_value=0, max_value=1e5))
def test_a_refund_never_overfills(capacity: float, rate: float, refund: float) -> None:
    assert bucket_charge(Bucket.full(capacity, rate, 0.0), 0.0, -refund).level <= capacity


def test_parse_rate_limits() -> None:
    limits = parse_rate_limits("openai:rpm=500,tpm=200000; anthropic:rpm=50", max_queue=3)
    assert limits == {
        "openai": RateLimit(rpm=500, tpm=200_000, max_queue=3),
        "anthropic": RateLimit(rpm=50, max_queue=3),
    }
    for bad in ("openai", "mistral:rpm=1", "openai:rpm=0", "openai:rps=3", "openai:rpm=x", "openai:rpm=inf"):
        with pytest.raises(RateLimitConfigError):
            parse_rate_limits(bad)
    with pytest.raises(RateLimitConfigError):
        rate_limits_from("openai:rpm=1", "-1")
    config = ModelConfig.from_env({"LOOPD_RATE_LIMITS": "anthropic:tpm=1000", "LOOPD_RATE_QUEUE": "2"})
    assert config.rate_limits == {"anthropic": RateLimit(tpm=1000, max_queue=2)}


async def test_calls_wait_their_turn_in_arrival_order_on_a_virtual_clock() -> None:
    clock = VirtualClock()
    limiter = RateLimiter("openai", RateLimit(rpm=60, max_queue=10), clock=clock)  # one request per second
    for _ in range(60):  # the minute's burst
        await limiter.acquire(0)
    admitted: list[tuple[int, float]] = []

    async def call(number: int) -> None:
        await limiter.acquire(0)
        admitted.append((number, clock.monotonic()))

    async with asyncio.TaskGroup() as group:
        for number in range(3):
            group.create_task(call(number))
        await clock.run_until(lambda: len(admitted) == 3, limit=60)
    assert [n for n, _ in admitted] == [0, 1, 2]
    assert [round(t, 6) for _, t in admitted] == [1.0, 2.0, 3.0]


async def test_the_token_bucket_holds_a_call_until_its_tokens_have_refilled() -> None:
    clock = VirtualClock()
    limiter = RateLimiter("anthropic", RateLimit(tpm=6000), clock=clock)  # 100 tokens per second
    await limiter.acquire(6000)
    limiter.settle(estimated=6000, actual=5000)  # the provider counted fewer: 1000 back
    waiter = asyncio.create_task(limiter.acquire(3000))
    await settle()
    assert not waiter.done()
    await clock.advance(19.9)
    assert not waiter.done()
    await clock.advance(0.2)
    await waiter  # 2000 more tokens after 20 s


async def test_a_full_queue_refuses_with_a_typed_retryable_error_and_a_cancelled_wait_takes_nothing() -> None:
    clock = VirtualClock()
    limiter = RateLimiter("openai", RateLimit(rpm=1, max_queue=1), clock=clock)
    await limiter.acquire(0)
    first = asyncio.create_task(limiter.acquire(0))
    await settle()
    assert limiter.waiting == 1
    with pytest.raises(RateLimitQueueFull) as full:
        await limiter.acquire(0)
    assert full.value.retryable and "LOOPD_RATE_LIMITS" in str(full.value)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert limiter.waiting == 0
    second = asyncio.create_task(limiter.acquire(0))
    await clock.run_until(second.done, limit=120)
    assert clock.monotonic() == pytest.approx(60.0)  # the cancelled wait took no request
