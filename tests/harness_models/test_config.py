"""Model configuration from flags and the environment; building the adapter; serving the demo."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from loopd.harness._errors import ModelPermanentError
from loopd.harness.models._config import ModelConfig, build_model, open_model

from .helpers import ask, collect


def test_with_nothing_configured_the_demo_model_is_used() -> None:
    config = ModelConfig.from_env({})

    assert config.is_demo
    assert (config.base_url, config.api_key, config.prices_path) == (None, None, None)


def test_the_environment_configures_a_real_model() -> None:
    env = {
        "LOOPD_MODEL": "gpt-4o-mini",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "sk-secret",
        "LOOPD_PRICES": "/etc/loopd/prices.yaml",
    }

    config = ModelConfig.from_env(env)

    assert config.model == "gpt-4o-mini"
    assert config.base_url == "http://127.0.0.1:9/v1"
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == "sk-secret"
    assert config.prices_path == Path("/etc/loopd/prices.yaml")
    assert "sk-secret" not in repr(config)


def test_flags_win_over_the_environment() -> None:
    env = {"LOOPD_MODEL": "gpt-4o", "OPENAI_API_KEY": "from-env"}

    config = ModelConfig.from_env(env, model="gpt-4.1", api_key="from-flag", timeout=5, max_retries=0)

    assert config.model == "gpt-4.1"
    assert config.api_key is not None
    assert config.api_key.get_secret_value() == "from-flag"
    assert (config.timeout, config.max_retries) == (5, 0)


def test_empty_values_count_as_unset() -> None:
    assert ModelConfig.from_env({"LOOPD_MODEL": "", "OPENAI_BASE_URL": ""}) == ModelConfig()


async def test_a_real_model_is_the_openai_adapter() -> None:
    model = build_model(ModelConfig(model="gpt-4o-mini", api_key=SecretStr("sk-x")))
    try:
        assert model.name == "gpt-4o-mini"
    finally:
        await model.aclose()


def test_openais_endpoint_without_a_key_is_refused() -> None:
    with pytest.raises(ModelPermanentError, match="OPENAI_API_KEY"):
        build_model(ModelConfig(model="gpt-4o-mini"))


async def test_a_custom_endpoint_needs_no_key() -> None:
    model = build_model(ModelConfig(model="llama3", base_url="http://127.0.0.1:9/v1"))
    await model.aclose()


def test_the_demo_needs_its_server_url() -> None:
    with pytest.raises(ValueError, match="open_model"):
        build_model(ModelConfig())


async def test_open_model_serves_the_demo_in_process() -> None:
    async with open_model(ModelConfig.from_env({})) as model:
        got = await collect(model.stream(ask("hello")))

    assert model.name == "demo"
    assert got.error is None
    assert "demo model" in got.text
    assert got.usage.cost_usd == 0.0


async def test_the_price_file_is_merged_into_the_models_table(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("models:\n  demo: {input: 1000000, output: 1000000}\n")

    async with open_model(ModelConfig(prices_path=path)) as model:
        got = await collect(model.stream(ask("hello")))

    assert got.usage.cost_usd == pytest.approx(got.usage.input_tokens + got.usage.output_tokens)
