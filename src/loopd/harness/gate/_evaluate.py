"""The gate evaluator: what a batch of prepared tool calls may do. Pure — no I/O, no clock.

Inputs are the requirements of every prepared call in one tool batch, the configured access (loop definition
or headless policy file) and the rules stored for this workspace. For each call, in this order:

1. **Configured access.** A configured deny (for the tool, for a requirement kind, or a configured deny rule
   touching any requirement) denies the call at once. A configured allow (tool, kind, or a configured allow
   rule covering a requirement) means that part needs nothing more — stored rules are not consulted for it.
2. **Every stored deny.** A stored deny touching *any* remaining requirement denies the call, whatever allows
   exist: all denies are checked before any allow.
3. **Stored allows.** A remaining requirement covered by a stored allow is met.
4. **One prompt.** The requirements still unmet across the *whole batch* form one combined prompt, answered
   with exactly one of three `GateAnswer`s. A call with nothing unmet is allowed.

Matching uses the pattern language of `_patterns`: an allow must *cover* a requirement, a deny only has to
*overlap* it. For ``exec`` requirements an allow's wildcard stands for confined arguments only — no shell
metacharacter, no option off the program's allow-list, no path that can leave the workspace (`_commands`) —
whether the rule was stored by "Approve always" (by this version or an older one) or configured.

The decision is a plain value (JSON round-trips), so an open gate can be journaled and reinstalled on restore.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType
from typing import Final, Protocol

from pydantic import Field

from loopd.harness.core import Frozen
from loopd.harness.gate import _commands, _patterns

GATE_TIMEOUT_DEFAULT: Final[float] = 300.0
"""Seconds an open permission gate waits for an answer before it resolves as `GateAnswer.DENY`."""

SHELL_METACHARACTERS: Final = _commands.SHELL_METACHARACTERS
"""Characters an allow rule's wildcard never absorbs in an ``exec`` requirement."""

# How an allow rule's pattern must cover a requirement's match, per kind (default: `_patterns.covers`).
_ALLOW_MATCHERS: Final[Mapping[str, Callable[[str, str], bool]]] = MappingProxyType({"exec": _commands.covers_command})


class GateAnswer(StrEnum):
    """The three answers to a permission prompt — there are no others."""

    APPROVE = "approve"
    """Allow the gated calls this once."""
    APPROVE_ALWAYS = "approve_always"
    """Store every shown grant for this workspace (atomically, before granting), then allow."""
    DENY = "deny"
    """Refuse the gated calls."""


def answer_on_timeout() -> GateAnswer:
    """The answer a permission gate takes when nobody answers within its timeout: always `DENY`."""
    return GateAnswer.DENY


