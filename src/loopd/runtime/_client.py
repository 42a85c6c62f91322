"""The HTTP client of loop-server: one ``httpx.AsyncClient``, a timeout on every call, errors typed, bounded retries.

Owns: where the server is and which credential to send (``Endpoint``, from arguments or a `loopd up` data
directory), the ``X-Loopd-Actor`` header, mapping answers to ``loopd.runtime``'s errors, retrying.
Must not do: know any route's meaning (the verb modules do), or import loopd.server / loopd.harness.

Retry rule: a request is sent again only when it got *no answer* (``httpx.TransportError``: refused, reset,
timed out) and repeating it cannot do anything twice — reads, PUTs, and the POSTs the server makes idempotent by
a key (outputs, harness calls, questions, completion, cancel). A request that may not be repeated (appending events,
a chat request) is retried only when the connection was never made. At most ``retries`` repeats, waiting on the
runtime's clock with the floor's ``Backoff``; then ``Unavailable``. An answer (any status) is never retried here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import httpx

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock
from loopd._infra.telemetry import httpx_trace_hooks
from loopd._paths import read_server_file

from ._errors import InvalidRequest, Unavailable, error_from_response

logger = logging.getLogger("loopd.runtime")

API_FOLDER: Final = "resources-api"
STREAM_SILENCE: Final = 60.0
MAX_WAIT: Final = 30.0
"""Seconds one server wait (``…/wait?timeout=``) may last; longer waits loop (the server allows up to 60)."""


class _Ends(Protocol):
    @property
    def terminal(self) -> bool: ...


_Waited = TypeVar("_Waited", bound=_Ends)
"""Seconds without a byte (not even a heartbeat) after which an event stream counts as lost."""
_NEVER_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where loop-server listens and the bearer token to send. ``admin``: the token is the data directory's admin
    token (requests then name the operator in ``X-Loopd-Actor``); ``api_url``/``ca_file`` locate the embedded
    Kubernetes API of that data directory, when known."""

    url: str
    token: str
    admin: bool = False
    api_url: str | None = None
    ca_file: Path | None = None

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        """A parsed kubeconfig for the embedded Kubernetes API (TLS with the data directory's CA, this token)."""
        if self.api_url is None or self.ca_file is None:
            raise InvalidRequest("no embedded Kubernetes API is known for this server: pass kubeconfig= or resources=")
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "loopd", "cluster": {"server": self.api_url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": "loopd", "user": {"token": self.token}}],
            "contexts": [{"name": "loopd", "context": {"cluster": "loopd", "user": "loopd", "namespace": namespace}}],
            "current-context": "loopd",
        }


