"""USD per model call from a configurable price table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd.harness.core._values import Usage
from loopd.harness.models._pricing import ModelPrice, PriceTable, PriceTableError

USAGE = Usage(input_tokens=1_000_000, output_tokens=500_000, cached_tokens=200_000, calls=1)


def test_cost_uses_input_cached_and_output_prices() -> None:
    table = PriceTable(models={"m": ModelPrice(input=2.0, cached_input=0.5, output=8.0)})

    usage = table.cost_of("m", USAGE)

    assert usage.cost_usd == pytest.approx(0.8 * 2.0 + 0.2 * 0.5 + 0.5 * 8.0)
    assert usage.model_copy(update={"cost_usd": 0.0}) == USAGE


def test_cached_tokens_default_to_the_input_price() -> None:
    table = PriceTable(models={"m": ModelPrice(input=1.0, output=0.0)})

    assert table.cost_of("m", USAGE).cost_usd == pytest.approx(1.0)


def test_an_unknown_model_costs_nothing_and_is_flagged() -> None:
    quote = PriceTable.default().quote("mystery-model", USAGE)

    assert quote.priced is False
    assert quote.usage.cost_usd == 0.0
    assert quote.matched is None


def test_dated_snapshots_and_provider_prefixes_match_their_family() -> None:
    table = PriceTable.default()

    assert table.quote("gpt-4o-mini-2024-07-18", USAGE).matched == "gpt-4o-mini"
    assert table.quote("gpt-4o-2024-08-06", USAGE).matched == "gpt-4o"
    assert table.quote("openai/gpt-4.1-nano", USAGE).matched == "gpt-4.1-nano"
    assert table.quote("gpt-4o-mini", USAGE).matched == "gpt-4o-mini"


def test_the_default_table_prices_the_demo_at_zero() -> None:
    quote = PriceTable.default().quote("demo", USAGE)

    assert quote.priced
    assert quote.usage.cost_usd == 0.0


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_price_file_loads_and_merges_over_the_default(tmp_path: Path, suffix: str) -> None:
    data = {"models": {"my-model": {"input": 1, "output": 2}, "gpt-4o": {"input": 9, "output": 9}}}
    path = tmp_path / f"prices{suffix}"
    path.write_text(json.dumps(data))  # JSON is valid YAML too

    table = PriceTable.default().merged(PriceTable.from_file(path))

    assert table.models["my-model"] == ModelPrice(input=1, output=2)
    assert table.models["gpt-4o"].input == 9
    assert "gpt-4o-mini" in table.models


@pytest.mark.parametrize(
    "content", ["models: [1, 2]", "models: {m: {input: -1, output: 0}}", "- just a list", "{not json"]
)
def test_a_bad_price_file_is_a_typed_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / ("prices.json" if content.startswith("{") else "prices.yaml")
    path.write_text(content)

    with pytest.raises(PriceTableError):
        PriceTable.from_file(path)


def test_a_missing_price_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(PriceTableError, match="cannot read"):
        PriceTable.from_file(tmp_path / "absent.yaml")