class Access(StrEnum):
    """Configured access for a tool or a requirement kind."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class RuleEffect(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class Rule(Frozen):
    """A stored or configured rule: requirements of ``kind`` (a pattern) matching ``pattern`` are allowed/denied."""

    kind: str = Field(min_length=1, max_length=200)
    pattern: str = Field(min_length=1, max_length=4096)
    effect: RuleEffect
    description: str = Field(default="", max_length=1000)

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.pattern)

    def describe(self) -> str:
        return f"{self.effect.value} {self.kind} {self.pattern!r}"


class AccessConfig(Frozen):
    """Configured access: from the loop definition or a headless policy file. Deny beats allow."""

    tools: dict[str, Access] = Field(default_factory=dict)
    kinds: dict[str, Access] = Field(default_factory=dict)
    rules: tuple[Rule, ...] = ()


class GrantCandidateLike(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def pattern(self) -> str: ...
    @property
    def description(self) -> str: ...


class RequirementLike(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def match(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def candidates(self) -> Sequence[GrantCandidateLike]: ...


class PreparedCallLike(Protocol):
    """What the evaluator reads from a prepared call (`loopd.harness.tools.PreparedCall` fits)."""

    @property
    def call_id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def requirements(self) -> Sequence[RequirementLike]: ...


class Grant(Frozen):
    """A rule that "Approve always" stores as an allow for this workspace."""

    kind: str
    pattern: str
    description: str = ""

    def as_rule(self) -> Rule:
        return Rule(kind=self.kind, pattern=self.pattern, effect=RuleEffect.ALLOW, description=self.description)


class UnmetRequirement(Frozen):
    """One line of the combined prompt: a permission still needed by one or more calls of the batch."""

    kind: str
    scope: str
    match: str
    description: str
    call_ids: tuple[str, ...]
    candidates: tuple[Grant, ...] = ()


class GatePrompt(Frozen):
    """The one combined prompt for a batch. Journal it to reinstall the gate on restore."""

    items: tuple[UnmetRequirement, ...]

    @property
    def call_ids(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for item in self.items:
            for call_id in item.call_ids:
                seen.setdefault(call_id, None)
        return tuple(seen)

    @property
    def grants(self) -> tuple[Grant, ...]:
        """Every candidate shown, once each, in display order: what "Approve always" stores."""
        seen: dict[tuple[str, str], Grant] = {}
        for item in self.items:
            for grant in item.candidates:
                seen.setdefault((grant.kind, grant.pattern), grant)
        return tuple(seen.values())


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    GATED = "gated"


class DenialSource(StrEnum):
    TOOL_ACCESS = "tool_access"
    KIND_ACCESS = "kind_access"
    CONFIGURED_RULE = "configured_rule"
    STORED_RULE = "stored_rule"


class CallDecision(Frozen):
    call_id: str
    tool: str
    verdict: Verdict
    reason: str = ""
    denied_by: DenialSource | None = None
    rule: Rule | None = None


class GateDecision(Frozen):
    """The evaluator's answer for a batch: one decision per call and at most one prompt."""

    calls: tuple[CallDecision, ...]
    prompt: GatePrompt | None = None

    def verdict(self, call_id: str) -> Verdict:
        for call in self.calls:
            if call.call_id == call_id:
                return call.verdict
        raise KeyError(call_id)

    def call_ids(self, verdict: Verdict) -> tuple[str, ...]:
        return tuple(c.call_id for c in self.calls if c.verdict is verdict)


def evaluate(calls: Sequence[PreparedCallLike], *, access: AccessConfig, stored: Sequence[Rule]) -> GateDecision:
    """Decide a batch. See the module docstring for the order; the result holds at most one prompt."""
    stored_denies = [r for r in stored if r.effect is RuleEffect.DENY]
    stored_allows = [r for r in stored if r.effect is RuleEffect.ALLOW]
    decisions: list[CallDecision] = []
    unmet: dict[tuple[str, str, str], _PendingItem] = {}

    for call in calls:
        decision, remaining = _evaluate_call(call, access, stored_denies, stored_allows)
        decisions.append(decision)
        for requirement in remaining:
            key = (requirement.kind, requirement.scope, requirement.match)
            pending = unmet.setdefault(key, _PendingItem(requirement))
            if call.call_id not in pending.call_ids:
                pending.call_ids.append(call.call_id)

    prompt = GatePrompt(items=tuple(p.freeze() for p in unmet.values())) if unmet else None
    return GateDecision(calls=tuple(decisions), prompt=prompt)


def after_answer(decision: GateDecision, answer: GateAnswer, *, granted: bool) -> GateDecision:
    """The decision once the prompt is resolved: gated calls become allowed only if a grant was minted."""
    allow = granted and answer in (GateAnswer.APPROVE, GateAnswer.APPROVE_ALWAYS)
    reason = "approved" if allow else f"not approved ({answer.value})"
    calls = tuple(
        c.model_copy(update={"verdict": Verdict.ALLOW if allow else Verdict.DENY, "reason": reason})
        if c.verdict is Verdict.GATED
        else c
        for c in decision.calls
    )
    return GateDecision(calls=calls, prompt=None)


