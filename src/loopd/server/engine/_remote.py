"""`RemoteHarnessAdapter`: a harness behind ``loopd harness serve`` (or a service speaking the same HTTP API).

- start / resume: ``POST /v1/sessions`` with ``Idempotency-Key: <call id>`` (so a retry or a resume on another
  replica reaches the same remote session, never a second one; a session left dormant by a peer restart is
  restored, in the peer's recovery mode); then read the session's journal pages and post
  the prompt to ``/inputs`` only if no input ever reached the session. (A crash between the remote accepting
  the input and journaling its turn — a few milliseconds inside the peer — would make a resume post it again:
  the one window this protocol cannot close, since the peer offers no idempotent input.)
- updates: ``GET /v1/sessions/{id}/events`` (SSE) from journal seq 1, through `HarnessTranslator`; after a
  dropped connection it reconnects with ``Last-Event-ID`` (the last stored seq seen), so nothing is repeated or
  skipped. Too many failed reconnects in a row → `ObservationLost` (the engine resumes the call later).
- gates: ``POST /v1/sessions/{id}/gates/{gate id}``; cancel: ``POST /v1/sessions/{id}/interrupt``.
- prompts (``prompts``, a `PromptRecording`): at each `ModelCalled` / `Failed` the run reads the session's new
  model-call records (``GET /v1/sessions/{id}/model-calls``, redacted by the peer) into a `PromptLog`, exactly the
  log the built-in adapter fills in process, so the trail stores them the same way (content-addressed request and
  reply per attempt). Only records the peer made before the event (``after_seq`` < its seq) are offered to it, so
  a replayed event of an earlier call never takes a later call's record. Reading them is best effort: a failure is
  logged and the call goes on with usage facts only.

Every request has a timeout (``timeout``; the event stream's read timeout is ``stream_timeout``, longer than
the peer's heartbeat). Transport errors, 5xx and 429 become `ObservationLost`; other errors fail the call.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, Final

import httpx
from pydantic import TypeAdapter, ValidationError

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, SystemClock
from loopd._infra.sse import read_sse
from loopd._infra.telemetry import httpx_trace_hooks
from loopd.harness.core import Message, ToolCall, Usage
from loopd.harness.core.events import Event as HarnessEvent
from loopd.harness.models import ModelAttemptRecord, ModelCallRecord, ModelRequest, ToolSpec
from loopd.server.ledger import EffectKind, Idempotency

from ._adapter import AdapterRequest, Failed, GateAnswer, ModelCalled, Update
from ._errors import AdapterError, ObservationLost
from ._prompts import PromptLog, PromptRecording
from ._translation import HarnessTranslator

_log = logging.getLogger(__name__)

_EVENTS: Final = TypeAdapter(HarnessEvent)
_INPUT_KINDS: Final = frozenset({"turn_started", "input_queued", "input_rejected", "inputs_folded"})
_JOURNAL_PAGE: Final = 1000
_MAX_JOURNAL_PAGES: Final = 100
_RECONNECT: Final = Backoff(base=0.5, factor=2.0, max_delay=5.0)
_MODEL_CALL_PAGE: Final = 50
_MAX_MODEL_CALL_PAGES: Final = 20


class RemoteError(AdapterError):
    """The remote harness refused a request (4xx other than 429): the call fails."""


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code == 429 or response.status_code >= 500:
        raise ObservationLost(f"the remote harness answered {response.status_code}: {response.text[:300]}")
    if response.status_code >= 400:
        raise RemoteError(f"the remote harness refused the request ({response.status_code}): {response.text[:300]}")
    body = response.json()
    if not isinstance(body, dict):
        raise RemoteError("the remote harness answered with something that is not a JSON object")
    return body


class _Client:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.http = client

    async def call(self, method: str, url: str, **options: Any) -> dict[str, Any]:
        try:
            response = await self.http.request(method, url, **options)
        except httpx.TransportError as exc:
            raise ObservationLost(f"the remote harness is unreachable: {exc!r}") from exc
        return _check(response)


class RemoteRun:
    """One remote session, observed through its event stream."""

    def __init__(
        self,
        client: _Client,
        session_id: str,
        *,
        loop: str | None,
        stream_timeout: float,
        max_reconnects: int,
        clock: Clock,
        prompts: PromptLog | None = None,
    ) -> None:
        self._client = client
        self._prompts = prompts
        self._calls_after = 0
        self._calls: deque[tuple[int, ModelCallRecord]] = deque()
        """Fetched model-call records not offered to the prompt log yet: (the peer's seq when it ended, record)."""
        self._clock = clock
        self._session_id = session_id
        self._loop = loop
        self._stream_timeout = stream_timeout
        self._max_reconnects = max_reconnects
        self._translator = HarnessTranslator(model_name="remote", main_loop=loop)

    @property
    def execution_ref(self) -> str | None:
        return self._session_id

    @property
    def replays(self) -> bool:
        return True

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{self._session_id}{suffix}"

    async def updates(self) -> AsyncIterator[Update]:
        last_seq: int | None = None
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            params: dict[str, Any] = {}
            if last_seq is None:
                params["from_seq"] = 1
            else:
                headers["Last-Event-ID"] = str(last_seq)
            timeout = httpx.Timeout(self._stream_timeout, connect=10.0)
            try:
                async with self._client.http.stream(
                    "GET", self._path("/events"), params=params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        _check(response)
                        raise RemoteError(f"the remote event stream answered {response.status_code}")
                    async for kind, seq, data in _sse_messages(response.aiter_text()):
                        failures = 0
                        if kind == "error":
                            resume = data.get("error", {}).get("resume_from") if isinstance(data, dict) else None
                            if isinstance(resume, int) and resume > 1:
                                last_seq = resume - 1
                            break
                        if seq is not None:
                            last_seq = seq
                        event = data.get("event") if isinstance(data, dict) else None
                        try:
                            parsed = _EVENTS.validate_python(event)
                        except ValidationError:
                            continue  # an event kind this loopd does not know: nothing to show for it
                        for update in self._translator.feed(parsed):
                            yield await self._with_prompts(update, seq)
                        if self._translator.finished:
                            return
            except (httpx.TransportError, ObservationLost) as exc:
                failures += 1
                if failures > self._max_reconnects:
                    raise ObservationLost(f"the remote event stream keeps failing: {exc!r}") from exc
            await self._clock.sleep(_RECONNECT.delay(failures))

    async def _with_prompts(self, update: Update, seq: int | None) -> Update:
        """``update`` with the recorded prompts of its model calls (see the module docstring), when recording."""
        if self._prompts is None or not isinstance(update, ModelCalled | Failed):
            return update
        await self._fetch_model_calls()
        while self._calls and (seq is None or self._calls[0][0] < seq):
            self._prompts.record(self._calls.popleft()[1])
        if isinstance(update, ModelCalled):
            recorded = self._prompts.take(update.input_tokens, update.output_tokens)
            return replace(update, recorded=recorded) if recorded is not None else update
        lost = self._prompts.take_failed()  # model calls whose every attempt failed
        return replace(update, recorded=tuple(lost)) if lost else update

    async def _fetch_model_calls(self) -> None:
        """Read the session's model-call records after the last one read (best effort: see the module docstring)."""
        try:
            for _ in range(_MAX_MODEL_CALL_PAGES):
                page = await self._client.call(
                    "GET", self._path("/model-calls"), params={"after": self._calls_after, "limit": _MODEL_CALL_PAGE}
                )
                previous: tuple[Message, ...] = ()
                for item in page.get("items") or []:
                    after_seq, call, previous = _model_call(item, previous)
                    self._calls.append((after_seq, call))
                self._calls_after = int(page.get("next_after", self._calls_after))
                if not page.get("has_more"):
                    return
        except (AdapterError, httpx.HTTPError, ValidationError, ValueError, TypeError, KeyError) as exc:
            _log.warning("could not read the model calls of remote session %s: %s", self._session_id, exc)

    async def answer_gate(self, gate_id: str, answer: GateAnswer) -> None:
        await self._client.call("POST", self._path(f"/gates/{gate_id}"), json={"answer": answer})

    async def cancel(self) -> None:
        await self._client.call("POST", self._path("/interrupt"), json={"reason": "cancelled by the harness engine"})

    async def aclose(self) -> None:
        return None  # the remote session belongs to its server; nothing is held here


def _model_call(item: Any, previous: tuple[Message, ...]) -> tuple[int, ModelCallRecord, tuple[Message, ...]]:
    """One record of ``GET /v1/sessions/{id}/model-calls``: (after_seq, the call, its messages). ``previous``: the
    messages of the page's previous item (``request.extends`` of them come first)."""
    request = item["request"]
    extends = int(request.get("extends") or 0)
    if extends > len(previous):
        raise ValueError("a model-call record extends more messages than the previous one had")
    messages = previous[:extends] + tuple(Message.model_validate(m) for m in request.get("messages") or [])
    call = ModelCallRecord(
        ModelRequest(
            model=str(request["model"]),
            messages=messages,
            tools=tuple(ToolSpec.model_validate(tool) for tool in request.get("tools") or []),
            system=request.get("system"),
            max_output_tokens=request.get("max_output_tokens"),
            temperature=request.get("temperature"),
        ),
        tuple(_attempt(attempt) for attempt in item.get("attempts") or []),
    )
    return int(item.get("after_seq") or 0), call, messages


def _attempt(data: Mapping[str, Any]) -> ModelAttemptRecord:
    usage = data.get("usage")
    return ModelAttemptRecord(
        model=str(data["model"]),
        started_at=float(data["started_at"]),
        ended_at=float(data["ended_at"]),
        provider=data.get("provider"),
        error_type=data.get("error_type"),
        message=data.get("message"),
        status_code=data.get("status_code"),
        retry_after=data.get("retry_after"),
        text=str(data.get("text") or ""),
        tool_calls=tuple(ToolCall.model_validate(call) for call in data.get("tool_calls") or []),
        usage=Usage.model_validate(usage) if usage is not None else None,
        finish_reason=data.get("finish_reason"),
        request_id=data.get("request_id"),
    )


async def _sse_messages(chunks: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, int | None, Any]]:
    """``(event name, id as int, decoded data)`` per SSE message whose data is JSON; comments, heartbeats and
    ``retry:`` lines carry no data and are skipped (the framing rules are the floor's `read_sse`)."""
    async for message in read_sse(chunks):
        if message.data is None:
            continue
        try:
            decoded: Any = json.loads(message.data)
        except json.JSONDecodeError:
            continue
        if decoded is None:
            continue
        seq = int(message.id) if message.id is not None and message.id.isascii() and message.id.isdigit() else None
        yield message.event, seq, decoded


class RemoteHarnessAdapter:
    """A ``loopd harness serve`` peer at ``base_url`` (``token``: its bearer token). Close with `aclose`.
    ``prompts``: store each model call's request and replies in the ledger (read from the peer)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        loop: str | None = None,
        timeout: float = 10.0,
        stream_timeout: float = 60.0,
        max_reconnects: int = 5,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
        prompts: PromptRecording | None = None,
    ) -> None:
        self._clock = clock or SystemClock()  # the pause between reconnects of the event stream
        self._prompts = prompts  # full prompts for the ledger, read from the peer (see the module docstring)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout),
            transport=transport,
            event_hooks=httpx_trace_hooks(),  # the call's trace continues in the remote harness
        )
        self._client = _Client(self._http)
        self._loop = loop
        self._stream_timeout = stream_timeout
        self._max_reconnects = max_reconnects

    @property
    def supports_resume(self) -> bool:
        return True

    @property
    def effect(self) -> tuple[EffectKind, Idempotency]:
        return EffectKind.WRITE, Idempotency.KEYED

    async def aclose(self) -> None:
        await self._http.aclose()

    async def start(self, request: AdapterRequest) -> RemoteRun:
        return await self._open(request)

    async def resume(self, request: AdapterRequest, execution_ref: str | None) -> RemoteRun:
        return await self._open(request)

    async def _open(self, request: AdapterRequest) -> RemoteRun:
        created = await self._client.call("POST", "/v1/sessions", json={}, headers={"Idempotency-Key": request.call_id})
        session_id = created.get("id")
        if not isinstance(session_id, str) or not session_id:
            raise RemoteError("the remote harness created a session without an id")
        if created.get("status") in ("dormant", "faulted"):
            # The peer restarted since: bring the session back (an open turn comes back interrupted, which the
            # call then reports), or its event stream would wait for a session nobody runs.
            await self._client.call("POST", f"/v1/sessions/{session_id}/restore")
        if not await self._has_input(session_id):
            body: dict[str, Any] = {"text": request.prompt()}
            if self._loop is not None:
                body["loop"] = self._loop
            await self._client.call("POST", f"/v1/sessions/{session_id}/inputs", json=body)
        return RemoteRun(
            self._client,
            session_id,
            loop=self._loop,
            stream_timeout=self._stream_timeout,
            max_reconnects=self._max_reconnects,
            clock=self._clock,
            prompts=self._prompts.log() if self._prompts is not None else None,
        )

    async def _has_input(self, session_id: str) -> bool:
        """Whether the session's journal shows any input (so the prompt was posted before)."""
        from_seq = 1
        for _ in range(_MAX_JOURNAL_PAGES):
            page = await self._client.call(
                "GET", f"/v1/sessions/{session_id}/journal", params={"from_seq": from_seq, "limit": _JOURNAL_PAGE}
            )
            items = page.get("items") or []
            if any(isinstance(item, Mapping) and item.get("kind") in _INPUT_KINDS for item in items):
                return True
            if not page.get("has_more"):
                return False
            from_seq = int(page.get("next_from_seq", from_seq + len(items)))
        raise ObservationLost("the remote session's journal is too long to check for the input")
