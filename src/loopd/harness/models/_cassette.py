"""Model cassettes: a provider's HTTP traffic recorded to a file and replayed from it, deterministically.

A cassette sits at the HTTP transport under the provider SDK (`CassetteTransport`, an ``httpx2`` transport; both the
``openai`` and the ``anthropic`` clients send through one), so every adapter records and replays the same way.

**Modes** (`CassetteSettings.mode`; ``LOOPD_MODEL_CASSETTE_MODE``):

    replay   (default) answer every request from the file; the network is never used. A request the file does not
             hold fails with `CassetteMismatchError`, whose ``diff`` is a unified diff of the canonical request
             against the recorded one it most likely should have been. A missing file is a `CassetteError`.
    record   send every request to the provider and rewrite the file with what came back.
    auto     replay what the file holds, record (append) what it does not.

**Matching** is on the *canonical request*: method, URL path and query (host and port are ignored, so a scripted
server on any port replays), and the JSON body with its keys sorted, the volatile top-level fields dropped
(``user``, ``metadata``, …: `DEFAULT_VOLATILE`) and secrets redacted. Request headers are neither matched nor
written down. Identical requests are answered in the order they were recorded.

**Secrets** never reach the file: the credentials the request carried (``Authorization``, ``x-api-key``,
``api-key`` headers) are removed wherever they appear, as are API-key shapes, bearer tokens, fields named like
secrets (``api_key``, ``token``, …), query parameters named so, and the configured patterns
(``LOOPD_MODEL_CASSETTE_REDACT``); see ``loopd._infra.redaction``. Response headers are kept only when they matter
to a client (content type, retry hints, request ids, rate-limit counters).

**The file** is YAML: a header document (``loopd_cassette: 1`` and the ``redact`` patterns it was recorded with, which
a replay applies too, so a request redacted then still matches), then one document per request: ``request`` (method,
path, the JSON body with sorted keys) and ``response``
(status, headers, ``at``: seconds from sending the request to its headers, and either ``events``, the SSE events
each with its ``at``, or ``body``/``json``). A stream the client closed early is kept with ``truncated: true``.
With ``timing: recorded`` (``LOOPD_MODEL_CASSETTE_TIMING``) a replay sleeps the recorded gaps on its `Clock`, so a
test on a virtual clock sees the provider's pacing exactly and instantly; the default replays at once.

Must not do: know any provider's API beyond "HTTP with JSON bodies and SSE streams".
"""

from __future__ import annotations

import difflib
import json
import os
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import parse_qsl, urlencode

import yaml
from pydantic import Field, field_validator

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.redaction import REDACTED, RedactionPatternError, Redactor, is_secret_name
from loopd.harness._errors import ModelPermanentError
from loopd.harness.core import Frozen

if TYPE_CHECKING:
    import httpx2

    from loopd.harness.models._cassette_http import CassetteTransport

CassetteMode = Literal["replay", "record", "auto"]
CassetteTiming = Literal["instant", "recorded"]
CASSETTE_MODES: Final[tuple[CassetteMode, ...]] = ("replay", "record", "auto")
CASSETTE_TIMINGS: Final[tuple[CassetteTiming, ...]] = ("instant", "recorded")

CASSETTE_ENV: Final = "LOOPD_MODEL_CASSETTE"
MODE_ENV: Final = "LOOPD_MODEL_CASSETTE_MODE"
TIMING_ENV: Final = "LOOPD_MODEL_CASSETTE_TIMING"
REDACT_ENV: Final = "LOOPD_MODEL_CASSETTE_REDACT"

REPLAY_API_KEY: Final = "cassette-replay"
"""The API key a replaying model is given when none is configured: replay never sends a request."""

DEFAULT_VOLATILE: Final = ("user", "metadata", "safety_identifier", "prompt_cache_key")
"""Top-level request body fields dropped before matching and writing: they vary between runs, not between asks."""

SECRET_HEADERS: Final = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key"})
KEPT_RESPONSE_HEADERS: Final = frozenset(
    {"content-type", "retry-after", "retry-after-ms", "x-should-retry", "x-request-id", "request-id"}
)
KEPT_RESPONSE_PREFIXES: Final = ("x-ratelimit-", "anthropic-ratelimit-")

