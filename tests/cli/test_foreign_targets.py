"""A foreign loop as a harness target (issue 17.5): ``kind: foreign`` in `loopd up` / `loopd server`'s configuration
(validated by the schema, one located line per problem) and ``loopd harness serve --engine claude|codex``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loopd.cli import app
from loopd.harness.foreign import ENGINE_KEYS, standard_engine
from loopd.harness.standard import HarnessSettings, open_standard_rig
from loopd.server.config import ConfigError, ForeignHarness, parse_config
from tests.harness_serve.conftest import serving
from tests.harness_serve.test_commands import wait_for_event

FAKES = Path(__file__).resolve().parents[1] / "harness_foreign"

GOOD = """\
harnesses:
  - key: claude-code
    kind: foreign
    title: Claude Code
    engine: claude
    workspace: code
    command: [/opt/claude/bin/claude, --model, sonnet]
    policy: policy.yaml
  - {key: codex, kind: foreign, engine: codex}
"""


def test_a_foreign_target_is_read_with_its_engine_command_workspace_and_policy(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("tools: {Read: allow, Bash: deny}\n")
    config = parse_config(GOOD, base_dir=tmp_path, env={})
    assert config.harnesses is not None
    claude, codex = config.harnesses
    assert isinstance(claude, ForeignHarness) and isinstance(codex, ForeignHarness)
    assert (claude.key, claude.engine, claude.title) == ("claude-code", "claude", "Claude Code")
    assert claude.command == ("/opt/claude/bin/claude", "--model", "sonnet")
    assert claude.workspace == tmp_path / "code" and claude.policy_path == tmp_path / "policy.yaml"
    assert claude.policy is not None and str(claude.policy.access.tools["Bash"]) == "deny"
    assert (codex.engine, codex.command, codex.workspace, codex.policy) == ("codex", (), None, None)


BAD = """\
harnesses:
  - key: a
    kind: foreign
  - key: b
    kind: foreign
    engine: gemini
  - key: c
    kind: foreign
    engine: claude
    command: claude --model x
  - key: d
    kind: foreign
    engine: codex
    command: []
    tools: [bash]
"""


def test_every_bad_foreign_key_is_one_located_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(BAD, source="loopd.yaml", base_dir=tmp_path, env={})
    assert raised.value.lines() == [
        "loopd.yaml:2:5: harnesses[0]: missing required key 'engine'",
        "loopd.yaml:6:13: harnesses[1].engine: 'gemini' is not one of: claude, codex",
        "loopd.yaml:10:14: harnesses[2].command: 'claude --model x' is not of type array",
        "loopd.yaml:14:14: harnesses[3].command: [] should be non-empty",
        "loopd.yaml:15:5: harnesses[3].tools: unknown key (allowed: command, description, engine, key, kind, "
        "policy, title, workspace)",
    ]
    (tmp_path / "broken.yaml").write_text("tools: [1, 2\n")
    with pytest.raises(ConfigError) as raised:
        text = "harnesses:\n  - key: e\n    kind: foreign\n    engine: claude\n    policy: broken.yaml\n"
        parse_config(text, source="loopd.yaml", base_dir=tmp_path, env={})
    (line,) = raised.value.lines()
    assert line.startswith(f"loopd.yaml:5:13: harnesses[0].policy: {tmp_path / 'broken.yaml'}: not valid"), line


def test_harness_serve_engine_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    base = ["harness", "serve", "--port", "0", "--data-dir", str(data)]
    cases = {
        ("--engine", "gemini"): "--engine 'gemini': use claude or codex",
        ("--engine-command", "claude"): "--engine-command needs --engine claude|codex",
        ("--engine", "claude", "--model", "demo"): "--model and --mode do not apply to --engine",
        ("--engine", "codex", "--mode", "plan"): "--model and --mode do not apply to --engine",
        ("--engine", "claude", "--engine-command", "claude 'unclosed"): "--engine-command: No closing quotation",
    }
    for flags, said in cases.items():
        result = CliRunner().invoke(app, [*base, *flags], env={})
        assert result.exit_code == 2, (flags, result.output)
        assert said in result.output and "Traceback" not in result.output, (flags, result.output)
    assert not data.exists()  # nothing started


def test_the_engines_inherit_only_their_providers_variables() -> None:
    assert standard_engine("claude").inherit == ENGINE_KEYS["claude"]
    assert "OPENAI_API_KEY" not in standard_engine("claude").inherit
    assert "ANTHROPIC_API_KEY" not in standard_engine("codex").inherit
    with pytest.raises(ValueError):
        standard_engine("gemini")  # type: ignore[arg-type]


async def test_harness_serve_with_a_foreign_engine_answers_and_gates_over_http(tmp_path: Path) -> None:
    """What ``loopd harness serve --engine claude`` serves: the claude CLI's permission request is a gate of the
    session, answered at ``POST /v1/sessions/{id}/gates/{gate}`` (behind the server's token, like every route)."""
    workspace = tmp_path / "ws"
    engine = standard_engine("claude", (sys.executable, str(FAKES / "fake_claude.py")), workspace)
    settings = HarnessSettings(workspace=workspace, data_dir=tmp_path / "data", foreign=engine)
    async with open_standard_rig(settings) as rig, serving(rig, token="t" * 40) as served:
        created = (await served.client.post("/v1/sessions", json={"input": "use a tool please"})).json()
        opened = await wait_for_event(served, created["id"], "gate_opened")
        gate_id = opened["event"]["gate_id"]
        anonymous = await served.client.post(
            f"/v1/sessions/{created['id']}/gates/{gate_id}", json={"answer": "approve"}, headers={"Authorization": ""}
        )
        assert anonymous.status_code == 401
        answered = await served.client.post(f"/v1/sessions/{created['id']}/gates/{gate_id}", json={"answer": "approve"})
        assert answered.status_code == 200, answered.text
        done = await wait_for_event(served, created["id"], "turn_done")
        assert done["event"]["text"] == "Bash said a.txt"
        used = await wait_for_event(served, created["id"], "foreign_tool_used")
        assert (used["event"]["name"], used["event"]["output"]) == ("Bash", "a.txt")


def test_loopd_config_check_locates_a_bad_foreign_entry_and_passes_a_good_one(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD.replace("    policy: policy.yaml\n", ""))
    bad.write_text("harnesses:\n  - key: c\n    kind: foreign\n    engine: claude\n    model: {name: demo}\n")
    ok = CliRunner().invoke(app, ["config", "check", str(good)], env={})
    assert ok.exit_code == 0 and f"{good}: ok (2 harness target(s))" in ok.output, ok.output
    refused = CliRunner().invoke(app, ["config", "check", str(bad)], env={})
    assert refused.exit_code == 2, refused.output
    assert f"{bad}:5:5: harnesses[0].model: unknown key (allowed: command, description, engine" in refused.output
