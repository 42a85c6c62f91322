"""What every SDK-backed provider adapter shares (OpenAI-compatible, Anthropic): argument checks, the retry
settings `retrying` takes, pricing with one warning per unpriced model, the optional rate limiter, and the SDK
client's lifetime (closed only when the adapter made it).

Must not do: anything provider-specific (requests, chunks, errors stay in each adapter).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar

from loopd._infra.backoff import Backoff
from loopd.harness.core import Usage
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._ratelimit import RateLimiter
from loopd.harness.models._retrying import DEFAULT_BACKOFF, Sleep

logger = logging.getLogger("loopd.harness.models")


class _Closable(Protocol):
    def close(self) -> Awaitable[None]: ...


ClientT = TypeVar("ClientT", bound=_Closable)


class SdkAdapter(Generic[ClientT]):
    """The common half of an adapter over a provider SDK client (see the module docstring)."""

    def __init__(
        self,
        model: str,
        *,
        client: ClientT,
        owns_client: bool,
        timeout: float,
        max_retries: int,
        backoff: Backoff | None,
        max_retry_after: float,
        prices: PriceTable | None,
        sleep: Sleep,
        random: Callable[[], float] | None,
        limiter: RateLimiter | None,
    ) -> None:
        check_settings(model, timeout=timeout, max_retries=max_retries, max_retry_after=max_retry_after)
        self._model = model
        self._client = client
        self._owns_client = owns_client
        self._max_retries = max_retries
        chosen = backoff or DEFAULT_BACKOFF
        self._backoff = dataclasses.replace(chosen, random=random) if random is not None else chosen
        self._max_retry_after = max_retry_after
        self._prices = prices
        self._sleep = sleep
        self._limiter = limiter
        self._flagged_unpriced: set[str] = set()

    @property
    def name(self) -> str:
        return self._model

    async def aclose(self) -> None:
        """Close the SDK client (only if this adapter created it)."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _priced(self, served_model: str, requested_model: str, usage: Usage, *, cache_write: int = 0) -> Usage:
        """``usage`` priced for the model that served it (else the one asked for); an unpriced model costs $0 and
        is reported once."""
        if self._prices is None:
            return usage
        quote = self._prices.quote(served_model, usage, cache_write_tokens=cache_write)
        if not quote.priced and served_model != requested_model:
            quote = self._prices.quote(requested_model, usage, cache_write_tokens=cache_write)
        if not quote.priced and requested_model not in self._flagged_unpriced:
            self._flagged_unpriced.add(requested_model)
            logger.warning("model %s is not in the price table; its calls are counted at $0", requested_model)
        return quote.usage


def check_settings(model: str, *, timeout: float, max_retries: int, max_retry_after: float) -> None:
    """``ValueError`` for settings no adapter accepts."""
    if not model:
        raise ValueError("model must be a non-empty model id")
    if timeout <= 0:
        raise ValueError("timeout must be > 0 seconds")
    if max_retries < 0:
        raise ValueError("max_retries must be >= 0")
    if max_retry_after < 0:
        raise ValueError("max_retry_after must be >= 0 seconds")