_HEADER: Final = "# loopd model cassette (format 1): one YAML document per request; see docs/testing.md\n"
_FORMAT_KEY: Final = "loopd_cassette"


class CassetteError(ModelPermanentError):
    """A cassette cannot be used: missing or malformed file, a bad setting, or every recorded reply already played."""


class CassetteMismatchError(CassetteError):
    """Replay met a request the cassette does not hold. ``diff`` is a unified diff (recorded → sent) of the
    canonical request; ``request`` is the canonical request sent, as indented JSON."""

    def __init__(self, message: str, *, path: Path, request: str, diff: str) -> None:
        super().__init__(message)
        self.path = path
        self.request = request
        self.diff = diff


class CassetteSettings(Frozen):
    """Where a cassette is and how to use it. ``redact``: extra regular expressions scrubbed from what is written;
    ``volatile``: top-level body fields ignored when matching (and not written)."""

    path: Path
    mode: CassetteMode = "replay"
    timing: CassetteTiming = "instant"
    redact: tuple[str, ...] = ()
    volatile: tuple[str, ...] = DEFAULT_VOLATILE

    @field_validator("redact")
    @classmethod
    def _patterns_compile(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        try:
            Redactor(value)
        except RedactionPatternError as exc:
            raise ValueError(str(exc)) from None
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CassetteSettings | None:
        """The settings named by ``LOOPD_MODEL_CASSETTE*`` in ``env`` (default ``os.environ``); None when unset.

        Raises `CassetteError` for a mode, timing or pattern it does not know.
        """
        source = os.environ if env is None else env
        path = source.get(CASSETTE_ENV, "").strip()
        if not path:
            return None
        mode = source.get(MODE_ENV, "").strip().lower() or "replay"
        if mode not in CASSETTE_MODES:
            raise CassetteError(f"{MODE_ENV}={mode!r}: use one of {', '.join(CASSETTE_MODES)}")
        timing = source.get(TIMING_ENV, "").strip().lower() or "instant"
        if timing not in CASSETTE_TIMINGS:
            raise CassetteError(f"{TIMING_ENV}={timing!r}: use one of {', '.join(CASSETTE_TIMINGS)}")
        try:
            return cls.model_validate(
                {"path": Path(path), "mode": mode, "timing": timing, "redact": _patterns(source.get(REDACT_ENV, ""))}
            )
        except ValueError as exc:
            raise CassetteError(f"{REDACT_ENV}: {exc}") from None

    def env(self) -> dict[str, str]:
        """The environment variables that select these settings (for a ``loopd`` child process)."""
        out = {CASSETTE_ENV: str(self.path), MODE_ENV: self.mode, TIMING_ENV: self.timing}
        if self.redact:
            out[REDACT_ENV] = json.dumps(list(self.redact))
        return out


def _patterns(raw: str) -> tuple[str, ...]:
    raw = raw.strip()
    if not raw:
        return ()
    if raw.startswith("["):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CassetteError(f"{REDACT_ENV}: not a JSON array of regular expressions ({exc})") from None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise CassetteError(f"{REDACT_ENV}: a JSON array must hold strings (regular expressions)")
        return tuple(value)
    return (raw,)


class CassetteStatistics(Frozen):
    """What a cassette did: ``entries`` in the file now, ``played`` answers replayed, ``recorded`` exchanges written,
    ``unplayed`` recorded answers no request asked for (yet)."""

    entries: int = Field(ge=0)
    played: int = Field(ge=0)
    recorded: int = Field(ge=0)
    unplayed: int = Field(ge=0)


# ----------------------------------------------------------------------------------------------------
# Entries


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event as it was on the wire (field lines, no blank line) and when it arrived."""

    text: str
    at: float | None = None


@dataclass(frozen=True, slots=True)
class RecordedResponse:
    """A provider's answer: status, the kept headers, and a body that is either SSE ``events`` or ``body`` text."""

    status: int
    headers: dict[str, str]
    at: float | None = None
    events: tuple[SseEvent, ...] | None = None
    body: str = ""
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Entry:
    """One request/response pair of a cassette. ``request`` is canonical (see `canonical_request`)."""

    request: dict[str, Any]
    response: RecordedResponse
    key: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", request_key(self.request))

    def document(self) -> dict[str, Any]:
        """The YAML document of this entry."""
        response = self.response
        out: dict[str, Any] = {"status": response.status, "headers": dict(response.headers)}
        if response.at is not None:
            out["at"] = round(response.at, 4)
        if response.events is not None:
            out["events"] = [
                {"sse": event.text} | ({} if event.at is None else {"at": round(event.at, 4)})
                for event in response.events
            ]
        elif _is_json(response.headers) and (parsed := _json_or_none(response.body)) is not None:
            out["json"] = parsed
        else:
            out["body"] = response.body
        if response.truncated:
            out["truncated"] = True
        return {"request": _sorted(self.request), "response": out}

    @classmethod
    def from_document(cls, document: Any) -> Entry:
        """Parse one YAML document (raises `ValueError` saying what is wrong)."""
        if not isinstance(document, dict) or not isinstance(document.get("request"), dict):
            raise ValueError("a document needs a 'request' mapping")
        request = document["request"]
        if not isinstance(request.get("method"), str) or not isinstance(request.get("path"), str):
            raise ValueError("'request' needs 'method' and 'path' strings")
        response = document.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("status"), int):
            raise ValueError("a document needs a 'response' mapping with an integer 'status'")
        headers = response.get("headers") or {}
        if not isinstance(headers, dict):
            raise ValueError("'response.headers' must be a mapping")
        events: tuple[SseEvent, ...] | None = None
        if "events" in response:
            raw_events = response["events"]
            if not isinstance(raw_events, list):
                raise ValueError("'response.events' must be a list")
            events = tuple(_event(item) for item in raw_events)
        if "json" in response:
            body = json.dumps(response["json"], ensure_ascii=False)
        else:
            body = str(response.get("body", ""))
        return cls(
            request=request,
            response=RecordedResponse(
                status=response["status"],
                headers={str(k).lower(): str(v) for k, v in headers.items()},
                at=_seconds(response.get("at")),
                events=events,
                body=body,
                truncated=bool(response.get("truncated", False)),
            ),
        )


