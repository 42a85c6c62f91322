"""The rule for a model's ``api_key_env`` under a model cassette: a *replay* (``LOOPD_MODEL_CASSETTE`` with mode
``replay``, the default) never reaches the provider, so the variable may be unset; ``record`` and ``auto`` may reach
it, so they still need it. This is the resolution the server's composition runs for every model of its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.harness.models import ModelConfig
from loopd.server.config import MissingSecret, ModelHarness, parse_config

CONFIG = "harnesses:\n  - {key: gpt, kind: model, model: {name: gpt-4o-mini, api_key_env: LOOPD_TEST_MODEL_KEY}}\n"


def _model(env: dict[str, str]) -> ModelConfig:
    config = parse_config(CONFIG, source="loopd.yaml", env=env)
    [target] = config.harnesses or ()
    assert isinstance(target, ModelHarness)
    return target.model.resolve(env)


def test_a_cassette_replay_needs_no_key(tmp_path: Path) -> None:
    model = _model({"LOOPD_MODEL_CASSETTE": str(tmp_path / "chat.jsonl")})
    assert model.api_key is None and model.cassette is not None and model.cassette.mode == "replay"
    assert model.missing_keys() == ()


@pytest.mark.parametrize("mode", ["record", "auto"])
def test_recording_still_needs_the_key(tmp_path: Path, mode: str) -> None:
    env = {"LOOPD_MODEL_CASSETTE": str(tmp_path / "chat.jsonl"), "LOOPD_MODEL_CASSETTE_MODE": mode}
    with pytest.raises(MissingSecret, match=r"\$LOOPD_TEST_MODEL_KEY .* is not set"):
        _model(env)


def test_without_a_cassette_the_key_is_required_and_a_set_key_is_used(tmp_path: Path) -> None:
    with pytest.raises(MissingSecret, match="LOOPD_MODEL_CASSETTE_MODE=replay"):
        _model({})
    replaying = {"LOOPD_MODEL_CASSETTE": str(tmp_path / "chat.jsonl"), "LOOPD_TEST_MODEL_KEY": "sk-test-key-0123"}
    model = _model(replaying)
    assert model.api_key is not None and model.api_key.get_secret_value() == "sk-test-key-0123"
