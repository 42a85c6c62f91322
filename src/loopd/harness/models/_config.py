"""Which model a process talks to: `ModelConfig`, resolved from flags and the environment.

    LOOPD_MODEL        a model id (e.g. ``gpt-4o-mini``), a fallback chain of them, or ``demo`` (the default)
    OPENAI_BASE_URL    an OpenAI-compatible endpoint (default: OpenAI's own)
    OPENAI_API_KEY     the key; required for OpenAI's endpoint, optional with a custom base URL
    ANTHROPIC_BASE_URL an Anthropic Messages API endpoint (default: Anthropic's own)
    ANTHROPIC_API_KEY  the key; required for Anthropic's endpoint, optional with a custom base URL
    LOOPD_PRICES       a JSON or YAML price table, merged over the default table
    LOOPD_RATE_LIMITS  per-provider limits, e.g. ``openai:rpm=500,tpm=200000;anthropic:rpm=50`` (``_ratelimit``)
    LOOPD_RATE_QUEUE   how many calls may wait for a provider's rate limit (default 64)
    LOOPD_MODEL_CASSETTE[_MODE|_TIMING|_REDACT]  record / replay the providers' HTTP traffic (``_cassette``); a replay
                       needs no key

**Model ids and chains.** An entry is ``[provider:]model`` with provider ``openai`` or ``anthropic``; a bare id
starting with ``claude`` is Anthropic's, any other bare id OpenAI-compatible. Several entries separated by commas
(``anthropic:claude-sonnet-4-5,gpt-4o-mini``) make a fallback chain (`FallbackModel`): a retryable failure before
the first token hands the call to the next entry.

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
from typing import TYPE_CHECKING, Final, Literal

from pydantic import Field, SecretStr, field_validator

from loopd.harness._errors import ModelPermanentError
from loopd.harness.core import Frozen
from loopd.harness.models._cassette import REPLAY_API_KEY, CassetteSettings, cassette_transport
from loopd.harness.models._pricing import PriceTable
from loopd.harness.models._ratelimit import DEFAULT_QUEUE, RateLimit, RateLimitConfigError, parse_rate_limits

if TYPE_CHECKING:
    import httpx2

    from loopd._infra.clock import Clock
    from loopd.harness.models._fallback import ProviderModel
    from loopd.harness.models._ratelimit import RateLimiter
    from loopd.harness.models._scripted_server import DemoOptions

Provider = Literal["openai", "anthropic"]
PROVIDERS: Final[tuple[Provider, ...]] = ("openai", "anthropic")


class ModelTarget(Frozen):
    """One entry of a model chain: the provider and the model id sent to it."""

    provider: Provider
    model: str = Field(min_length=1)


def parse_chain(text: str) -> tuple[ModelTarget, ...]:
    """``[provider:]model[,[provider:]model…]`` → the chain (`ValueError` names the bad entry)."""
    entries = [part.strip() for part in text.split(",")]
    if not entries or any(not part for part in entries):
        raise ValueError(f"model {text!r}: a chain is model ids separated by single commas (no empty entries)")
    chain: list[ModelTarget] = []
    for part in entries:
        provider, colon, model = part.partition(":")
        if colon:
            if provider.strip().lower() not in PROVIDERS:
                raise ValueError(
                    f"model {part!r}: unknown provider {provider!r}; write openai:MODEL or anthropic:MODEL"
                )
            chosen: Provider = "anthropic" if provider.strip().lower() == "anthropic" else "openai"
            model = model.strip()
            if not model:
                raise ValueError(f"model {part!r}: the model id after {provider}: is missing")
        else:
            model = part
            chosen = "anthropic" if part.lower().startswith("claude") else "openai"
        if model == DEMO_MODEL:
            raise ValueError("the demo model cannot be part of a chain: use --model demo alone")
        chain.append(ModelTarget(provider=chosen, model=model))
    return tuple(chain)


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
    anthropic_base_url: str | None = None
    anthropic_api_key: SecretStr | None = None
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    """Per provider (``openai`` / ``anthropic``); a provider not named is not limited."""
    cassette: CassetteSettings | None = None
    """Record / replay every provider's HTTP traffic (``LOOPD_MODEL_CASSETTE*``, see ``_cassette``); a replay needs
    no API key."""

    @field_validator("model")
    @classmethod
    def _valid_chain(cls, value: str) -> str:
        if value != DEMO_MODEL:
            parse_chain(value)
        return value

    @field_validator("rate_limits")
    @classmethod
    def _known_providers(cls, value: dict[str, RateLimit]) -> dict[str, RateLimit]:
        unknown = sorted(set(value) - set(PROVIDERS))
        if unknown:
            raise ValueError(f"rate limits for unknown providers {unknown}; use {', '.join(PROVIDERS)}")
        return value

    @property
    def is_demo(self) -> bool:
        return self.model == DEMO_MODEL

    def chain(self) -> tuple[ModelTarget, ...]:
        """The providers and model ids, in fallback order (empty for the demo)."""
        return () if self.is_demo else parse_chain(self.model)

    def missing_keys(self) -> tuple[str, ...]:
        """The environment variables a real provider of the chain needs but that are not set (no key, no base URL)."""
        if self.cassette is not None and self.cassette.mode == "replay":
            return ()  # a replay never calls a provider
        missing: list[str] = []
        for target in self.chain():
            if target.provider == "openai" and self.api_key is None and self.base_url is None:
                missing.append("OPENAI_API_KEY")
            if target.provider == "anthropic" and self.anthropic_api_key is None and self.anthropic_base_url is None:
                missing.append("ANTHROPIC_API_KEY")
        return tuple(dict.fromkeys(missing))

    @classmethod
    def prices_only(cls, env: Mapping[str, str] | None = None) -> ModelConfig:
        """The demo config with only ``LOOPD_PRICES`` read from ``env`` (default ``os.environ``): a foreign engine's,
        whose CLI brings its own model and key but whose tokens loopd prices."""
        prices = (os.environ if env is None else env).get("LOOPD_PRICES")
        return cls(prices_path=Path(prices) if prices else None)

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
        anthropic_key = pick(None, "ANTHROPIC_API_KEY")
        values: dict[str, object] = {
            "model": pick(model, "LOOPD_MODEL") or DEMO_MODEL,
            "base_url": pick(base_url, "OPENAI_BASE_URL"),
            "api_key": SecretStr(key) if key else None,
            "prices_path": Path(prices) if prices else None,
            "anthropic_base_url": pick(None, "ANTHROPIC_BASE_URL"),
            "anthropic_api_key": SecretStr(anthropic_key) if anthropic_key else None,
            "rate_limits": rate_limits_from(source.get("LOOPD_RATE_LIMITS"), source.get("LOOPD_RATE_QUEUE")),
            "cassette": CassetteSettings.from_env(source),
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


def rate_limits_from(text: str | None, queue: str | None) -> dict[str, RateLimit]:
    """``LOOPD_RATE_LIMITS`` / ``LOOPD_RATE_QUEUE`` → limits by provider (`RateLimitConfigError`, a ValueError)."""
    max_queue = DEFAULT_QUEUE
    if queue:
        try:
            max_queue = int(queue)
        except ValueError:
            max_queue = -1
        if max_queue < 0:
            raise RateLimitConfigError(f"LOOPD_RATE_QUEUE={queue!r} must be a whole number >= 0")
    return parse_rate_limits(text, max_queue=max_queue) if text else {}


_IN_PROCESS_DEMO_URL = "http://demo.loopd.invalid/v1"
"""Where the adapter sends the in-process demo's requests (a reserved name: nothing on the network answers it)."""