def _sorted(value: Any) -> Any:
    """``value`` with every mapping's keys sorted, except the request's own (method, path, then the body)."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value, key=_request_order)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _request_order(key: str) -> tuple[int, str]:
    return ({"method": 0, "path": 1}.get(key, 2), key)


def _event(item: Any) -> SseEvent:
    if not isinstance(item, dict) or not isinstance(item.get("sse"), str):
        raise ValueError("each of 'response.events' needs an 'sse' string")
    return SseEvent(text=item["sse"], at=_seconds(item.get("at")))


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"a time must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _is_json(headers: Mapping[str, str]) -> bool:
    return "json" in headers.get("content-type", "")


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def redact_events(events: Iterable[SseEvent], redactor: Redactor) -> tuple[SseEvent, ...]:
    """SSE events without secrets, including one a provider streamed split across events.

    The string leaves of the events' JSON ``data`` are grouped by their path (``choices.0.delta.content``, …) and each
    group's concatenation is redacted as one text (`Redactor.fragments`); a leaf under a secret-named key is replaced
    whole; an event whose data is not one JSON document is redacted as text.
    """
    items = list(events)
    parsed: list[Any] = []
    changed: set[int] = set()
    leaves: dict[tuple[str | int, ...], list[tuple[int, Any, Any]]] = defaultdict(list)

    def walk(node: Any, at: tuple[str | int, ...], index: int) -> None:
        pairs = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for name, child in pairs:
            if isinstance(child, str):
                if isinstance(name, str) and is_secret_name(name):
                    node[name] = REDACTED
                    changed.add(index)
                else:
                    leaves[(*at, name)].append((index, node, name))
            else:
                walk(child, (*at, name), index)

    for index, event in enumerate(items):
        data = _single_data(event.text)
        document = _json_or_none(data) if data is not None else None
        parsed.append(document if isinstance(document, dict | list) else None)
        if parsed[-1] is not None:
            walk(parsed[-1], (), index)
    for group in leaves.values():
        pieces = [holder[key] for _, holder, key in group]
        for (index, holder, key), clean in zip(group, redactor.fragments(pieces), strict=True):
            if clean != holder[key]:
                holder[key] = clean
                changed.add(index)
    out: list[SseEvent] = []
    for index, (event, document) in enumerate(zip(items, parsed, strict=True)):
        if document is None:
            out.append(SseEvent(redactor.text(event.text), event.at))
        elif index in changed:
            head = [line for line in event.text.split("\n") if not line.startswith("data:")]
            data = "data: " + json.dumps(document, separators=(",", ":"), ensure_ascii=False)
            out.append(SseEvent("\n".join([*head, data]), event.at))
        else:
            out.append(event)
    return tuple(out)


def _single_data(text: str) -> str | None:
    """The data of an SSE event with exactly one ``data:`` line, else None."""
    data = [line[5:].removeprefix(" ") for line in text.split("\n") if line.startswith("data:")]
    return data[0] if len(data) == 1 else None


def request_key(request: Mapping[str, Any]) -> str:
    """The matching key of a canonical request: compact JSON with sorted keys."""
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_text(request: Mapping[str, Any]) -> str:
    """A canonical request as indented JSON, one field per line (what diffs are made of)."""
    return json.dumps(request, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def canonical_request(
    method: str,
    path: str,
    query: Iterable[tuple[str, str]],
    body: bytes,
    *,
    redactor: Redactor,
    volatile: Iterable[str] = DEFAULT_VOLATILE,
) -> dict[str, Any]:
    """The canonical form of a request: what is matched and what is written (see the module docstring)."""
    params = sorted((name, REDACTED if is_secret_name(name) else redactor.text(value)) for name, value in query)
    target = path + ("?" + urlencode(params) if params else "")
    out: dict[str, Any] = {"method": method.upper(), "path": target}
    if not body:
        return out
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        out["body"] = redactor.text(body.decode("utf-8", errors="replace"))
        return out
    if isinstance(parsed, dict):
        dropped = set(volatile)
        parsed = {name: value for name, value in parsed.items() if name not in dropped}
    out["json"] = redactor.value(parsed)
    return out


def split_query(raw: bytes | str) -> list[tuple[str, str]]:
    """A URL's query as (name, value) pairs."""
    text = raw.decode("ascii", errors="replace") if isinstance(raw, bytes) else raw
    return parse_qsl(text, keep_blank_values=True)


