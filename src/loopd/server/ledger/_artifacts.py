"""Ledger artifacts: content-addressed JSON documents (prompts, replies) and the redaction applied before storage.

An artifact is canonical JSON text (sorted keys, no spaces, UTF-8) whose SHA-256 names it
(``ledger-artifact:sha256:<hex>``); identical content is stored once (``SqlLedgerStore.put_artifacts``). Redaction
runs on every string inside the document *before* it is encoded, so the stored bytes and their hash never hold a
secret: API keys (``sk-…``, ``AKIA…``, ``ghp_…``, ``xox…-``), bearer tokens, private-key blocks, ``key=value`` pairs
whose key says secret / token / password / api key, any literal secret given (e.g. the configured provider keys), and
configured patterns. Must not do: I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from loopd.server.storage import InvalidRecord

from ._records import ArtifactRef

REDACTED: Final = "[REDACTED]"
URI_PREFIX: Final = "ledger-artifact:sha256:"

MESSAGES_TYPE: Final = "application/vnd.loopd.messages+json"
"""A segment of a prompt's message list: ``{"parent": sha256 | null, "messages": [...]}``; the whole list is the
parent chain's messages followed by these."""
TOOLS_TYPE: Final = "application/vnd.loopd.tools+json"
REQUEST_TYPE: Final = "application/vnd.loopd.model-request+json"
REPLY_TYPE: Final = "application/vnd.loopd.model-reply+json"

_BUILTIN_PATTERNS: Final = (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"\bsk-[A-Za-z0-9][A-Za-z0-9_\-]{15,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    r"\bglpat-[A-Za-z0-9_\-]{20,}",
)
_BEARER: Final = re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/\-]{8,}=*")
_ASSIGNMENT: Final = re.compile(
    r"(?i)\b([A-Za-z0-9_\-]*(?:api[_\-]?key|secret|token|passw(?:or)?d)[A-Za-z0-9_\-]*)"
    r"(\"?'?\s*[:=]\s*\"?'?)([^\s\"',;&]{6,})"
)


class Redactor:
    """Replaces secrets in text with ``[REDACTED]`` (see the module docstring for what counts as one)."""

    def __init__(self, patterns: Iterable[str] = (), *, literals: Iterable[str] = ()) -> None:
        compiled: list[re.Pattern[str]] = []
        for pattern in (*_BUILTIN_PATTERNS, *patterns):
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise InvalidRecord(f"redaction pattern {pattern!r} is not a regular expression: {exc}") from None
        self._patterns = tuple(compiled)
        # Longest first, so a secret that contains another is removed whole; short values would hit ordinary words.
        self._literals = tuple(sorted({value for value in literals if len(value) >= 8}, key=len, reverse=True))

    def text(self, value: str) -> str:
        """``value`` without the secrets it holds."""
        for literal in self._literals:
            if literal in value:
                value = value.replace(literal, REDACTED)
        for pattern in self._patterns:
            value = pattern.sub(REDACTED, value)
        value = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", value)
        return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", value)

    def value(self, value: Any) -> Any:
        """A JSON-shaped value with every string (keys too) redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(key)): self.value(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(item) for item in value]
        return value


@dataclass(frozen=True, slots=True)
class ArtifactBlob:
    """An artifact ready to store: its reference and its bytes."""

    ref: ArtifactRef
    body: bytes


def canonical_bytes(document: Any) -> bytes:
    """The canonical JSON encoding artifacts are hashed and stored in."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def artifact_blob(document: Any, content_type: str, redactor: Redactor | None = None) -> ArtifactBlob:
    """``document`` (JSON-shaped) as a content-addressed artifact, redacted first when a redactor is given."""
    body = canonical_bytes(redactor.value(document) if redactor is not None else document)
    digest = hashlib.sha256(body).hexdigest()
    return ArtifactBlob(ArtifactRef(f"{URI_PREFIX}{digest}", digest, len(body), content_type), body)


def ref_payload(ref: ArtifactRef) -> dict[str, Any]:
    """An artifact reference as an event payload holds it."""
    return {"uri": ref.uri, "sha256": ref.sha256, "size": ref.size, "content_type": ref.content_type}


def ref_from_payload(value: Any) -> ArtifactRef | None:
    """The artifact reference in an event payload field (None when absent or malformed)."""
    if not isinstance(value, dict):
        return None
    sha, uri, size, kind = value.get("sha256"), value.get("uri"), value.get("size"), value.get("content_type")
    if not (isinstance(sha, str) and isinstance(uri, str) and isinstance(size, int) and isinstance(kind, str)):
        return None
    return ArtifactRef(uri, sha, size, kind)


_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*\Z")
_UNIT_SECONDS: Final = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text`` like ``90``, ``45m``, ``12h``, ``7d`` or ``2w``; anything else → ``InvalidRecord``."""
    found = _DURATION.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise InvalidRecord(f"{text!r} is not a duration: use a positive number with s, m, h, d or w (e.g. 30d)")
    return float(found.group(1)) * _UNIT_SECONDS[found.group(2)]
