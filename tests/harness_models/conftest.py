from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, Protocol

import pytest

from loopd._infra.backoff import Backoff
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._scripted_server import Script, ScriptedServer, open_scripted_server

from .helpers import RecordedSleep, Served


class Serve(Protocol):
    def __call__(
        self,
        script: Script = None,
        *,
        max_retries: int = 2,
        timeout: float = 5.0,
        backoff: Backoff | None = None,
        max_retry_after: float = 60.0,
        prices: PriceTable | None = None,
        include_usage: bool = True,
        random: Callable[[], float] = ...,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        **server_options: Any,
    ) -> Awaitable[Served]: ...


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a scripted server on loopback and an adapter pointed at it; both stop after the test."""
    async with AsyncExitStack() as stack:

        async def start(
            script: Script = None,
            *,
            max_retries: int = 2,
            timeout: float = 5.0,
            backoff: Backoff | None = None,
            max_retry_after: float = 60.0,
            prices: PriceTable | None = None,
            include_usage: bool = True,
            random: Callable[[], float] = lambda: 0.5,
            sleep: Callable[[float], Awaitable[None]] | None = None,
            **server_options: Any,
        ) -> Served:
            server = ScriptedServer(script, **server_options)
            base_url = await stack.enter_async_context(open_scripted_server(server))
            recorded = RecordedSleep()
            model = OpenAICompatibleModel(
                "gpt-4o-mini",
                base_url=base_url,
                api_key="sk-test",
                timeout=timeout,
                max_retries=max_retries,
                backoff=backoff,
                max_retry_after=max_retry_after,
                prices=prices,
                include_usage=include_usage,
                sleep=sleep or recorded,
                random=random,
            )
            stack.push_async_callback(model.aclose)
            return Served(server=server, base_url=base_url, model=model, sleep=recorded)

        yield start