# ----------------------------------------------------------------------------------------------------
# The cassette


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so prompts stay readable in the file."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not value.endswith((" ", "\t")) and "\r" not in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump_entry(entry: Entry) -> str:
    """One entry as a YAML document (with its ``---`` separator)."""
    text = yaml.dump(entry.document(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=2**31 - 1)
    return "---\n" + text


def load_entries(path: Path) -> list[Entry]:
    """Every entry of a cassette file (raises `CassetteError` naming the file and document)."""
    return load_cassette(path)[1]


def load_cassette(path: Path) -> tuple[tuple[str, ...], list[Entry]]:
    """The redaction patterns a cassette file was recorded with, and its entries (`CassetteError` when malformed;
    `FileNotFoundError` when missing)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise CassetteError(f"cassette {path}: cannot be read ({exc})") from exc
    entries: list[Entry] = []
    patterns: tuple[str, ...] = ()
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise CassetteError(f"cassette {path}: not valid YAML ({exc})") from exc
    for number, document in enumerate((d for d in documents if d is not None), start=1):
        if isinstance(document, dict) and _FORMAT_KEY in document:
            redact = document.get("redact") or []
            if document[_FORMAT_KEY] != 1 or not isinstance(redact, list):
                raise CassetteError(f"cassette {path}, document {number}: not a format-1 cassette header")
            patterns = tuple(str(p) for p in redact)
            continue
        try:
            entries.append(Entry.from_document(document))
        except ValueError as exc:
            raise CassetteError(f"cassette {path}, document {number}: {exc}") from exc
    return patterns, entries


class Cassette:
    """One cassette file in use: the recorded entries, what has been played, and the recorder's appends.

    Build it with `open_cassette` (or the constructor). In ``record`` mode the file is rewritten from empty at once;
    in ``replay`` mode a missing file raises `CassetteError`; ``auto`` starts from what is there, if anything.
    ``clock`` paces a ``timing: recorded`` replay and measures a recording. Not shared between event loops.
    """

    def __init__(self, settings: CassetteSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._entries: list[Entry] = []
        self._queues: dict[str, deque[Entry]] = defaultdict(deque)
        self._played = 0
        self._recorded = 0
        path = settings.path
        if settings.mode == "record":
            self.redactor = Redactor(settings.redact)
            _write_new(path, settings.redact)
            return
        try:
            recorded_with, entries = load_cassette(path)
        except FileNotFoundError:
            if settings.mode == "replay":
                raise CassetteError(
                    f"no cassette at {path}: replay never calls the provider; record it first "
                    f"({MODE_ENV}=record, or auto to record only what is missing)"
                ) from None
            _write_new(path, settings.redact)
            recorded_with, entries = settings.redact, []
        # The patterns the file was recorded with apply on replay too, so a request redacted then still matches.
        self.redactor = Redactor(dict.fromkeys((*recorded_with, *settings.redact)))
        for entry in entries:
            self._remember(entry)

    @property
    def path(self) -> Path:
        return self.settings.path

    @property
    def mode(self) -> CassetteMode:
        return self.settings.mode

    @property
    def records(self) -> bool:
        """Whether requests the cassette cannot answer go to the provider (``record`` and ``auto``)."""
        return self.settings.mode != "replay"

    def statistics(self) -> CassetteStatistics:
        """Counts of entries, replies played, exchanges recorded and recorded replies not asked for."""
        return CassetteStatistics(
            entries=len(self._entries),
            played=self._played,
            recorded=self._recorded,
            unplayed=sum(len(queue) for queue in self._queues.values()),
        )

    def transport(self, inner: httpx2.AsyncBaseTransport | None = None) -> CassetteTransport:
        """An ``httpx2`` transport answering from this cassette; ``inner`` (default: a new ``AsyncHTTPTransport``,
        created only when the mode records) carries what must reach the provider."""
        from loopd.harness.models._cassette_http import CassetteTransport

        return CassetteTransport(self, inner)

    def http_client(
        self, *, timeout: float = 60.0, inner: httpx2.AsyncBaseTransport | None = None
    ) -> httpx2.AsyncClient:
        """An ``httpx2.AsyncClient`` over `transport`, for any SDK that accepts one (``openai``, ``anthropic``)."""
        import httpx2

        return httpx2.AsyncClient(transport=self.transport(inner), timeout=timeout, follow_redirects=True)

    # -- used by the transport ----------------------------------------------------------------------

    def canonical(self, method: str, path: str, query: bytes | str, body: bytes, secrets: Iterable[str]) -> Redacting:
        """The canonical request, and the redactor for this exchange (which also knows its credentials)."""
        redactor = self.redactor.with_literals(secrets)
        request = canonical_request(
            method, path, split_query(query), body, redactor=redactor, volatile=self.settings.volatile
        )
        return Redacting(request=request, redactor=redactor)

    def take(self, request: Mapping[str, Any]) -> Entry | None:
        """The next recorded answer to ``request``, or None (in order, each played once)."""
        queue = self._queues.get(request_key(request))
        if not queue:
            return None
        self._played += 1
        return queue.popleft()

    def mismatch(self, request: Mapping[str, Any]) -> CassetteMismatchError:
        """The error for a request replay cannot answer, with a diff against the likeliest recorded request."""
        sent = request_text(request)
        key = request_key(request)
        known = [entry for entry in self._entries if entry.key == key]
        path = self.settings.path
        if known:
            return CassetteMismatchError(
                f"cassette {path}: all {len(known)} recorded answers to this request were already played "
                f"({request.get('method')} {request.get('path')}); record the run again to capture the repeat",
                path=path,
                request=sent,
                diff="",
            )
        nearest = self._nearest(request)
        if nearest is None:
            diff = "".join(difflib.unified_diff([], sent.splitlines(keepends=True), "recorded (none)", "sent"))
            what = "it holds no requests"
        else:
            recorded = request_text(nearest.request)
            diff = "".join(
                difflib.unified_diff(
                    recorded.splitlines(keepends=True), sent.splitlines(keepends=True), "recorded", "sent"
                )
            )
            what = "the nearest recorded request differs"
        return CassetteMismatchError(
            f"cassette {path} has no answer to {request.get('method')} {request.get('path')} ({what}); "
            f"record again ({MODE_ENV}=record, or auto to add it):\n{diff}",
            path=path,
            request=sent,
            diff=diff,
        )

    def _nearest(self, request: Mapping[str, Any]) -> Entry | None:
        """The recorded request this one most likely should have been: the next unplayed one in recording order, if
        any is for the same method and path; else the most similar one."""
        same_target = [e for e in self._entries if e.request.get("path") == request.get("path")]
        for entry in same_target:
            queue = self._queues.get(entry.key)
            if queue and queue[0] is entry:
                return entry
        candidates = same_target or self._entries
        if not candidates:
            return None
        sent = request_text(request)
        return max(candidates, key=lambda e: difflib.SequenceMatcher(None, request_text(e.request), sent).ratio())

    def record(self, entry: Entry) -> None:
        """Append ``entry`` to the file. It is not replayable in this run: a repeat of the request is recorded again."""
        with self.settings.path.open("a", encoding="utf-8") as out:
            out.write(dump_entry(entry))
        self._entries.append(entry)
        self._recorded += 1

    def _remember(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._queues[entry.key].append(entry)


@dataclass(frozen=True, slots=True)
class Redacting:
    """A canonical request and the redactor that made it (for the response of the same exchange)."""

    request: dict[str, Any]
    redactor: Redactor


def _write_new(path: Path, patterns: tuple[str, ...]) -> None:
    """Start a cassette file (owner-only: it holds prompts): a comment, and the header naming its patterns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    header = {_FORMAT_KEY: 1} | ({"redact": list(patterns)} if patterns else {})
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(_HEADER + "---\n" + yaml.dump(header, Dumper=_Dumper, sort_keys=False, width=2**31 - 1))


def open_cassette(
    path: Path | str | CassetteSettings,
    *,
    mode: CassetteMode | None = None,
    timing: CassetteTiming | None = None,
    redact: Iterable[str] = (),
    clock: Clock | None = None,
) -> Cassette:
    """A `Cassette` for ``path`` (or settings). ``mode`` None: ``$LOOPD_MODEL_CASSETTE_MODE``, else ``replay`` — so
    ``LOOPD_MODEL_CASSETTE_MODE=record pytest`` records a test suite's cassettes again."""
    if isinstance(path, CassetteSettings):
        settings = path
        changes: dict[str, Any] = {}
        if mode is not None:
            changes["mode"] = mode
        if timing is not None:
            changes["timing"] = timing
        if redact:
            changes["redact"] = (*settings.redact, *redact)
        settings = settings.model_copy(update=changes) if changes else settings
    else:
        chosen = mode or os.environ.get(MODE_ENV, "").strip().lower() or "replay"
        if chosen not in CASSETTE_MODES:
            raise CassetteError(f"cassette mode {chosen!r}: use one of {', '.join(CASSETTE_MODES)}")
        try:
            settings = CassetteSettings.model_validate(
                {"path": Path(path), "mode": chosen, "timing": timing or "instant", "redact": tuple(redact)}
            )
        except ValueError as exc:
            raise CassetteError(f"cassette {path}: {exc}") from None
    return Cassette(settings, clock=clock)


def cassette_transport(settings: CassetteSettings, *, clock: Clock | None = None) -> CassetteTransport:
    """The transport for a configured cassette (what `build_model` puts under the SDK client)."""
    return Cassette(settings, clock=clock).transport()
