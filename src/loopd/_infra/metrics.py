"""Prometheus metrics: one registry per server instance with loopd's instruments, and its text exposition.

`Metrics` owns a fresh ``prometheus_client.CollectorRegistry`` (never the library's global default registry, so two
servers in one process — tests do that — keep separate counts) and the instruments loopd records into at its edges:
HTTP requests, chat requests in flight, time to first token and completion of harness calls, tokens and USD by
model, reconcile latency. Gauges of live state (engine capacity, SSE subscribers, reconcile
queue depth) are read at scrape time from the owners' ``statistics()`` through `Metrics.add_collector`: nothing is
recorded on the hot path for them. `MetricsMiddleware` counts HTTP requests by route template.

Names: ``loopd_*``, seconds and USD in the name, counters end in ``_total`` in the exposition. The instruments are
plain attributes; a component that records takes a ``Metrics | None`` and records nothing without one.

Must not do: register into the global default registry; keep per-request label values (only route templates,
model names, targets and controller names label a series).
"""

from __future__ import annotations

import gc
import hmac
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loopd._infra.errors import LoopdError
from loopd._infra.http import is_loopback, peer_is_loopback, request_headers
from loopd._infra.serving import open_http_server

__all__ = [
    "CONTENT_TYPE",
    "GaugeSample",
    "Metrics",
    "MetricsExposureError",
    "MetricsMiddleware",
    "ReconcileLoad",
    "open_metrics_server",
]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_ANSWER_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

GaugeSample = tuple[str, str, Mapping[str, str], float]
"""One gauge value read at scrape time: (metric name, help, labels, value). Samples of one name share labels."""

ReconcileLoad = tuple[str, float, float]
"""One reconcile controller's load read at scrape time: (controller name, keys waiting, reconciles running)."""


class _Callback(Collector):
    def __init__(self, read: Callable[[], Iterable[GaugeSample]]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for name, documentation, labels, value in self._read():
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, documentation, labels=list(labels))
            family.add_metric(list(labels.values()), value)
        return list(families.values())


def _heap_gauges() -> list[GaugeSample]:
    help_text = "Objects the cyclic collector no longer walks (frozen once the process started)."
    return [("loopd_gc_frozen_objects", help_text, {}, float(gc.get_freeze_count()))]