def _http_client(config: ModelConfig, transport: httpx2.AsyncBaseTransport | None) -> httpx2.AsyncClient | None:
    """The HTTP client one adapter of ``config`` sends through: None (the SDK's own) unless a ``transport`` is given.

    The one place both SDKs (``openai``, ``anthropic``: both on httpx2) get their transport, so a recording or
    replaying transport covers every provider. The adapter's `aclose` closes the client (and with it the transport:
    a transport shared by several adapters must tolerate being closed more than once)."""
    if transport is None:
        return None
    import httpx2

    return httpx2.AsyncClient(transport=transport, timeout=config.timeout)


def build_model(
    config: ModelConfig,
    *,
    demo_base_url: str | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
    clock: Clock | None = None,
) -> ProviderModel:
    """The adapter for ``config``. For ``demo``, ``demo_base_url`` is the running scripted server's base URL.

    A plain model id gives its provider's adapter; a chain (or an id with a ``provider:`` prefix) gives a
    `FallbackModel` over one adapter per entry (the chain retries; its adapters do not). Rate limiters are made
    per provider and shared by the chain's adapters of that provider; ``clock`` is theirs and the chain's.

    Raises `ModelPermanentError` when a provider's own endpoint is configured without an API key, and `ValueError`
    when the demo is asked for without a server URL (use `open_model`, which starts one).
    """
    from loopd.harness.models._openai import OpenAICompatibleModel
    from loopd.harness.models._ratelimit import rate_limiters

    prices = config.price_table()
    if transport is None and config.cassette is not None:
        transport = cassette_transport(config.cassette, clock=clock)  # one for the chain: its adapters share it
    if config.is_demo:
        if demo_base_url is None:
            raise ValueError(
                "the demo model is served by the scripted server: use open_model(config), or start "
                "open_scripted_server() and pass demo_base_url"
            )
        return OpenAICompatibleModel(
            config.model,
            base_url=demo_base_url,
            api_key=_DEMO_API_KEY,
            timeout=config.timeout,
            max_retries=config.max_retries,
            prices=prices,
            http_client=_http_client(config, transport),
        )
    chain = config.chain()
    limiters = rate_limiters(config.rate_limits, clock=clock)
    single = len(chain) == 1
    adapter_retries = config.max_retries if single else 0
    adapters = [
        _adapter(config, target, prices, adapter_retries, limiters.get(target.provider), transport) for target in chain
    ]
    if single and chain[0].model == config.model:
        return adapters[0]
    from loopd.harness.models._fallback import ChainEntry, FallbackModel

    return FallbackModel(
        config.model,
        [ChainEntry(target.provider, adapter) for target, adapter in zip(chain, adapters, strict=True)],
        max_retries=0 if single else config.max_retries,
        clock=clock,
    )


