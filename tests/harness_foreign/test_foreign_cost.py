"""What a foreign turn costs when its CLI reports tokens but no USD (codex): the model it runs — named by its command's
flags or its own config.toml — priced by the rig's price table (the default one, or ``LOOPD_PRICES``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loopd.harness import Usage
from loopd.harness.core.events import TurnDone
from loopd.harness.foreign import ForeignEngine, standard_engine
from loopd.harness.foreign._engine import configured_model
from loopd.harness.models import ModelConfig, PriceTable
from loopd.harness.standard import HarnessSettings, open_standard_rig

FAKE_CODEX = (sys.executable, str(Path(__file__).parent / "fake_codex.py"))


def test_the_model_comes_from_the_command_then_codexs_config(tmp_path: Path) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-5"\nprofile = "cheap"\n[profiles.cheap]\nmodel = "gpt-5-mini"\n[profiles.big]\nmodel = "o3"\n'
    )
    env = {"CODEX_HOME": str(home)}

    def codex(*flags: str) -> str | None:
        return configured_model(ForeignEngine(kind="codex", command=("codex", *flags), env=env))

    assert codex("-m", "gpt-4.1") == "gpt-4.1"
    assert codex("--model=gpt-4.1-nano") == "gpt-4.1-nano"
    assert codex("-c", 'model="o4-mini"') == "o4-mini"
    assert codex("-c", "model=o3-mini") == "o3-mini"  # codex reads a bare word as a string too
    assert codex() == "gpt-5-mini"  # the profile the file selects
    assert codex("--profile", "big") == "o3"
    (home / "config.toml").write_text('model = "gpt-5"\n')
    assert codex() == "gpt-5"
    (home / "config.toml").write_text("model = [not toml")
    assert codex() is None  # a file the CLI would refuse too names nothing
    assert configured_model(ForeignEngine(kind="codex", command=("codex",), env={"CODEX_HOME": str(tmp_path)})) is None
    assert configured_model(ForeignEngine(kind="claude", command=("claude", "--model", "claude-sonnet-4"))) == (
        "claude-sonnet-4"
    )
    assert configured_model(ForeignEngine(kind="claude")) is None  # claude reports its own cost


@pytest.mark.parametrize(
    ("flags", "prices", "expected_model"),
    [
        (("-m", "gpt-5-mini"), None, "gpt-5-mini"),
        (
            ("-m", "house-model"),
            {"models": {"house-model": {"input": 3.0, "cached_input": 0.3, "output": 15.0}}},
            "house-model",
        ),
    ],
)
async def test_a_codex_turn_is_priced_by_the_rigs_table(
    tmp_path: Path, flags: tuple[str, ...], prices: dict[str, object] | None, expected_model: str
) -> None:
    price_file = None
    if prices is not None:
        import json

        price_file = tmp_path / "prices.json"
        price_file.write_text(json.dumps(prices))
    model = ModelConfig.prices_only({"LOOPD_PRICES": str(price_file)} if price_file else {})
    workspace = tmp_path / "ws"
    settings = HarnessSettings(
        workspace=workspace,
        data_dir=tmp_path / "data",
        model=model,
        foreign=standard_engine("codex", (*FAKE_CODEX, *flags), workspace),
    )
    async with open_standard_rig(settings) as rig:
        session = await rig.start_session()
        done = await session.ask("hello, from the cached prompt", timeout=30)
        await session.shutdown()
    assert isinstance(done, TurnDone)
    reported = Usage(input_tokens=20, output_tokens=7, cached_tokens=8, calls=1)
    expected = model.price_table().cost_of(expected_model, reported).cost_usd
    assert expected > 0 and done.usage.cost_usd == pytest.approx(expected)
    assert (done.usage.input_tokens, done.usage.cached_tokens, done.usage.output_tokens) == (20, 8, 7)


async def test_an_unknown_model_leaves_the_turn_unpriced(tmp_path: Path) -> None:
    settings = HarnessSettings(
        workspace=tmp_path / "ws",
        data_dir=tmp_path / "data",
        model=ModelConfig.prices_only({}),
        foreign=standard_engine("codex", (*FAKE_CODEX, "-m", "nobody-knows-this-model"), tmp_path / "ws"),
    )
    assert not PriceTable.default().quote("nobody-knows-this-model", Usage()).priced
    async with open_standard_rig(settings) as rig:
        session = await rig.start_session()
        done = await session.ask("hello", timeout=30)
        await session.shutdown()
    assert isinstance(done, TurnDone) and done.usage.cost_usd == 0 and done.usage.input_tokens == 20
