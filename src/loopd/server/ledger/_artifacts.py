"""Ledger artifacts: content-addressed JSON documents (prompts, replies) and the redaction applied before storage.

An artifact is canonical JSON text (sorted keys, no spaces, UTF-8) whose SHA-256 names it
(``ledger-artifact:sha256:<hex>``); identical content is stored once (``SqlLedgerStore.put_artifacts``). Redaction
(`loopd._infra.redaction.Redactor`, the one the model cassettes use too) runs on every string inside the document
*before* it is encoded, so the stored bytes and their hash never hold a secret: API keys (``sk-…``, ``AKIA…``,
``ghp_…``, ``xox…-``, ``glpat-…``), bearer tokens, private-key blocks, ``key=value`` pairs and fields whose name says
secret / token / password / api key, any literal secret given (e.g. the configured provider keys), and configured
patterns. Must not do: I/O.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Final

from loopd._infra.jsontext import compact
from loopd._infra.redaction import REDACTED, RedactionPatternError, Redactor
from loopd.server.storage import InvalidRecord

from ._records import ArtifactRef

URI_PREFIX: Final = "ledger-artifact:sha256:"

MESSAGES_TYPE: Final = "application/vnd.loopd.messages+json"
"""A segment of a prompt's message list: ``{"parent": sha256 | null, "messages": [...]}``; the whole list is the
parent chain's messages followed by these."""
TOOLS_TYPE: Final = "application/vnd.loopd.tools+json"
REQUEST_TYPE: Final = "application/vnd.loopd.model-request+json"
REPLY_TYPE: Final = "application/vnd.loopd.model-reply+json"


@dataclass(frozen=True, slots=True)
class ArtifactBlob:
    """An artifact ready to store: its reference and its bytes."""

    ref: ArtifactRef
    body: bytes


def canonical_bytes(document: Any) -> bytes:
    """The canonical JSON encoding artifacts are hashed and stored in."""
    return compact(document, sort_keys=True).encode()


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


__all__ = [
    "MESSAGES_TYPE",
    "REDACTED",
    "REPLY_TYPE",
    "REQUEST_TYPE",
    "TOOLS_TYPE",
    "URI_PREFIX",
    "ArtifactBlob",
    "RedactionPatternError",
    "Redactor",
    "artifact_blob",
    "canonical_bytes",
    "parse_duration",
    "ref_from_payload",
    "ref_payload",
]
