"""Headless gate policy: configured access and the answer for unattended runs, read from YAML or JSON.

Example (JSON is YAML too)::

    version: 1
    unattended: deny          # answer for prompts nobody can see: deny (default) or approve; never "always"
    tools:                    # per tool: allow | ask | deny
      bash: ask
    kinds:                    # per requirement kind (patterns allowed, e.g. "fs.*")
      fs.read: allow
    allow:                    # configured allow rules
      - {kind: exec, pattern: "git status *"}
    deny:                     # configured deny rules (checked before every allow)
      - {kind: fs.write, pattern: ".github/*"}

A policy becomes the `AccessConfig` the evaluator checks first, so a configured deny short-circuits and a
configured allow needs nothing. `parse_policy` is pure; `load_policy` reads a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import Field, ValidationError

from loopd.harness.core import Frozen
from loopd.harness.gate._errors import GatePolicyError
from loopd.harness.gate._evaluate import Access, AccessConfig, GateAnswer, Rule, RuleEffect

_MAX_POLICY_BYTES: Final = 1024 * 1024


class PolicyRule(Frozen):
    kind: str = Field(min_length=1, max_length=200)
    pattern: str = Field(min_length=1, max_length=4096)
    description: str = ""


class PolicyFile(Frozen):
    """The policy file's schema (unknown keys are refused)."""

    version: Literal[1] = 1
    unattended: Literal["deny", "approve"] = "deny"
    tools: dict[str, Access] = Field(default_factory=dict)
    kinds: dict[str, Access] = Field(default_factory=dict)
    allow: tuple[PolicyRule, ...] = ()
    deny: tuple[PolicyRule, ...] = ()


class GatePolicy(Frozen):
    """Configured access plus the answer given to prompts in non-interactive runs."""

    access: AccessConfig = Field(default_factory=AccessConfig)
    unattended: GateAnswer = GateAnswer.DENY

    @classmethod
    def from_file_model(cls, model: PolicyFile) -> GatePolicy:
        def rules(items: tuple[PolicyRule, ...], effect: RuleEffect) -> tuple[Rule, ...]:
            return tuple(Rule(kind=r.kind, pattern=r.pattern, effect=effect, description=r.description) for r in items)

        access = AccessConfig(
            tools=dict(model.tools),
            kinds=dict(model.kinds),
            rules=rules(model.deny, RuleEffect.DENY) + rules(model.allow, RuleEffect.ALLOW),
        )
        return cls(access=access, unattended=GateAnswer(model.unattended))


DEFAULT_POLICY: Final = GatePolicy()
"""No configured access; unattended prompts are denied."""


def parse_policy(text: str, *, source: str = "<policy>") -> GatePolicy:
    """Parse policy text (YAML or JSON). Raises `GatePolicyError`."""
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GatePolicyError(f"{source}: not valid YAML/JSON: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise GatePolicyError(f"{source}: the policy must be a mapping, not {type(raw).__name__}")
    try:
        model = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        raise GatePolicyError(f"{source}: invalid policy: {exc}") from exc
    return GatePolicy.from_file_model(model)


def load_policy(path: str | os.PathLike[str]) -> GatePolicy:
    """Read and parse a policy file (at most 1 MiB). Raises `GatePolicyError`."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(_MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise GatePolicyError(f"cannot read policy file {p}: {exc}") from exc
    if len(data) > _MAX_POLICY_BYTES:
        raise GatePolicyError(f"policy file {p} is larger than {_MAX_POLICY_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GatePolicyError(f"policy file {p} is not UTF-8") from exc
    return parse_policy(text, source=str(p))
