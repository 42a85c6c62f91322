"""Secret redaction: the one place that decides what counts as a secret in text written down.

Used wherever loopd writes traffic or transcripts somewhere that outlives the process (model cassettes, the ledger's
artifacts). `Redactor.text` replaces with ``[REDACTED]``: API keys (``sk-…``, ``AKIA…``, ``ghp_…``, ``xox…-``,
``glpat-…``), private-key blocks, bearer/basic credentials, ``key=value`` / ``"key": "value"`` pairs whose key says
api key / secret / token / password, every literal secret given (e.g. the provider key a request carried; values
shorter than 8 characters are ignored, they would hit ordinary words), and configured patterns.

Must not do: I/O, or decide where text goes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from loopd._infra.errors import LoopdError

REDACTED: Final = "[REDACTED]"
MIN_LITERAL: Final = 8

BUILTIN_PATTERNS: Final = (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"\bsk-[A-Za-z0-9][A-Za-z0-9_\-]{15,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"\bglpat-[A-Za-z0-9_\-]{20,}",
)
_CREDENTIAL_TEXT: Final = r"\b(bearer|basic)(\s+)[A-Za-z0-9._~+/\-]{8,}=*"
_ASSIGNMENT_TEXT: Final = (
    r"\b([A-Za-z0-9_\-]*(?:api[_\-]?key|secret|token|passw(?:or)?d)[A-Za-z0-9_\-]*)"
    r"(\"?'?\s*[:=]\s*\"?'?)([^\s\"',;&]{6,})"
)
_CREDENTIAL: Final = re.compile(_CREDENTIAL_TEXT, re.IGNORECASE)
_CREDENTIAL_VALUE: Final = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/\-]{8,}=*)")
_ASSIGNMENT: Final = re.compile(_ASSIGNMENT_TEXT, re.IGNORECASE)
_ANY_BUILTIN: Final = re.compile(
    "|".join(
        [f"(?:{pattern})" for pattern in BUILTIN_PATTERNS] + [f"(?i:{_CREDENTIAL_TEXT})", f"(?i:{_ASSIGNMENT_TEXT})"]
    )
)
"""Whether any built-in rule can match (what `_may_hold_builtin` must never contradict; its tests compare them)."""
_FOLDED: Final = "\u0130\u0131\u017f\u212a"
_FOLDS: Final = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
"""The only non-ASCII letters case-insensitive matching pairs with ASCII ones (İ and ı with i, ſ with s, the Kelvin
sign with k), written as those: then a case-insensitive match in the text is a plain match in the lower-cased copy
(translated first: ``"İ".lower()`` is two characters)."""
_DISTINCT_MARKERS: Final = (
    "-----begin", "sk-", "akia", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "xoxa-", "xoxb-", "xoxp-", "xoxr-", "xoxs-",
    "glpat-",
)  # fmt: skip
"""For each rule with a distinctive start (keys, tokens, private-key blocks): a lower-cased piece every match of it
contains. Rare in ordinary text: text holding one is simply scanned by every rule."""
_CREDENTIAL_CUE: Final = re.compile(r"(?:bearer|basic)\s+[a-z0-9._~+/\-]{8,}")
_ASSIGNMENT_CUE: Final = re.compile(r"(?:api[_\-]?key|secret|token|passw(?:or)?d)[a-z0-9_\-]*\"?'?\s*[:=]")
"""What every match of the two case-insensitive rules (`_CREDENTIAL`, `_ASSIGNMENT`) holds, lower-cased: a match in
the text is one of these in its lower-cased copy (`_FOLDS` first). Their words ("basic",
"key", "token", …) are common; these cues skip the costly part of the rules (the assignment rule's leading name
characters, which the engine tries at every word start and gives back one at a time)."""


def _may_hold_builtin(value: str) -> bool:
    """Whether a built-in rule may match ``value`` (False: none does, so the substitutions may be skipped)."""
    if not value.isascii() and any(letter in value for letter in _FOLDED):
        value = value.translate(_FOLDS)  # (rare: `translate` is slow, a look for four letters is not)
    lowered = value.lower()
    if any(marker in lowered for marker in _DISTINCT_MARKERS):
        return True
    return _CREDENTIAL_CUE.search(lowered) is not None or _ASSIGNMENT_CUE.search(lowered) is not None


_SECRET_NAME: Final = re.compile(
    r"(?i)(?:x-)?(?:[a-z]+[_\-])?(?:api[_\-]?key|secret|(?:access|refresh|auth|id|bearer)?[_\-]?token|passw(?:or)?d|"
    r"authorization|credentials?)"
)


class RedactionPatternError(LoopdError, ValueError):
    """A configured redaction pattern is not a regular expression."""


def is_secret_name(name: str) -> bool:
    """Whether a field, header or parameter called ``name`` holds a secret by its name alone (``api_key``, …)."""
    return _SECRET_NAME.fullmatch(name) is not None


class Redactor:
    """Replaces secrets in text with ``[REDACTED]`` (see the module docstring for what counts as one)."""

    def __init__(self, patterns: Iterable[str] = (), *, literals: Iterable[str] = ()) -> None:
        compiled: list[re.Pattern[str]] = []
        for pattern in (*BUILTIN_PATTERNS, *patterns):
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise RedactionPatternError(
                    f"redaction pattern {pattern!r} is not a regular expression: {exc}"
                ) from None
        self._patterns = tuple(compiled)
        self._configured = len(compiled) > len(BUILTIN_PATTERNS)
        # Longest first, so a secret that contains another is removed whole.
        self._literals = tuple(sorted({v for v in literals if len(v) >= MIN_LITERAL}, key=len, reverse=True))

    def with_literals(self, literals: Iterable[str]) -> Redactor:
        """This redactor, also removing ``literals`` (the patterns are not compiled again)."""
        twin = Redactor.__new__(Redactor)
        twin._patterns = self._patterns
        twin._configured = self._configured
        merged = {*self._literals, *(v for v in literals if len(v) >= MIN_LITERAL)}
        twin._literals = tuple(sorted(merged, key=len, reverse=True))
        return twin

    def text(self, value: str) -> str:
        """``value`` without the secrets it holds."""
        literal_found = False
        for literal in self._literals:
            if literal in value:
                value = value.replace(literal, REDACTED)
                literal_found = True
        if not literal_found and not self._configured and not _may_hold_builtin(value):
            return value  # no rule can match (see `_may_hold_builtin`)
        for pattern in self._patterns:
            value = pattern.sub(REDACTED, value)
        value = _CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", value)
        return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", value)

    def spans(self, value: str) -> list[tuple[int, int]]:
        """Where `text` would remove something from ``value``: sorted, merged ``(start, end)`` ranges."""
        found: list[tuple[int, int]] = []
        for literal in self._literals:
            start = value.find(literal)
            while start >= 0:
                found.append((start, start + len(literal)))
                start = value.find(literal, start + 1)
        for pattern in self._patterns:
            found.extend(m.span() for m in pattern.finditer(value))
        found.extend(m.span(3) for m in _CREDENTIAL_VALUE.finditer(value))
        found.extend(m.span(3) for m in _ASSIGNMENT.finditer(value))
        merged: list[tuple[int, int]] = []
        for start, end in sorted(found):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def fragments(self, pieces: list[str]) -> list[str]:
        """``pieces`` (a text streamed in parts) with the secrets of their concatenation removed: a secret split
        across parts is replaced by ``[REDACTED]`` in the part where it starts and removed from the others."""
        spans = self.spans("".join(pieces))
        if not spans:
            return list(pieces)
        out: list[str] = []
        offset = 0
        for piece in pieces:
            end = offset + len(piece)
            kept: list[str] = []
            cursor = offset
            for start, stop in spans:
                if stop <= offset or start >= end:
                    continue
                kept.append(piece[cursor - offset : max(start, offset) - offset] if start > cursor else "")
                if start >= offset:
                    kept.append(REDACTED)
                cursor = max(cursor, min(stop, end))
            kept.append(piece[cursor - offset :])
            out.append("".join(kept))
            offset = end
        return out

    def value(self, value: Any) -> Any:
        """A JSON-shaped value with every string (keys too) redacted, and every string held under a secret-named key
        (``api_key``, ``token``, …) replaced whole."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {
                self.text(str(key)): REDACTED
                if isinstance(item, str) and is_secret_name(str(key))
                else self.value(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        return value
