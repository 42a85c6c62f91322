"""The main loop's starting mode from configuration: `loopd harness serve --mode`, `harnesses[].mode` in `loopd up`'s
file, `HarnessSettings.mode` (what both set)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopd.cli import app
from loopd.harness.models import ModelConfig
from loopd.harness.standard import MAIN_LOOP, HarnessSettings, open_standard_rig
from loopd.server.config import BuiltinHarness, ConfigError, parse_config


async def test_a_standard_rig_s_sessions_start_in_the_configured_mode(tmp_path: Path) -> None:
    settings = HarnessSettings(
        workspace=tmp_path / "ws", data_dir=tmp_path / "data", model=ModelConfig(model="demo"), mode="plan"
    )
    async with open_standard_rig(settings) as rig:
        session = await rig.start_session()
        try:
            actor = session.actors[MAIN_LOOP]
            mode = actor.step_mode()
            assert mode is not None and mode.name == "plan"
            await session.set_loop_mode("build")  # a session may still switch
        finally:
            await session.shutdown()


def test_loopd_up_config_takes_a_mode_and_refuses_others(tmp_path: Path) -> None:
    text = "harnesses:\n  - key: planner\n    kind: builtin\n    mode: plan\n"
    config = parse_config(text, base_dir=tmp_path, env={})
    assert config.harnesses is not None
    target = config.harnesses[0]
    assert isinstance(target, BuiltinHarness) and target.mode == "plan"
    with pytest.raises(ConfigError, match="mode"):
        parse_config(text.replace("mode: plan", "mode: fly"), base_dir=tmp_path, env={})


def test_harness_serve_refuses_an_unknown_mode(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["harness", "serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--mode", "fly"], env={}
    )
    assert result.exit_code == 2
    assert "--mode 'fly': use one of build, plan" in result.output
    assert not (tmp_path / "data").exists()
