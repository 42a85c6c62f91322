"""Headless policy files: YAML or JSON → configured access and the unattended answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd.harness.gate import (
    DEFAULT_POLICY,
    Access,
    GateAnswer,
    GatePolicyError,
    Rule,
    RuleEffect,
    Verdict,
    evaluate,
    load_policy,
    parse_policy,
)
from loopd.harness.tools._protocol import PreparedCall, Requirement

YAML_POLICY = """
version: 1
unattended: approve
tools:
  bash: ask
  write_file: deny
kinds:
  fs.read: allow
allow:
  - {kind: exec, pattern: "git status *"}
deny:
  - kind: exec
    pattern: "rm *"
    description: never delete
"""


def test_defaults_deny_unattended_prompts() -> None:
    assert DEFAULT_POLICY.unattended is GateAnswer.DENY
    assert parse_policy("") == DEFAULT_POLICY
    assert parse_policy("{}") == DEFAULT_POLICY


def test_yaml_policy() -> None:
    policy = parse_policy(YAML_POLICY)
    assert policy.unattended is GateAnswer.APPROVE
    assert policy.access.tools == {"bash": Access.ASK, "write_file": Access.DENY}
    assert policy.access.kinds == {"fs.read": Access.ALLOW}
    assert policy.access.rules == (
        Rule(kind="exec", pattern="rm *", effect=RuleEffect.DENY, description="never delete"),
        Rule(kind="exec", pattern="git status *", effect=RuleEffect.ALLOW),
    )


def test_json_policy_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"version": 1, "deny": [{"kind": "fs.write", "pattern": ".github/*"}]}))
    policy = load_policy(path)
    assert policy.unattended is GateAnswer.DENY
    assert policy.access.rules == (Rule(kind="fs.write", pattern=".github/*", effect=RuleEffect.DENY),)


@pytest.mark.parametrize(
    "text",
    [
        "unattended: approve_always",
        "version: 2",
        "tools: {bash: maybe}",
        "surprise: true",
        "allow: [{kind: exec}]",
        "- just a list",
        "key: [unclosed",
    ],
)
def test_invalid_policies_are_refused(text: str) -> None:
    with pytest.raises(GatePolicyError):
        parse_policy(text)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(GatePolicyError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")


def test_policy_drives_the_evaluator() -> None:
    policy = parse_policy(YAML_POLICY)

    def bash(call_id: str, command: str) -> PreparedCall:
        requirement = Requirement(kind="exec", scope="/ws", match=command, description=command)
        return PreparedCall(call_id=call_id, tool="bash", arguments={}, requirements=(requirement,))

    read = PreparedCall(
        call_id="r",
        tool="read_file",
        arguments={},
        requirements=(Requirement(kind="fs.read", scope="/ws", match="a", description="read a"),),
    )
    write = PreparedCall(call_id="w", tool="write_file", arguments={})
    calls = [bash("ok", "git status -s"), bash("rm", "rm -rf x"), bash("ask", "make"), read, write]
    decision = evaluate(calls, access=policy.access, stored=[])
    assert [c.verdict for c in decision.calls] == [
        Verdict.ALLOW,
        Verdict.DENY,
        Verdict.GATED,
        Verdict.ALLOW,
        Verdict.DENY,
    ]