class _PendingItem:
    __slots__ = ("call_ids", "requirement")

    def __init__(self, requirement: RequirementLike) -> None:
        self.requirement = requirement
        self.call_ids: list[str] = []

    def freeze(self) -> UnmetRequirement:
        r = self.requirement
        return UnmetRequirement(
            kind=r.kind,
            scope=r.scope,
            match=r.match,
            description=r.description,
            call_ids=tuple(self.call_ids),
            candidates=tuple(Grant(kind=c.kind, pattern=c.pattern, description=c.description) for c in r.candidates),
        )


def _evaluate_call(
    call: PreparedCallLike,
    access: AccessConfig,
    stored_denies: Sequence[Rule],
    stored_allows: Sequence[Rule],
) -> tuple[CallDecision, list[RequirementLike]]:
    def deny(reason: str, source: DenialSource, rule: Rule | None = None) -> CallDecision:
        return CallDecision(
            call_id=call.call_id, tool=call.tool, verdict=Verdict.DENY, reason=reason, denied_by=source, rule=rule
        )

    allowed = CallDecision(call_id=call.call_id, tool=call.tool, verdict=Verdict.ALLOW)
    requirements = list(call.requirements)

    # 1. Configured access: every configured deny first, then configured allows.
    tool_access = access.tools.get(call.tool, Access.ASK)
    if tool_access is Access.DENY:
        return deny(f"tool {call.tool!r} is denied by configuration", DenialSource.TOOL_ACCESS), []
    configured_denies = [r for r in access.rules if r.effect is RuleEffect.DENY]
    for requirement in requirements:
        if _kind_access(access, requirement.kind) is Access.DENY:
            reason = f"{requirement.kind} is denied by configuration ({requirement.description})"
            return deny(reason, DenialSource.KIND_ACCESS), []
        rule = _first_deny(configured_denies, requirement)
        if rule is not None:
            reason = f"{requirement.description}: denied by configured rule {rule.describe()}"
            return deny(reason, DenialSource.CONFIGURED_RULE, rule), []
    if tool_access is Access.ALLOW:
        return allowed.model_copy(update={"reason": "tool allowed by configuration"}), []
    configured_allows = [r for r in access.rules if r.effect is RuleEffect.ALLOW]
    remaining = [
        r
        for r in requirements
        if _kind_access(access, r.kind) is not Access.ALLOW and _first_allow(configured_allows, r) is None
    ]

    # 2. Every stored deny before any allow.
    for requirement in remaining:
        rule = _first_deny(stored_denies, requirement)
        if rule is not None:
            reason = f"{requirement.description}: denied by stored rule {rule.describe()}"
            return deny(reason, DenialSource.STORED_RULE, rule), []

    # 3. Stored allows.
    remaining = [r for r in remaining if _first_allow(stored_allows, r) is None]
    if not remaining:
        return allowed, []
    gated = CallDecision(call_id=call.call_id, tool=call.tool, verdict=Verdict.GATED, reason="needs approval")
    return gated, remaining


def _kind_access(access: AccessConfig, kind: str) -> Access:
    """Configured access for a requirement kind; keys may be patterns (``fs.*``). Deny beats allow."""
    found = {a for k, a in access.kinds.items() if _patterns.covers(k, _patterns.escape(kind))}
    for level in (Access.DENY, Access.ALLOW):
        if level in found:
            return level
    return Access.ASK


def _first_deny(rules: Sequence[Rule], requirement: RequirementLike) -> Rule | None:
    for rule in rules:
        if _patterns.covers(rule.kind, _patterns.escape(requirement.kind)) and _patterns.overlaps(
            rule.pattern, requirement.match
        ):
            return rule
    return None


def _first_allow(rules: Sequence[Rule], requirement: RequirementLike) -> Rule | None:
    matches = _ALLOW_MATCHERS.get(requirement.kind, _patterns.covers)
    for rule in rules:
        if _patterns.covers(rule.kind, _patterns.escape(requirement.kind)) and matches(rule.pattern, requirement.match):
            return rule
    return None
