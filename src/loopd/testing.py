"""Testing helpers for agents built on loopd: record a model provider's traffic once, replay it in every test run.

A **cassette** is a YAML file of model requests and their streamed replies, recorded at the HTTP layer under the
provider SDK (secrets removed) and replayed from it with no network and no key::

    from loopd.testing import cassette_model, open_cassette

    async def test_my_agent() -> None:
        cassette = open_cassette("tests/cassettes/my_agent.yaml")   # mode: $LOOPD_MODEL_CASSETTE_MODE or "replay"
        async with cassette_model(cassette, "gpt-4o-mini") as model:
            ...  # build the agent on `model` and run it

Record (or re-record) with ``LOOPD_MODEL_CASSETTE_MODE=record pytest …`` and a real key; run everywhere else
with the default ``replay``, where a request the cassette does not hold fails with `CassetteMismatchError`
(its ``diff`` shows what changed). For a ``loopd`` process (``loopd run``, ``loopd harness serve``), pass
``CassetteSettings(...).env()`` in its environment; for any SDK that takes an ``httpx2`` client,
``cassette.http_client()``. See docs/testing.md.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from loopd.harness.models import (
    REPLAY_API_KEY,
    Cassette,
    CassetteError,
    CassetteMismatchError,
    CassetteMode,
    CassetteSettings,
    CassetteStatistics,
    CassetteTiming,
    OpenAICompatibleModel,
    open_cassette,
)

__all__ = [
    "REPLAY_API_KEY",
    "Cassette",
    "CassetteError",
    "CassetteMismatchError",
    "CassetteMode",
    "CassetteSettings",
    "CassetteStatistics",
    "CassetteTiming",
    "cassette_model",
    "open_cassette",
]


@asynccontextmanager
async def cassette_model(
    cassette: Cassette,
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float = 60.0,
    **options: Any,
) -> AsyncIterator[OpenAICompatibleModel]:
    """An OpenAI-compatible model whose HTTP goes through ``cassette``, for the block's duration.

    ``base_url`` and ``api_key`` are the provider's (default: OpenAI's URL, ``$OPENAI_API_KEY``); a replay needs
    neither.
    ``options`` go to `OpenAICompatibleModel` (``max_retries``, ``prices``, …). The HTTP client is closed on exit.
    """
    key = api_key if api_key is not None else (os.environ.get("OPENAI_API_KEY") or REPLAY_API_KEY)
    http_client = cassette.http_client(timeout=timeout)
    try:
        adapter = OpenAICompatibleModel(
            model, base_url=base_url, api_key=key, timeout=timeout, http_client=http_client, **options
        )
        try:
            yield adapter
        finally:
            await adapter.aclose()
    finally:
        await http_client.aclose()
