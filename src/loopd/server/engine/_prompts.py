"""Full prompts and replies for the ledger: `PromptLog` turns one harness session's recorded model calls into
redacted, content-addressed artifacts and per-attempt facts, which the trail writes with the call's `ModelCalled`.

The built-in adapter binds a `PromptLog` to each session it opens (`loopd.harness.models.record_model_calls`); the
harness's `RecordingModel` reports every ``stream()`` call to it. When the journal's `ModelCalled` for a model call
arrives, `PromptLog.take` finds the recorded call that produced it (the oldest successful one with the same token
counts, else the oldest successful one) plus the failed calls with the same request just before it (the runtime's
retries) and encodes them:

- the message list as a chain of segments (``{"parent": sha | null, "messages": [new ones]}``): when the request
  extends an earlier request of this session (its messages start with the same message objects), only the new
  messages are encoded — a conversation of h messages stores O(h) bytes in all, not O(h²);
- the tools list (one artifact, shared by every call that offers the same tools: encoded once per engine, not per
  session — `ToolBlobs`, a few recent tool lists, since every chat's session offers the same ones), the request
  manifest (model,
  system prompt, parameters, tools and message-chain references) and each successful attempt's reply.

Every string is redacted before it is hashed (`loopd.server.ledger.Redactor`). Pending records are bounded
(`MAX_PENDING`: the oldest are dropped). Must not do: I/O (the trail writes), or block the harness.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from loopd._infra.clock import Clock
from loopd.harness.core import Message
from loopd.harness.models import ModelAttemptRecord, ModelCallRecord, ModelRequest, ToolSpec
from loopd.server.ledger import (
    MESSAGES_TYPE,
    REPLY_TYPE,
    REQUEST_TYPE,
    TOOLS_TYPE,
    ArtifactBlob,
    ArtifactRef,
    Redactor,
    artifact_blob,
)

MAX_PENDING: Final = 256
"""Recorded calls waiting for their `ModelCalled` (per session); beyond it the oldest are dropped."""
_CHAINS: Final = 8
"""Recent requests whose message chains a new request may extend (loops and subagents interleave)."""
_TOOL_LISTS: Final = 8
"""Tool lists whose encoded artifact an engine keeps (harnesses and subagents offer a few different ones)."""
SESSIONS_KEPT: Final = 128
"""Sessions whose last message chain an engine keeps for the sessions that go on from them (`SessionChains`)."""


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """One attempt of a model call, ready for the ledger."""

    model: str
    provider: str | None
    started_at: datetime
    ended_at: datetime
    request: ArtifactRef
    reply: ArtifactRef | None = None
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    provider_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """The attempts behind one reported model call (oldest first; the last one produced the reply) and every
    artifact they reference."""

    attempts: tuple[AttemptFacts, ...]
    blobs: tuple[ArtifactBlob, ...]


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _messages(messages: Sequence[Message]) -> list[Any]:
    return [message.model_dump(mode="json", exclude_none=True) for message in messages]


def _tools(tools: Sequence[ToolSpec]) -> list[Any]:
    return [tool.model_dump(mode="json") for tool in tools]


class ToolBlobs:
    """The encoded (redacted, hashed) artifacts of the last few tool lists, shared by the sessions of one engine:
    encoding a harness's tool list (JSON schemas, redaction, SHA-256) is the same work for every chat."""

    def __init__(self) -> None:
        self._known: deque[tuple[tuple[ToolSpec, ...], ArtifactBlob]] = deque(maxlen=_TOOL_LISTS)

    def blob(self, tools: tuple[ToolSpec, ...], redactor: Redactor) -> ArtifactBlob:
        """The artifact of ``tools`` (redacted with ``redactor``, the engine's one), encoded on first use."""
        for known, blob in self._known:
            if known is tools or known == tools:
                return blob
        blob = artifact_blob(_tools(tools), TOOLS_TYPE, redactor)
        self._known.append((tools, blob))
        return blob


_Chain = tuple[tuple["Message", ...], ArtifactRef]


