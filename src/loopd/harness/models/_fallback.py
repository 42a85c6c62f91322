"""Fallback chains: one `Model` over several providers, tried in order (``--model primary,secondary``).

A call goes to the first provider of the chain that is not cooling down. A *retryable* failure before the first
chunk (429, 5xx, a dropped connection, a timeout, a full rate-limit queue) hands the call to the next provider; it is
reported as an `AttemptFailed` chunk (``next="fallback"``), so the ledger sees every attempt with its error. A
permanent failure (400, 401, …) is raised at once: another provider would not fix the request, and a wrong key must
be seen. Once a chunk has been yielded, a failure is raised (a silent restart would duplicate the output).

**Retry-After is honoured:** a provider that answered with Retry-After is skipped by every call until that time
has passed. When every provider of a round has failed, the chain waits (the backoff's jittered delay, never less
than the soonest end of a provider's cool-down) and starts again from the first available provider, at most
``max_retries`` times; a cool-down longer than ``max_retry_after`` is not waited for: the last error is raised.

Each child is called with its own model id (``request.model`` is replaced), and its usage is priced by the child;
the chain's `name` is the spelled chain (e.g. ``anthropic:claude-haiku-4-5,gpt-4o-mini``). A request naming another
model (a loop that switched models) goes to the chain's adapter for that model's provider (`ModelPermanentError`
when the chain has none); a chain named there is tried as a chain. Time comes from a
`Clock` (virtual in tests).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, SystemClock
from loopd.harness._errors import ModelPermanentError, ModelRetryableError
from loopd.harness.models._protocol import AttemptFailed, ModelChunk, ModelRequest
from loopd.harness.models._retrying import DEFAULT_BACKOFF, attempt_failed, retry_delay

logger = logging.getLogger(__name__)


class ProviderModel(Protocol):
    """A `Model` that holds resources: every adapter `build_model` returns."""

    @property
    def name(self) -> str: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class ChainEntry:
    """One provider of a chain: its name (``openai`` / ``anthropic``) and its adapter."""

    provider: str
    model: ProviderModel


class FallbackModel:
    """A `Model` that tries its ``entries`` in order (see the module docstring). `aclose` closes every entry."""

    def __init__(
        self,
        name: str,
        entries: Sequence[ChainEntry],
        *,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        max_retry_after: float = 60.0,
        clock: Clock | None = None,
        random: Callable[[], float] | None = None,
    ) -> None:
        if not entries:
            raise ValueError("a fallback chain needs at least one model")
        if max_retries < 0 or max_retry_after < 0:
            raise ValueError("max_retries and max_retry_after must be >= 0")
        self._name = name
        self._entries = tuple(entries)
        self._max_retries = max_retries
        chosen = backoff or DEFAULT_BACKOFF
        self._backoff = dataclasses.replace(chosen, random=random) if random is not None else chosen
        self._max_retry_after = max_retry_after
        self._clock = clock or SystemClock()
        self._cool_until = [0.0] * len(self._entries)

    @property
    def name(self) -> str:
        return self._name

    @property
    def entries(self) -> tuple[ChainEntry, ...]:
        """The chain, in order."""
        return self._entries

    async def aclose(self) -> None:
        """Close every adapter of the chain."""
        for entry in self._entries:
            await entry.model.aclose()

    def _cool_down(self, index: int, err: ModelRetryableError) -> None:
        if err.retry_after is not None and err.retry_after > 0:
            until = self._clock.monotonic() + err.retry_after
            self._cool_until[index] = max(self._cool_until[index], until)

    def _route(self, requested: str) -> list[tuple[int, str]]:
        """(entry index, model id) in the order to try. The chain's own name (or none) is the whole chain; another
        id (a loop switched its model, e.g. ``/model gpt-4o``) is sent to the chain's adapter for its provider."""
        if not requested or requested == self._name:
            return [(index, entry.model.name) for index, entry in enumerate(self._entries)]
        from loopd.harness.models._config import parse_chain

        try:
            targets = parse_chain(requested)
        except ValueError as exc:
            raise ModelPermanentError(str(exc)) from exc
        route: list[tuple[int, str]] = []
        for target in targets:
            index = next((i for i, e in enumerate(self._entries) if e.provider == target.provider), None)
            if index is None:
                raise ModelPermanentError(
                    f"model {requested}: the chain {self._name} has no {target.provider} provider to send it to"
                )
            route.append((index, target.model))
        return route

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Stream one reply from the first provider that takes it."""
        route = self._route(request.model)
        attempt = 0
        retry = 0
        while True:
            now = self._clock.monotonic()
            available = [(index, model) for index, model in route if self._cool_until[index] <= now]
            last: ModelRetryableError | None = None
            last_try: tuple[ChainEntry, str] | None = None
            for position, (index, model) in enumerate(available):
                entry = self._entries[index]
                yielded = False
                try:
                    chunks = entry.model.stream(request.model_copy(update={"model": model}))
                    try:
                        async for chunk in chunks:
                            if isinstance(chunk, AttemptFailed):  # the adapter's own retry: renumbered in the call
                                yield chunk.model_copy(update={"attempt": attempt})
                                attempt += 1
                                continue
                            yielded = True
                            yield chunk
                    finally:
                        close = getattr(chunks, "aclose", None)
                        if close is not None:
                            await close()
                    return
                except ModelRetryableError as err:
                    if yielded:
                        raise
                    self._cool_down(index, err)
                    last, last_try = err, (entry, model)
                    if position < len(available) - 1:
                        logger.info(
                            "model %s (%s): %s; falling back to %s",
                            model,
                            entry.provider,
                            err,
                            available[position + 1][1],
                        )
                        yield attempt_failed(
                            err, attempt=attempt, provider=entry.provider, model=model, next="fallback"
                        )
                        attempt += 1
            # every available provider failed (or all are cooling down): wait, then another round
            now = self._clock.monotonic()
            cooling = max(0.0, min(self._cool_until[index] for index, _ in route) - now)
            if retry >= self._max_retries or cooling > self._max_retry_after:
                if last is not None:
                    raise last
                raise ModelRetryableError(
                    f"model {self._name}: every provider is cooling down for {cooling:.1f}s more (Retry-After)",
                    retry_after=cooling,
                )
            delay = retry_delay(self._backoff, retry, cooling, self._max_retry_after)
            if delay is None:  # pragma: no cover - cooling <= max_retry_after was checked above
                raise last or ModelRetryableError(f"model {self._name}: every provider is cooling down")
            if last is not None and last_try is not None:
                failed_entry, failed_model = last_try
                yield attempt_failed(
                    last, attempt=attempt, provider=failed_entry.provider, model=failed_model, next="retry"
                )
                attempt += 1
            retry += 1
            await self._clock.sleep(delay)