class Metrics:
    """loopd's instruments on a registry of their own (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(
            "loopd_http_requests", "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"], registry=r,
        )  # fmt: skip
        self.http_request_seconds = Histogram(
            "loopd_http_request_seconds", "Time to the end of an HTTP response (streams: their whole length).",
            ["method", "route"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.chat_requests = Counter(
            "loopd_chat_requests", "Questions asked (a chat request and its Task), by target kind.",
            ["target_kind"], registry=r,
        )  # fmt: skip
        self.chats_in_flight = Gauge(
            "loopd_chats_in_flight",
            "Questions asked through this replica minus Tasks completed through it (sum over replicas).",
            registry=r,
        )
        self.chat_seconds = Histogram(
            "loopd_chat_seconds", "From a question to its Task's completion (through this replica), by outcome.",
            ["outcome"], buckets=_ANSWER_BUCKETS, registry=r,
        )  # fmt: skip
        self.time_to_first_token_seconds = Histogram(
            "loopd_time_to_first_token_seconds", "From the start of a harness call's drive to its first answer text.",
            ["target"], buckets=_ANSWER_BUCKETS, registry=r,
        )  # fmt: skip
        self.completion_seconds = Histogram(
            "loopd_completion_seconds", "From the start of a harness call's drive to its end, by outcome.",
            ["target", "outcome"], buckets=_ANSWER_BUCKETS, registry=r,
        )  # fmt: skip
        self.model_tokens = Counter(
            "loopd_model_tokens", "Model tokens used by harness calls, by model and type (input | output).",
            ["model", "type"], registry=r,
        )  # fmt: skip
        self.model_cost_usd = Counter(
            "loopd_model_cost_usd", "Model cost of harness calls in USD, by model.", ["model"], registry=r
        )
        self.journal_commit_seconds = Histogram(
            "loopd_journal_commit_seconds", "Time one harness journal append took to commit (built-in harnesses).",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.reconcile_seconds = Histogram(
            "loopd_reconcile_seconds", "Time one reconcile took, by component (server or operator) and controller.",
            ["component", "controller"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._reconcile_sources: dict[str, Callable[[], Iterable[ReconcileLoad]]] = {}
        self.add_collector(self._reconcile_gauges)
        # The cyclic collector: collections and objects collected per generation (the library's own collector),
        # and what `loopd._infra.heap.settle_startup_heap` froze.
        GCCollector(registry=r)
        self.add_collector(_heap_gauges)

    def reconcile_observer(self, component: str) -> Callable[[str, float], None]:
        """A reconcile manager's ``on_reconciled`` for ``component`` (``server``, an operator's key)."""

        def observe(controller: str, seconds: float) -> None:
            self.reconcile_seconds.labels(component, controller).observe(seconds)

        return observe

    def add_reconcile_source(self, component: str, read: Callable[[], Iterable[ReconcileLoad]]) -> None:
        """Report ``component``'s reconcile queues at every scrape (one source per component; a new one replaces
        the old)."""
        self._reconcile_sources[component] = read

    def _reconcile_gauges(self) -> list[GaugeSample]:
        samples: list[GaugeSample] = []
        for component, read in list(self._reconcile_sources.items()):
            for controller, waiting, running in read():
                labels = {"component": component, "controller": controller}
                samples.append(
                    ("loopd_reconcile_queue_depth", "Keys waiting in a controller's queue.", labels, waiting)
                )
                samples.append(("loopd_reconcile_in_flight", "Reconciles running now.", labels, running))
        return samples

    def add_collector(self, read: Callable[[], Iterable[GaugeSample]]) -> None:
        """Read gauges from live state at every scrape (``read`` must be cheap and must not block)."""
        self.registry.register(_Callback(read))

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


# -- HTTP servers ---------------------------------------------------------------------------------------------


class MetricsMiddleware:
    """ASGI middleware counting HTTP requests into ``metrics`` by method, route template (``unmatched`` when no
    route matched) and status, and timing them to the end of the response."""

    def __init__(self, app: Any, *, metrics: Metrics) -> None:
        self.app = app
        self._metrics = metrics

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Mapping[str, Any]) -> None:
            nonlocal status
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 500))
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None)
            label = route if isinstance(route, str) else "unmatched"
            method = str(scope.get("method", "GET"))
            self._metrics.http_requests.labels(method, label, str(status)).inc()
            self._metrics.http_request_seconds.labels(method, label).observe(time.perf_counter() - started)


# -- a process without an HTTP API of its own (an operator) --------------------------------------------------------


class MetricsExposureError(LoopdError):
    """A metrics endpoint would be reachable beyond this machine without a token."""


@asynccontextmanager
async def open_metrics_server(
    metrics: Metrics, *, host: str = "127.0.0.1", port: int, token: str | None = None
) -> AsyncIterator[str]:
    """Serve ``GET /metrics`` of ``metrics`` on ``host:port`` for the block; yields its base URL.

    With ``token`` every scrape must send ``Authorization: Bearer <token>`` (else 401); without one only loopback
    peers are answered (else 403), and a non-loopback ``host`` is refused (`MetricsExposureError`).
    """
    if token is None and not is_loopback(host):
        raise MetricsExposureError(
            f"metrics on {host} would be open to the network: set a token (LOOPD_METRICS_TOKEN) or bind 127.0.0.1"
        )
    expected = token.encode() if token is not None else None

    async def scrape(request: Request) -> Response:
        if expected is not None:
            scheme, _, given = request_headers(request.scope).get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
                error = {"error": {"type": "unauthorized", "message": "metrics need the metrics token"}}
                return JSONResponse(error, status_code=401, headers={"WWW-Authenticate": 'Bearer realm="loopd"'})
        elif not peer_is_loopback(request.scope):
            error = {"error": {"type": "forbidden", "message": "metrics without a token are served to loopback only"}}
            return JSONResponse(error, status_code=403)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    app = Starlette(routes=[Route("/metrics", scrape, methods=["GET"])])
    async with open_http_server(app, host=host, port=port, lifespan="off", log_level=None) as running:
        yield running.url