def find_endpoint(server_url: str | None, *, token: str | None, data_dir: str | Path | None) -> Endpoint:
    """The server and credential: ``server_url`` + ``token``, or what `loopd up` recorded in ``data_dir``
    (``server.json``: its URL, and its admin token file). ``InvalidRequest`` when neither gives both."""
    url = (server_url or "").rstrip("/") or None
    api_url: str | None = None
    ca_file: Path | None = None
    admin = False
    if data_dir is not None:
        directory = Path(data_dir).expanduser()
        info = read_server_file(directory) or {}
        url = url or (str(info.get("url") or "").rstrip("/") or None)
        api_url = str(info.get("api_url") or "") or _read_text(directory / API_FOLDER / "endpoint")
        ca = directory / API_FOLDER / "ca.crt"
        ca_file = ca if ca.is_file() else None
        if token is None:
            token_file = Path(str(info.get("token_file") or directory / API_FOLDER / "token"))
            token = _read_text(token_file)
            admin = token is not None
    if url is None:
        raise InvalidRequest(
            "no server URL: pass server_url, or data_dir of a running `loopd up` (it writes server.json there)"
        )
    if not token:
        raise InvalidRequest(
            f"no token for {url}: pass token= (`loopd token create operator:<key>`) or data_dir= of its `loopd up`"
        )
    return Endpoint(url=url, token=token, admin=admin, api_url=api_url, ca_file=ca_file)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class ServerClient:
    """Requests to loop-server as one actor (see the module docstring for retries)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        clock: Clock,
        request_timeout: float = 30.0,
        retries: int = 3,
        backoff: Backoff | None = None,
        actor: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if request_timeout <= 0:
            raise ValueError("request_timeout must be positive")
        if retries < 0:
            raise ValueError("retries must not be negative")
        self.endpoint = endpoint
        self.actor = actor
        self.request_timeout = request_timeout
        self._clock = clock
        self._retries = retries
        self._backoff = backoff or Backoff(base=0.2, factor=2.0, max_delay=2.0)
        self._http = httpx.AsyncClient(
            base_url=endpoint.url,
            headers={"Authorization": f"Bearer {endpoint.token}", "Accept": "application/json"},
            timeout=httpx.Timeout(request_timeout),
            transport=transport,
            event_hooks=httpx_trace_hooks(),  # an operator's spans continue in the server
        )

    async def aclose(self) -> None:
        """Close the connections (``open_runtime`` does it on exit)."""
        await self._http.aclose()

    def headers(self, *, as_user: bool = False) -> dict[str, str]:
        """``X-Loopd-Actor`` when this runtime acts as an operator through the admin token (not for ``as_user``)."""
        if self.actor and self.endpoint.admin and not as_user:
            return {"X-Loopd-Actor": self.actor}
        return {}

    async def wait_until_ended(
        self,
        path: str,
        state: _Waited,
        parse: Callable[[Any], _Waited],
        *,
        clock: Clock,
        timeout: float | None,
        what: str,
    ) -> _Waited:
        """Loop over a bounded server wait (``GET <path>?timeout=``, at most `MAX_WAIT` s each) until the state it
        returns has ended; ``TimeoutError`` once ``timeout`` seconds pass on ``clock``. Cancelling this ends only the
        waiting, never the thing waited on."""
        deadline = None if timeout is None else clock.monotonic() + timeout
        while not state.terminal:
            bound = MAX_WAIT
            if deadline is not None:
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{what} has not ended after {timeout}s")
                bound = min(bound, max(remaining, 0.1))
            body = await self.request(
                "GET", path, params={"timeout": round(bound, 3)}, timeout=bound + self.request_timeout, what=what
            )
            state = parse(body)
        return state

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
        as_user: bool = False,
        timeout: float | None = None,
        what: str = "",
    ) -> Any:
        """Send one request; its decoded JSON body, or the typed error of its answer (``Unavailable`` when none
        came). ``idempotent`` defaults to true for GET and PUT; ``timeout`` overrides the default per call."""
        repeatable = idempotent if idempotent is not None else method in ("GET", "HEAD", "PUT", "DELETE")
        query = {k: v for k, v in (params or {}).items() if v is not None}
        attempts = self._backoff.attempts()
        while True:
            try:
                response = await self._http.request(
                    method,
                    path,
                    json=dict(json) if json is not None else None,
                    params=query or None,
                    headers=self.headers(as_user=as_user),
                    timeout=httpx.Timeout(timeout if timeout is not None else self.request_timeout),
                )
            except httpx.TransportError as exc:
                may_repeat = repeatable or isinstance(exc, _NEVER_SENT)
                if not may_repeat or attempts.failures >= self._retries:
                    where = what or f"{method} {path}"
                    raise Unavailable(
                        f"{where}: no answer from {self.endpoint.url} ({type(exc).__name__}: {exc})"
                    ) from exc
                delay = attempts.failed()
                logger.info("%s %s: %s; retry %d in %.2fs", method, path, type(exc).__name__, attempts.failures, delay)
                await self._clock.sleep(delay)
                continue
            if response.status_code >= 400:
                raise error_from_response(response, what=what)
            if not response.content:
                return None
            try:
                return response.json()
            except ValueError as exc:
                raise Unavailable(f"{what or path}: the answer is not JSON") from exc

    @asynccontextmanager
    async def stream(
        self, path: str, *, headers: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None
    ) -> AsyncIterator[httpx.Response]:
        """A streaming GET (SSE): the response once its status is known; typed errors for a 4xx/5xx. Connecting
        is bounded by the request timeout, and so is each read, by ``STREAM_SILENCE`` at least: the server sends a
        heartbeat every 15 s, so a longer silence is a dead connection (``Unavailable``; the caller resumes)."""
        all_headers = {**self.headers(), "Accept": "text/event-stream", **(headers or {})}
        timeout = httpx.Timeout(self.request_timeout, read=max(STREAM_SILENCE, self.request_timeout))
        try:
            async with self._http.stream("GET", path, headers=all_headers, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_from_response(response, what=f"GET {path}")
                yield response
        except httpx.TransportError as exc:
            raise Unavailable(f"GET {path}: the stream was lost ({type(exc).__name__}: {exc})") from exc
