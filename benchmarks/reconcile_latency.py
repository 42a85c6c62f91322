"""Reconcile start latency: a Task is created → ``reconcile`` is called for it.

Measured from just before ``client.create`` to the first ``reconcile`` call for that Task, through the whole
path (write → watch event → informer → work queue → worker), over each client:

- ``memory``: the in-memory twin (the runtime's own overhead);
- ``store``: the in-process client over the embedded SQLite store (the all-in-one mode);
- ``http``: ``kubernetes_asyncio`` over TLS on 127.0.0.1 to the embedded API (how an operator Deployment sees a
  cluster).

``sequential`` creates one Task at a time and waits for its reconcile; ``burst`` creates many at once (queueing
and worker concurrency show up in p99).

python -m benchmarks.reconcile_latency [--count N] [--burst N] [--workers N] [--clients memory,store,http]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import yaml

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from loopd.resources import load_or_create_credentials, open_api_server, open_sqlite_store, render_kubeconfig
from loopd.resources.client import TASKS, InMemoryClient, ResourceClient, StoreClient, open_http_client
from loopd.resources.reconcile import Manager, Request, Result


@asynccontextmanager
async def open_client(kind: str, directory: Path) -> AsyncIterator[ResourceClient]:
    if kind == "memory":
        twin = InMemoryClient(history_limit=100_000)
        yield twin
        await twin.aclose()
    elif kind == "store":
        async with open_sqlite_store(directory / "store.db") as store:
            yield StoreClient(store)
    elif kind == "http":
        credentials = load_or_create_credentials(directory / "data")
        async with (
            open_sqlite_store(directory / "api.db") as store,
            open_api_server(store, credentials=credentials) as server,
        ):
            kubeconfig = yaml.safe_load(render_kubeconfig(server.url, credentials.ca_pem, credentials.token))
            async with open_http_client(kubeconfig) as client:
                yield client
    else:
        raise SystemExit(f"unknown client {kind!r} (memory, store, http)")


def task(name: str) -> dict[str, object]:
    return {
        "apiVersion": TASKS.api_version,
        "kind": TASKS.kind,
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"target": {"kind": "operator", "key": "bench"}, "revision": 1},
    }


class Stopwatch:
    """Remembers when each Task was submitted and when its first reconcile began."""

    def __init__(self) -> None:
        self.submitted: dict[str, float] = {}
        self.reconciled: dict[str, float] = {}
        self.arrived: dict[str, asyncio.Event] = {}

    def expect(self, name: str) -> asyncio.Event:
        self.arrived[name] = asyncio.Event()
        self.submitted[name] = time.perf_counter()
        return self.arrived[name]

    async def reconcile(self, request: Request) -> Result:
        now = time.perf_counter()
        if request.name not in self.reconciled:
            self.reconciled[request.name] = now
            arrived = self.arrived.get(request.name)
            if arrived is not None:
                arrived.set()
        return Result()

    def latencies_ms(self, names: list[str]) -> list[float]:
        return [(self.reconciled[name] - self.submitted[name]) * 1000 for name in names]


async def measure(kind: str, count: int, burst: int, workers: int) -> list[tuple[str, str, int, float, float, float]]:
    rows: list[tuple[str, str, int, float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="loopd-bench-") as directory:
        async with open_client(kind, Path(directory)) as client:
            watch = Stopwatch()
            manager = Manager(client, drain_timeout=5.0)
            manager.add_controller(TASKS, watch.reconcile, namespace="bench", workers=workers)
            runner = asyncio.ensure_future(manager.run())
            try:
                await wait_until(lambda: manager.leading)
                names = [f"seq-{index}" for index in range(count)]
                for name in names:
                    arrived = watch.expect(name)
                    await client.create(TASKS, task(name))
                    await asyncio.wait_for(arrived.wait(), 30)
                rows.append(row(kind, "sequential", watch.latencies_ms(names)))

                names = [f"burst-{index}" for index in range(burst)]
                arrivals = [watch.expect(name) for name in names]
                await asyncio.gather(*(client.create(TASKS, task(name)) for name in names))
                await asyncio.wait_for(asyncio.gather(*(event.wait() for event in arrivals)), 60)
                rows.append(row(kind, f"burst of {burst}", watch.latencies_ms(names)))
            finally:
                manager.shutdown()
                await asyncio.wait_for(runner, 30)
    return rows


def row(kind: str, mode: str, latencies: list[float]) -> tuple[str, str, int, float, float, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return (kind, mode, len(ordered), statistics.median(ordered), p99, ordered[-1])


async def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=positive_int, default=200, help="Tasks created one at a time")
    parser.add_argument("--burst", type=positive_int, default=200, help="Tasks created at once")
    parser.add_argument("--workers", type=positive_int, default=4, help="concurrent reconciles")
    parser.add_argument("--clients", default="memory,store,http")
    args = parser.parse_args()

    async def run_all() -> list[tuple[str, str, int, float, float, float]]:
        rows: list[tuple[str, str, int, float, float, float]] = []
        for kind in (k.strip() for k in args.clients.split(",") if k.strip()):
            rows.extend(await measure(kind, args.count, args.burst, args.workers))
        return rows

    rows = asyncio.run(run_all())
    print_table(
        f"Reconcile start latency (create → reconcile called), {args.workers} workers",
        ["client", "mode", "n", "p50 ms", "p99 ms", "max ms"],
        rows,
    )


if __name__ == "__main__":
    run_main(main)
