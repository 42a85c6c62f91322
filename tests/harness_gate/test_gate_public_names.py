"""The public face of `loopd.harness.gate`."""

from __future__ import annotations

import loopd.harness.gate as gate


def test_public_names() -> None:
    assert sorted(gate.__all__) == sorted(
        [
            "DEFAULT_POLICY",
            "GATE_TIMEOUT_DEFAULT",
            "SHELL_METACHARACTERS",
            "Access",
            "AccessConfig",
            "CallDecision",
            "DenialSource",
            "FileRuleStore",
            "GateAnswer",
            "GateDecision",
            "GateError",
            "GatePolicy",
            "GatePolicyError",
            "GatePrompt",
            "GateResolution",
            "Grant",
            "MemoryRuleStore",
            "Rule",
            "RuleEffect",
            "RulePersistenceError",
            "RuleStore",
            "RuleStoreCorruptError",
            "RuleStoreError",
            "UnmetRequirement",
            "Verdict",
            "after_answer",
            "answer_on_timeout",
            "escape_pattern",
            "exec_grant_covers",
            "evaluate",
            "load_policy",
            "merge_rules",
            "parse_policy",
            "resolve_answer",
        ]
    )
    for name in gate.__all__:
        assert getattr(gate, name) is not None
