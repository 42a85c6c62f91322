"""Which model a process talks to: `ModelConfig`, resolved from flags and the environment.

    LOOPD_MODEL       a model id (e.g. ``gpt-4o-mini``), or ``demo`` (the default): the scripted demo model
    OPENAI_BASE_URL   an OpenAI-compatible endpoint (default: OpenAI's own)
    OPENAI_API_KEY    the key; required for OpenAI's endpoint, optional with a custom base URL
    LOOPD_PRICES      a JSON or YAML price table, merged over the default table

Flags win over the environment; nothing is read implicitly after `ModelConfig.from_env` returns.

**How the demo is served.** ``demo`` is the ordinary OpenAI adapter pointed at the scripted server, so
demos run the same code path as real providers. Either let `open_model` start that server in-process
(loopback, a free port, stopped when the block exits), or start it yourself (`open_scripted_server`, or
``python -m loopd.harness.models._scripted_server``) and pass its URL as
``build_model(config, demo_base_url=...)``. ``OPENAI_BASE_URL`` is deliberately *not* used for ``demo``,
so a configured provider never receives demo traffic.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr

from loopd.harness._errors import ModelPermanentError
from loopd.harness.core import Frozen
from loopd.harness.models._pricing import PriceTable

if TYPE_CHECKING:
    from loopd.harness.models._openai import OpenAICompatibleModel
    from loopd.harness.models._scripted_server import DemoOptions

DEMO_MODEL = "demo"
_DEMO_API_KEY = "demo"
_KEYLESS_API_KEY = "unused"


class ModelConfig(Frozen):
    """A resolved model configuration. ``api_key`` is a `SecretStr`: it never shows in reprs or logs."""

    model: str = Field(default=DEMO_MODEL, min_length=1)
    base_url: str | None = None
    api_key: SecretStr | None = None
    prices_path: Path | None = None
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0)

    @property
    def is_demo(self) -> bool:
        return self.model == DEMO_MODEL

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        prices_path: Path | str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> ModelConfig:
        """Resolve flags (the keyword arguments; None = not given) over ``env`` (default: ``os.environ``)."""
        source = os.environ if env is None else env

        def pick(flag: str | None, name: str) -> str | None:
            value = flag if flag is not None else source.get(name)
            return value or None

        key = pick(api_key, "OPENAI_API_KEY")
        prices = pick(None if prices_path is None else str(prices_path), "LOOPD_PRICES")
        values: dict[str, object] = {
            "model": pick(model, "LOOPD_MODEL") or DEMO_MODEL,
            "base_url": pick(base_url, "OPENAI_BASE_URL"),
            "api_key": SecretStr(key) if key else None,
            "prices_path": Path(prices) if prices else None,
        }
        if timeout is not None:
            values["timeout"] = timeout
        if max_retries is not None:
            values["max_retries"] = max_retries
        return cls.model_validate(values)

    def price_table(self) -> PriceTable:
        """The default price table, with ``prices_path`` merged over it (raises `PriceTableError`)."""
        table = PriceTable.default()
        if self.prices_path is not None:
            table = table.merged(PriceTable.from_file(self.prices_path))
        return table


def build_model(config: ModelConfig, *, demo_base_url: str | None = None) -> OpenAICompatibleModel:
    """The adapter for ``config``. For ``demo``, ``demo_base_url`` is the running scripted server's base URL.

    Raises `ModelPermanentError` when OpenAI's own endpoint is configured without an API key, and `ValueError`
    when the demo is asked for without a server URL (use `open_model`, which starts one).
    """
    from loopd.harness.models._openai import OpenAICompatibleModel

    prices = config.price_table()
    base_url: str | None
    if config.is_demo:
        if demo_base_url is None:
            raise ValueError(
                "the demo model is served by the scripted server: use open_model(config), or start "
                "open_scripted_server() and pass demo_base_url"
            )
        base_url, api_key = demo_base_url, _DEMO_API_KEY
    else:
        base_url = config.base_url
        if config.api_key is not None:
            api_key = config.api_key.get_secret_value()
        elif base_url is not None:
            api_key = _KEYLESS_API_KEY  # many local OpenAI-compatible servers need no key
        else:
            raise ModelPermanentError(
                f"LOOPD_MODEL={config.model} needs OPENAI_API_KEY (or OPENAI_BASE_URL for another "
                "OpenAI-compatible provider); set LOOPD_MODEL=demo to try loopd without a model provider"
            )
    return OpenAICompatibleModel(
        config.model,
        base_url=base_url,
        api_key=api_key,
        timeout=config.timeout,
        max_retries=config.max_retries,
        prices=prices,
    )


@asynccontextmanager
async def open_model(config: ModelConfig, *, demo: DemoOptions | None = None) -> AsyncIterator[OpenAICompatibleModel]:
    """The configured model for the block's duration; for ``demo`` an in-process scripted server serves it."""
    from loopd.harness.models._scripted_server import ScriptedServer, open_scripted_server

    async with AsyncExitStack() as stack:
        demo_base_url: str | None = None
        if config.is_demo:
            demo_base_url = await stack.enter_async_context(open_scripted_server(ScriptedServer(demo=demo)))
        model = build_model(config, demo_base_url=demo_base_url)
        stack.push_async_callback(model.aclose)
        yield model