def _adapter(
    config: ModelConfig,
    target: ModelTarget,
    prices: PriceTable,
    max_retries: int,
    limiter: RateLimiter | None,
    transport: httpx2.AsyncBaseTransport | None,
) -> ProviderModel:
    if target.provider == "anthropic":
        from loopd.harness.models._anthropic import AnthropicModel

        if config.anthropic_api_key is not None:
            key = config.anthropic_api_key.get_secret_value()
        elif config.anthropic_base_url is not None:
            key = _KEYLESS_API_KEY
        elif config.cassette is not None and config.cassette.mode == "replay":
            key = REPLAY_API_KEY
        else:
            raise ModelPermanentError(
                f"model {target.model} (anthropic) needs ANTHROPIC_API_KEY (or ANTHROPIC_BASE_URL for another "
                "Anthropic-compatible endpoint); set LOOPD_MODEL=demo to try loopd without a model provider"
            )
        return AnthropicModel(
            target.model,
            api_key=key,
            base_url=config.anthropic_base_url,
            timeout=config.timeout,
            max_retries=max_retries,
            prices=prices,
            http_client=_http_client(config, transport),
            limiter=limiter,
        )
    from loopd.harness.models._openai import OpenAICompatibleModel

    if config.api_key is not None:
        api_key = config.api_key.get_secret_value()
    elif config.base_url is not None:
        api_key = _KEYLESS_API_KEY  # many local OpenAI-compatible servers need no key
    elif config.cassette is not None and config.cassette.mode == "replay":
        api_key = REPLAY_API_KEY
    else:
        raise ModelPermanentError(
            f"LOOPD_MODEL={config.model} needs OPENAI_API_KEY (or OPENAI_BASE_URL for another "
            "OpenAI-compatible provider); set LOOPD_MODEL=demo to try loopd without a model provider"
        )
    return OpenAICompatibleModel(
        target.model,
        base_url=config.base_url,
        api_key=api_key,
        timeout=config.timeout,
        max_retries=max_retries,
        prices=prices,
        http_client=_http_client(config, transport),
        limiter=limiter,
    )


@asynccontextmanager
async def open_model(
    config: ModelConfig,
    *,
    demo: DemoOptions | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[ProviderModel]:
    """The configured model for the block's duration; for ``demo`` the scripted OpenAI-compatible app answers it in
    this process, through `StreamingAsgiTransport` (no socket: the adapter still builds the request and parses the
    streamed answer), or over a loopback server when a ``transport`` or a cassette is given (they speak HTTP)."""
    async with AsyncExitStack() as stack:
        demo_base_url: str | None = None
        if config.is_demo:  # the scripted server (and the web stack it runs on) is imported for the demo only
            from loopd.harness.models._scripted_server import ScriptedServer, open_scripted_server

            if transport is None and config.cassette is None:
                from loopd.harness.models._inprocess import StreamingAsgiTransport

                transport = StreamingAsgiTransport(ScriptedServer(demo=demo).app)
                demo_base_url = _IN_PROCESS_DEMO_URL
            else:
                demo_base_url = await stack.enter_async_context(open_scripted_server(ScriptedServer(demo=demo)))
        model = build_model(config, demo_base_url=demo_base_url, transport=transport, clock=clock)
        stack.push_async_callback(model.aclose)
        yield model
