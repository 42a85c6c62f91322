"""A rig's declared configuration, the pure part: primers, loop modes, the configuration fingerprint and drift.

* A **primer** is a named system-prompt fragment a rig declares once and applies to any of its loops.
* A **mode** narrows what a loop offers the model: a subset of its tools (``tools``), only tools that change nothing
  (``read_only``: tools whose effect is ``none`` or ``read``), and an extra prompt. ``PLAN`` (read-only) and
  ``BUILD`` (every tool) are the usual pair. A mode change applies from the next step: the running step (its model
  call and its tool batch) keeps the mode it began with.
* The **fingerprint** is the rig's configuration as ``aspect → value`` (model names and tool names as they are,
  prompts as digests). It is journaled in `SessionStarted`; a restore compares it with the rig it runs under and
  `decide_drift` applies the rig's drift policy: adopt (journal `ConfigurationAdopted` with what changed) or refuse
  (`ConfigurationDriftError`, nothing journaled).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from loopd.harness._errors import ConfigurationDriftError
from loopd.harness.core._values import EffectKind
from loopd.harness.core.events import ActiveLoopChanged, ConfigChange, ConfigurationAdopted

_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _check_name(what: str, name: str) -> None:
    if not name or len(name) > 64 or not set(name) <= _NAME_CHARS:
        raise ValueError(f"invalid {what} name {name!r}: 1-64 letters, digits, '_', '-' or '.'")


@dataclass(frozen=True, slots=True)
class Primer:
    """A named system-prompt fragment; a loop lists the primers it applies (`LoopDefinition.primers`)."""

    name: str
    text: str

    def __post_init__(self) -> None:
        _check_name("primer", self.name)
        if not self.text.strip():
            raise ValueError(f"primer {self.name!r} is empty")


@dataclass(frozen=True, slots=True)
class LoopMode:
    """What a loop offers the model in this mode: ``tools`` (None: all), only read-only tools, and a prompt."""

    name: str
    tools: tuple[str, ...] | None = None
    read_only: bool = False
    prompt: str = ""

    def __post_init__(self) -> None:
        _check_name("mode", self.name)

    def allows(self, tool: str, effect: EffectKind) -> bool:
        """Whether a tool named ``tool`` with effect ``effect`` is offered (and may run) in this mode."""
        if self.tools is not None and tool not in self.tools:
            return False
        return not self.read_only or effect in (EffectKind.NONE, EffectKind.READ)


PLAN: Final = LoopMode(
    name="plan",
    read_only=True,
    prompt="You are in plan mode: explore and propose a plan; do not change anything (only read-only tools work).",
)
BUILD: Final = LoopMode(name="build")


def mode_named(modes: Iterable[LoopMode], name: str | None) -> LoopMode | None:
    """The mode called ``name`` among ``modes`` (None for None or an unknown name)."""
    if name is None:
        return None
    return next((m for m in modes if m.name == name), None)


def compose_prompt(base: str | None, primers: Iterable[str], mode: LoopMode | None) -> str | None:
    """The system prompt a loop sends: its own prompt, then its primers' texts, then its mode's prompt."""
    parts = [p for p in (base, *primers, mode.prompt if mode is not None else None) if p]
    return "\n\n".join(parts) if parts else None


def decide_active_loop(current: str, target: str, *, now: float) -> ActiveLoopChanged | None:
    """The event that makes ``target`` the active loop (None when it already is; the caller checks it exists)."""
    return None if target == current else ActiveLoopChanged(active=target, previous=current, at=now)


# --- fingerprint and drift -----------------------------------------------------------------------------------


def digest(text: str) -> str:
    """A short stable digest of ``text`` (for prompts: their size, not their content, goes to the journal)."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def tool_schemas_digest(specs: Iterable[tuple[str, str, Mapping[str, object]]]) -> str:
    """One digest of what the model is told about a loop's tools ((name, description, parameter schema) each), in
    name order: a changed description or argument schema is drift, not only a renamed tool."""
    shown = sorted(([name, text, params] for name, text, params in specs), key=lambda entry: str(entry[0]))
    return digest(json.dumps(shown, sort_keys=True, separators=(",", ":"), default=str))


def limits_digest(limits: Mapping[str, object]) -> str:
    """The loop's limits (steps, parallelism, timeouts, context window, compaction thresholds…) as one value:
    ``name=value`` pairs in name order (short enough to read in a `ConfigurationAdopted`)."""
    return ";".join(f"{name}={limits[name]}" for name in sorted(limits))


LATER_ASPECTS: Final = frozenset({"tool-schemas", "limits"})
"""Aspects the fingerprint gained after sessions already recorded one: a fingerprint without any aspect of such a
kind was recorded before it existed, so its appearance is adopted without asking the drift policy."""


def _later(aspect: str, recorded_kinds: Collection[str]) -> bool:
    kind = aspect.rsplit(":", 1)[-1]
    return kind in LATER_ASPECTS and kind not in recorded_kinds


def diff_fingerprints(recorded: Mapping[str, str], current: Mapping[str, str]) -> tuple[ConfigChange, ...]:
    """Every aspect whose value differs, sorted by aspect; an absent aspect reads as ""."""
    aspects = sorted(set(recorded) | set(current))
    return tuple(
        ConfigChange(aspect=a, before=recorded.get(a, ""), after=current.get(a, ""))
        for a in aspects
        if recorded.get(a, "") != current.get(a, "")
    )


DriftPolicy: TypeAlias = Literal["adopt", "refuse"] | Callable[[tuple[ConfigChange, ...]], bool]
"""What a restore does when the rig's configuration changed: adopt, refuse, or ask a function (True: adopt)."""


def decide_drift(
    session_id: str, recorded: Mapping[str, str], current: Mapping[str, str], policy: DriftPolicy, *, now: float
) -> ConfigurationAdopted | None:
    """The event a restore journals for configuration drift (None: nothing changed), or `ConfigurationDriftError`.

    A session journaled before fingerprints existed (``recorded`` empty) adopts the current configuration without
    asking the policy: there is nothing to compare with, and from then on there is. The same holds for aspects the
    fingerprint gained later (`LATER_ASPECTS`) that ``recorded`` has none of.
    """
    changes = diff_fingerprints(recorded, current)
    if not changes:
        return None
    recorded_kinds = {aspect.rsplit(":", 1)[-1] for aspect in recorded}
    asked = tuple(c for c in changes if not (c.before == "" and _later(c.aspect, recorded_kinds)))
    if recorded and not asked:  # only aspects this journal predates: adopted like an empty fingerprint
        return ConfigurationAdopted(changes=(), fingerprint=dict(current), at=now)
    if recorded:
        adopt = policy == "adopt" if isinstance(policy, str) else bool(policy(asked))
        if not adopt:
            raise ConfigurationDriftError(session_id, asked)
    return ConfigurationAdopted(changes=asked if recorded else (), fingerprint=dict(current), at=now)
