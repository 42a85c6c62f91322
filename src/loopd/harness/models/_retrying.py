"""The retry loop every provider adapter shares (OpenAI-compatible, Anthropic).

A retryable failure *before the first chunk* is retried up to ``max_retries`` times, sleeping the backoff's delay
(never less than the provider's Retry-After; a Retry-After above ``max_retry_after`` is raised instead of waited
for). Before each retry an `AttemptFailed` chunk reports the failed attempt (for the ledger). Once a chunk has been
yielded, a failure is raised: the caller has seen partial output, and a silent restart would duplicate it.
"""

from __future__ import annotations

import email.utils
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from datetime import UTC, datetime

from loopd._infra.backoff import Backoff
from loopd.harness._errors import ModelRetryableError
from loopd.harness.models._protocol import AttemptFailed, ModelChunk

logger = logging.getLogger(__name__)

DEFAULT_BACKOFF = Backoff(base=0.5, factor=2.0, max_delay=8.0)
"""Retry *n* (0-based) sleeps ``U(0, min(8, 0.5·2ⁿ))`` (full jitter)."""

Sleep = Callable[[float], Awaitable[None]]


def retry_delay(backoff: Backoff, retry: int, retry_after: float | None, max_retry_after: float) -> float | None:
    """Seconds to sleep before retry number ``retry`` (0-based); None means "do not retry".

    A provider's ``retry_after`` is a floor under the jittered backoff; one longer than ``max_retry_after``
    returns None so the error reaches the caller instead of a long silent sleep.
    """
    if retry_after is not None and retry_after > max_retry_after:
        return None
    jittered = backoff.delay(retry)
    return jittered if retry_after is None else max(retry_after, jittered)


def attempt_failed(err: ModelRetryableError, *, attempt: int, provider: str, model: str, next: str) -> AttemptFailed:
    """The `AttemptFailed` chunk that reports ``err``."""
    return AttemptFailed(
        attempt=attempt,
        provider=provider,
        model=model,
        error_type=type(err).__name__,
        message=str(err),
        status_code=err.status_code,
        retry_after=err.retry_after,
        next="fallback" if next == "fallback" else "retry",
    )


async def retrying(
    attempt: Callable[[], AsyncGenerator[ModelChunk, None]],
    *,
    provider: str,
    model: str,
    max_retries: int,
    backoff: Backoff,
    max_retry_after: float,
    sleep: Sleep,
) -> AsyncGenerator[ModelChunk, None]:
    """Run ``attempt()`` until one succeeds, retrying as the module docstring says."""
    retry = 0
    while True:
        yielded = False
        try:
            async with aclosing(attempt()) as chunks:
                async for chunk in chunks:
                    yielded = True
                    yield chunk
            return
        except ModelRetryableError as err:
            if yielded or retry >= max_retries:
                raise
            delay = retry_delay(backoff, retry, err.retry_after, max_retry_after)
            if delay is None:
                raise
            yield attempt_failed(err, attempt=retry, provider=provider, model=model, next="retry")
            retry += 1
            logger.info("model %s: %s; retry %d/%d in %.2fs", model, err, retry, max_retries, delay)
            await sleep(delay)


def retry_after_seconds(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date); None if absent/invalid."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