class SessionChains:
    """The last message chain of the engine's recent sessions, by session id (the last `SESSIONS_KEPT`).

    A session that goes on from another one (a fork at its end: the conversation's next question) sends that
    session's last request again with the answer and the new question after it; seeded with that request's chain,
    its log stores only what is new. The fork's messages are equal to the parent's, not the same objects (they were
    read back from the journal), so the first match compares values once; later ones are identity checks again.
    Forgetting a session only costs storage: its child then stores its history once more."""

    def __init__(self, kept: int = SESSIONS_KEPT) -> None:
        self._kept = kept
        self._chains: OrderedDict[str, _Chain] = OrderedDict()

    def keep(self, session_id: str, chain: _Chain) -> None:
        self._chains[session_id] = chain
        self._chains.move_to_end(session_id)
        while len(self._chains) > self._kept:
            self._chains.popitem(last=False)

    def take(self, session_id: str) -> _Chain | None:
        """``session_id``'s last chain, handed to the session that goes on from it (which keeps its own from then
        on): a conversation holds one entry, its latest session's, however long its chain of sessions."""
        return self._chains.pop(session_id, None)


class PromptLog:
    """One harness session's recorded model calls (a `loopd.harness.models.ModelCallLog`). ``session_id`` and
    ``sessions``: the session's last chain is kept there, and ``parent``'s (the session it went on from) seeds it."""

    def __init__(
        self,
        clock: Clock,
        redactor: Redactor,
        tool_blobs: ToolBlobs | None = None,
        *,
        session_id: str | None = None,
        parent: str | None = None,
        sessions: SessionChains | None = None,
    ) -> None:
        self._clock = clock
        self._redactor = redactor
        self._pending: deque[ModelCallRecord] = deque(maxlen=MAX_PENDING)
        self._chains: deque[_Chain] = deque(maxlen=_CHAINS)
        self._tool_blobs = tool_blobs if tool_blobs is not None else ToolBlobs()
        self._requests: dict[int, tuple[ModelRequest, ArtifactRef]] = {}
        self._session_id = session_id
        self._sessions = sessions
        inherited = sessions.take(parent) if sessions is not None and parent is not None else None
        if inherited is not None:
            self._chains.append(inherited)

    # --- ModelCallLog ----------------------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock.now().timestamp()

    def record(self, call: ModelCallRecord) -> None:
        self._pending.append(call)

    # --- the trail's side ------------------------------------------------------------------------------------

    def take(self, input_tokens: int, output_tokens: int) -> RecordedCall | None:
        """The recorded call behind a reported model call with these token counts (and the failed tries of the
        same request before it), encoded; None when nothing recorded matches."""
        found = self._match(input_tokens, output_tokens)
        if found is None:
            return None
        position, call = found
        group: list[ModelCallRecord] = []
        kept: list[ModelCallRecord] = []
        for index, earlier in enumerate(self._pending):
            if index < position and not earlier.ok and _same_request(earlier.request, call.request):
                group.append(earlier)
            elif index != position:
                kept.append(earlier)
        group.append(call)
        self._pending = deque(kept, maxlen=MAX_PENDING)
        blobs: list[ArtifactBlob] = []
        attempts: list[AttemptFacts] = []
        for recorded in group:
            request_ref = self._request(recorded.request, blobs)
            attempts.extend(self._attempt(attempt, request_ref, blobs) for attempt in recorded.attempts)
        self._requests.clear()
        return RecordedCall(tuple(attempts), tuple(blobs))

    def take_failed(self) -> list[RecordedCall]:
        """Calls that failed for good (no reply followed): each with its attempts, oldest first; clears them."""
        failed = [call for call in self._pending if not call.ok]
        self._pending = deque((call for call in self._pending if call.ok), maxlen=MAX_PENDING)
        out: list[RecordedCall] = []
        for call in failed:
            blobs: list[ArtifactBlob] = []
            request_ref = self._request(call.request, blobs)
            out.append(RecordedCall(tuple(self._attempt(a, request_ref, blobs) for a in call.attempts), tuple(blobs)))
        self._requests.clear()
        return out

    def _match(self, input_tokens: int, output_tokens: int) -> tuple[int, ModelCallRecord] | None:
        first: tuple[int, ModelCallRecord] | None = None
        for index, call in enumerate(self._pending):
            if not call.ok:
                continue
            usage = call.attempts[-1].usage
            if usage is not None and (usage.input_tokens, usage.output_tokens) == (input_tokens, output_tokens):
                return index, call
            first = first or (index, call)
        return first

    # --- encoding --------------------------------------------------------------------------------------------

    def _request(self, request: ModelRequest, blobs: list[ArtifactBlob]) -> ArtifactRef:
        cached = self._requests.get(id(request))
        if cached is not None and cached[0] is request:
            return cached[1]
        messages = tuple(request.messages)
        head = self._chain(messages, blobs)
        tools = self._tools_blob(request.tools)
        blobs.append(tools)
        manifest = artifact_blob(
            {
                "model": request.model,
                "system": request.system,
                "temperature": request.temperature,
                "max_output_tokens": request.max_output_tokens,
                "tools": tools.ref.sha256,
                "messages": {"head": head.sha256 if head is not None else None, "count": len(messages)},
            },
            REQUEST_TYPE,
            self._redactor,
        )
        blobs.append(manifest)
        self._requests[id(request)] = (request, manifest.ref)
        return manifest.ref

    def _chain(self, messages: tuple[Message, ...], blobs: list[ArtifactBlob]) -> ArtifactRef | None:
        """The head segment of ``messages``: a new segment over the longest earlier chain they extend."""
        parent: ArtifactRef | None = None
        start = 0
        # The longest chain first (usually the session's previous call, which this one extends): the first that
        # matches is the one to extend. Tuple equality compares in C, by identity first (a history shares its
        # messages), so a long history costs one pass, not one Python-level comparison per message per chain.
        for known, ref in sorted(self._chains, key=lambda chain: len(chain[0]), reverse=True):
            if len(known) <= len(messages) and messages[: len(known)] == known:
                parent, start = ref, len(known)
                break
        if parent is not None and start == len(messages):
            return parent
        if not messages:
            return None
        segment = artifact_blob(
            {"parent": parent.sha256 if parent is not None else None, "messages": _messages(messages[start:])},
            MESSAGES_TYPE,
            self._redactor,
        )
        blobs.append(segment)
        self._chains.append((messages, segment.ref))
        if self._sessions is not None and self._session_id is not None:
            self._sessions.keep(self._session_id, (messages, segment.ref))
        return segment.ref

    def _tools_blob(self, tools: tuple[ToolSpec, ...]) -> ArtifactBlob:
        return self._tool_blobs.blob(tools, self._redactor)

    def _attempt(self, attempt: ModelAttemptRecord, request: ArtifactRef, blobs: list[ArtifactBlob]) -> AttemptFacts:
        reply: ArtifactRef | None = None
        error: dict[str, Any] | None = None
        if attempt.ok:
            blob = artifact_blob(
                {
                    "text": attempt.text,
                    "tool_calls": [call.model_dump(mode="json") for call in attempt.tool_calls],
                    "usage": attempt.usage.model_dump(mode="json") if attempt.usage is not None else None,
                    "finish_reason": attempt.finish_reason,
                    "provider_request_id": attempt.request_id,
                    "provider": attempt.provider,
                    "model": attempt.model,
                },
                REPLY_TYPE,
                self._redactor,
            )
            blobs.append(blob)
            reply = blob.ref
        else:
            error = {
                "code": attempt.error_type or "error",
                "message": self._redactor.text(attempt.message or ""),
                **({"status_code": attempt.status_code} if attempt.status_code is not None else {}),
                **({"retry_after": attempt.retry_after} if attempt.retry_after is not None else {}),
            }
        return AttemptFacts(
            model=attempt.model,
            provider=attempt.provider,
            started_at=_when(attempt.started_at),
            ended_at=_when(attempt.ended_at),
            request=request,
            reply=reply,
            error=error,
            finish_reason=attempt.finish_reason,
            provider_request_id=attempt.request_id,
        )


def _same_request(a: ModelRequest, b: ModelRequest) -> bool:
    """Whether two recorded calls asked the same thing (a retry re-sends its request)."""
    if a is b or a.messages is b.messages:
        return True
    return (
        a.model == b.model
        and len(a.messages) == len(b.messages)
        and (not a.messages or a.messages[-1] == b.messages[-1])
    )


@dataclass(frozen=True, slots=True)
class PromptRecording:
    """How the engine records full prompts: its clock (attempt timings) and the redaction applied before storage."""

    clock: Clock
    redactor: Redactor
    tool_blobs: ToolBlobs = field(default_factory=ToolBlobs, compare=False, repr=False)
    """The encoded tool lists, shared by every session's log."""
    sessions: SessionChains = field(default_factory=SessionChains, compare=False, repr=False)
    """The recent sessions' last message chains, for the sessions that go on from them."""

    def log(self, session_id: str | None = None, *, parent: str | None = None) -> PromptLog:
        """A new log for one harness session (sharing the encoded tool lists); ``parent``: the session it went on
        from (forked from), whose last chain its first request may extend."""
        return PromptLog(
            self.clock, self.redactor, self.tool_blobs, session_id=session_id, parent=parent, sessions=self.sessions
        )
