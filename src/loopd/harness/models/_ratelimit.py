"""Per-provider rate limits: token buckets (requests and tokens per minute) with a bounded waiting queue.

A provider that answers 429 when called too often is better served by waiting *before* the call: a `RateLimiter`
admits a call once its request bucket holds one request and its token bucket holds the call's estimated tokens,
in arrival order (FIFO). At most ``max_queue`` calls wait; one more raises `RateLimitQueueFull` (a
`ModelRetryableError`, so a fallback chain moves on to its next provider) instead of piling up.

The arithmetic is a pure core (`Bucket`, `bucket_wait`, `bucket_take`): a bucket of ``capacity`` refills at
``rate`` per second up to ``capacity``. Taking more than the bucket holds is allowed once it is *full* (a call larger
than a minute's budget still runs, leaving the bucket in debt), so no call waits forever. After a call, `settle`
charges the difference between the estimate and the tokens the provider reported.

    LOOPD_RATE_LIMITS   ``openai:rpm=500,tpm=200000;anthropic:rpm=50,tpm=40000`` (either limit may be left out)
    LOOPD_RATE_QUEUE    how many calls may wait per provider (default 64)

The limiter reads time from a `Clock` (virtual in tests).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from pydantic import Field

from loopd._infra.clock import Clock, SystemClock
from loopd.harness._errors import HarnessError, ModelRetryableError
from loopd.harness.core import Frozen

DEFAULT_QUEUE = 64
_PROVIDERS = ("openai", "anthropic")


class RateLimit(Frozen):
    """A provider's limits: requests and tokens per minute (None: unlimited), and how many calls may wait."""

    rpm: float | None = Field(default=None, gt=0)
    tpm: float | None = Field(default=None, gt=0)
    max_queue: int = Field(default=DEFAULT_QUEUE, ge=0)


class RateLimitConfigError(HarnessError, ValueError):
    """``LOOPD_RATE_LIMITS`` (or a ``rate_limits`` mapping) is malformed."""


class RateLimitQueueFull(ModelRetryableError):
    """Too many calls already wait for this provider's rate limit; the call was refused without waiting."""

    def __init__(self, provider: str, waiting: int) -> None:
        super().__init__(
            f"{provider}: {waiting} calls already wait for the configured rate limit (LOOPD_RATE_LIMITS); "
            "raise the limit, LOOPD_RATE_QUEUE, or send fewer calls at once"
        )
        self.provider = provider
        self.waiting = waiting


# ----------------------------------------------------------------------------------------------------
# The pure core


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket's state: ``level`` tokens (negative: in debt) at time ``at`` (seconds)."""

    capacity: float
    rate: float
    level: float
    at: float

    @classmethod
    def full(cls, capacity: float, rate: float, at: float) -> Bucket:
        """A full bucket of ``capacity`` refilling at ``rate`` per second."""
        if capacity <= 0 or rate <= 0:
            raise ValueError("a bucket needs capacity > 0 and rate > 0")
        return cls(capacity=capacity, rate=rate, level=capacity, at=at)


def bucket_refill(bucket: Bucket, now: float) -> Bucket:
    """The bucket at ``now`` (never earlier than its own time): refilled, at most full."""
    if now <= bucket.at:
        return bucket
    level = min(bucket.capacity, bucket.level + (now - bucket.at) * bucket.rate)
    return Bucket(bucket.capacity, bucket.rate, level, now)


def bucket_wait(bucket: Bucket, now: float, amount: float) -> float:
    """Seconds from ``now`` until ``amount`` may be taken (0: now). An amount above capacity needs a full bucket."""
    current = bucket_refill(bucket, now)
    need = min(max(amount, 0.0), current.capacity)
    if current.level >= need:
        return 0.0
    return (need - current.level) / current.rate


def bucket_take(bucket: Bucket, now: float, amount: float) -> Bucket:
    """The bucket after taking ``amount`` at ``now`` (the caller waited `bucket_wait` first; debt is allowed)."""
    current = bucket_refill(bucket, now)
    return Bucket(current.capacity, current.rate, current.level - max(amount, 0.0), current.at)


def bucket_charge(bucket: Bucket, now: float, amount: float) -> Bucket:
    """Charge (positive) or refund (negative) ``amount`` after the fact; a refund never overfills the bucket."""
    current = bucket_refill(bucket, now)
    level = min(current.capacity, current.level - amount)
    return Bucket(current.capacity, current.rate, level, current.at)


