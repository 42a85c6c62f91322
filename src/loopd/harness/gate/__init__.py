"""The gate: whether prepared tool calls may run.

Owns the pure evaluator (`evaluate`: configured access → every stored deny → stored allows → one combined
prompt), the three answers, rule stores per workspace, resolving an answer into a grant, and headless policy
files. An ``exec`` allow rule with a wildcard (``git diff *``) stands for confined arguments only
(`exec_grant_covers`), however old the stored rule. It must not run tools, prompt anyone or keep time: the
runtime opens the prompt, enforces `GATE_TIMEOUT_DEFAULT` (taking `answer_on_timeout()`, i.e. Deny) and
journals open prompts for restore.
"""

from loopd.harness.gate._commands import grant_covers as exec_grant_covers
from loopd.harness.gate._errors import (
    GateError,
    GatePolicyError,
    RulePersistenceError,
    RuleStoreCorruptError,
    RuleStoreError,
)
from loopd.harness.gate._evaluate import (
    GATE_TIMEOUT_DEFAULT,
    SHELL_METACHARACTERS,
    Access,
    AccessConfig,
    CallDecision,
    DenialSource,
    GateAnswer,
    GateDecision,
    GatePrompt,
    Grant,
    Rule,
    RuleEffect,
    UnmetRequirement,
    Verdict,
    after_answer,
    answer_on_timeout,
    evaluate,
)
from loopd.harness.gate._patterns import escape as escape_pattern
from loopd.harness.gate._policy import DEFAULT_POLICY, GatePolicy, load_policy, parse_policy
from loopd.harness.gate._rules import (
    FileRuleStore,
    GateResolution,
    MemoryRuleStore,
    RuleStore,
    merge_rules,
    resolve_answer,
)

__all__ = [
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
    "evaluate",
    "exec_grant_covers",
    "load_policy",
    "merge_rules",
    "parse_policy",
    "resolve_answer",
]
