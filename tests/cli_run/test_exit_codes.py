"""Exit codes and error messages, in process: `run_harness` on the real standard rig, output captured."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.harness.models import FailWithStatus, ServerReply, open_scripted_server
from tests.cli_run.conftest import Dirs, run_captured


async def test_a_failed_turn_exits_1_with_the_error_type_and_message(dirs: Dirs) -> None:
    script = [ServerReply(fault=FailWithStatus(status=400, message="scripted refusal"))]
    async with open_scripted_server(script) as url:
        result = await run_captured(dirs, model="scripted", base_url=url, prompt="hello")
    assert result.code == 1
    assert "turn failed: ModelPermanentError" in result.stderr and "scripted refusal" in result.stderr
    assert "resume with: loopd run --resume" in result.stderr
    assert result.stdout == ""


async def test_an_unknown_session_exits_2(dirs: Dirs) -> None:
    result = await run_captured(dirs, resume="no-such-session", prompt="hello")
    assert result.code == 2
    assert "no session 'no-such-session'" in result.stderr and "--data-dir" in result.stderr
    assert "resume with" not in result.stderr  # no session was started instead


async def test_a_bad_policy_file_exits_2_before_anything_opens(dirs: Dirs, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("unattended: always\n")  # "always" is never an unattended answer
    result = await run_captured(dirs, policy=policy, prompt="hello")
    assert result.code == 2
    assert "invalid policy" in result.stderr
    assert not dirs.data_dir.exists()

    result = await run_captured(dirs, policy=tmp_path / "missing.yaml", prompt="hello")
    assert result.code == 2
    assert "cannot read policy file" in result.stderr


async def test_an_empty_prompt_exits_2(dirs: Dirs) -> None:
    result = await run_captured(dirs, prompt="   ")
    assert result.code == 2
    assert "the prompt is empty" in result.stderr


async def test_a_real_model_without_a_key_exits_2_with_what_to_set(dirs: Dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    result = await run_captured(dirs, model="gpt-4o-mini", prompt="hello")
    assert result.code == 2
    assert "OPENAI_API_KEY" in result.stderr