def per_minute(limit: float, at: float) -> Bucket:
    """A full bucket for ``limit`` per minute (a minute's worth of burst)."""
    return Bucket.full(limit, limit / 60.0, at)


# ----------------------------------------------------------------------------------------------------
# The limiter


class RateLimiter:
    """One provider's limits, shared by every adapter that calls it. FIFO admission, a bounded queue."""

    def __init__(self, provider: str, limit: RateLimit, *, clock: Clock | None = None) -> None:
        self.provider = provider
        self.limit = limit
        self._clock = clock or SystemClock()
        now = self._clock.monotonic()
        self._requests = per_minute(limit.rpm, now) if limit.rpm is not None else None
        self._tokens = per_minute(limit.tpm, now) if limit.tpm is not None else None
        self._turn = asyncio.Lock()  # FIFO: waiters are admitted in arrival order
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Calls waiting for admission now."""
        return self._waiting

    def _wait(self, tokens: float) -> float:
        now = self._clock.monotonic()
        waits = [0.0]
        if self._requests is not None:
            waits.append(bucket_wait(self._requests, now, 1))
        if self._tokens is not None:
            waits.append(bucket_wait(self._tokens, now, tokens))
        return max(waits)

    async def acquire(self, tokens: int) -> None:
        """Wait until one request of ``tokens`` estimated tokens is admitted; `RateLimitQueueFull` when
        ``max_queue`` calls already wait. Cancelling the wait takes nothing."""
        if self._requests is None and self._tokens is None:
            return
        if self._waiting >= self.limit.max_queue and (self._turn.locked() or self._wait(tokens) > 0):
            raise RateLimitQueueFull(self.provider, self._waiting)
        self._waiting += 1
        try:
            async with self._turn:
                while (delay := self._wait(tokens)) > 0:
                    await self._clock.sleep(delay)
                now = self._clock.monotonic()
                if self._requests is not None:
                    self._requests = bucket_take(self._requests, now, 1)
                if self._tokens is not None:
                    self._tokens = bucket_take(self._tokens, now, tokens)
        finally:
            self._waiting -= 1

    def settle(self, estimated: int, actual: int) -> None:
        """Correct the token bucket once the provider reported the call's real token count."""
        if self._tokens is not None and actual != estimated:
            self._tokens = bucket_charge(self._tokens, self._clock.monotonic(), actual - estimated)

    @asynccontextmanager
    async def admitted(self, tokens: int) -> AsyncIterator[None]:
        """`acquire` as a block (nothing to release: buckets refill with time)."""
        await self.acquire(tokens)
        yield


def estimate_tokens(characters: int, max_output_tokens: int | None) -> int:
    """A call's token estimate before it is sent: ≈ 4 characters per prompt token, plus the output limit."""
    return math.ceil(characters / 4) + (max_output_tokens or 0)


def parse_rate_limits(text: str, *, max_queue: int = DEFAULT_QUEUE) -> dict[str, RateLimit]:
    """``openai:rpm=500,tpm=200000;anthropic:rpm=50`` → limits by provider (`RateLimitConfigError` if malformed)."""
    out: dict[str, RateLimit] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        provider, colon, settings = part.partition(":")
        provider = provider.strip().lower()
        if not colon or provider not in _PROVIDERS:
            raise RateLimitConfigError(
                f"rate limit {part!r}: write <provider>:rpm=N,tpm=N with provider one of {', '.join(_PROVIDERS)}"
            )
        values: dict[str, float] = {}
        for item in (i.strip() for i in settings.split(",")):
            key, eq, raw = item.partition("=")
            key = key.strip().lower()
            try:
                number = float(raw)
            except ValueError:
                number = math.nan
            if not eq or key not in ("rpm", "tpm") or not number > 0 or math.isinf(number):
                raise RateLimitConfigError(f"rate limit {part!r}: {item!r} is not rpm=N or tpm=N with N > 0")
            values[key] = number
        out[provider] = RateLimit(rpm=values.get("rpm"), tpm=values.get("tpm"), max_queue=max_queue)
    return out


def rate_limiters(limits: Mapping[str, RateLimit], *, clock: Clock | None = None) -> dict[str, RateLimiter]:
    """One limiter per configured provider."""
    return {provider: RateLimiter(provider, limit, clock=clock) for provider, limit in limits.items()}
