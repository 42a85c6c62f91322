"""What a Task per question costs the Kubernetes API: create → watch event → delete, on a real kube-apiserver + etcd
and on loopd's embedded Kubernetes-compatible API, side by side in one run.

Each Task goes through what the chat path does with it: ``POST`` the Task (the chat request), a watcher sees it
``ADDED`` (the responder's informer), ``DELETE`` it (the Task is done and collected), the watcher sees it
``DELETED``. ``--concurrency`` Tasks are in flight at once. Reported per API: Tasks/s over the whole series, and
p50/p95 of the create request, create → ``ADDED`` at the watcher, the delete request and delete → ``DELETED``.

Both APIs are reached the same way, through loopd's `kubernetes_asyncio` client (``open_http_client``) over TLS on
127.0.0.1 with a bearer token: the real one is etcd + kube-apiserver built by ``scripts/k8s_tools.py`` (started
here on free ports, stopped by pid at the end; run ``python scripts/k8s_tools.py ensure`` first), the embedded one
is a ``loopd up`` process (SQLite, ``synchronous=NORMAL``; etcd fsyncs every write). The figures feed
docs/SCALING.md.

python -m benchmarks.k8s_tasks [--tasks 500] [--concurrency 1,10,50] [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from benchmarks._server import percentile, running_server
from loopd.resources.client import TASKS, ResourceClient, open_http_client

ROOT: Final = Path(__file__).resolve().parent.parent
LOOPD: Final = str(Path(sys.executable).parent / "loopd")
WATCH_TIMEOUT: Final = 30.0
"""Seconds a Task may take to show up (or disappear) at the watcher before the run fails."""


@dataclass
class Series:
    """One series on one API: per-Task latencies (ms) and the wall time of the whole series (s)."""

    create_ms: list[float] = field(default_factory=list)
    added_ms: list[float] = field(default_factory=list)
    delete_ms: list[float] = field(default_factory=list)
    deleted_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.create_ms) / self.seconds if self.seconds else 0.0


class Watcher:
    """One watch on the namespace's Tasks; resolves a future per (name, event type) as events arrive."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], asyncio.Future[float]] = {}

    def expect(self, name: str, kind: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting[(name, kind)] = future
        return future

    async def run(self, client: ResourceClient, namespace: str, resource_version: str, ready: asyncio.Event) -> None:
        async with client.open_watch(
            TASKS, namespace=namespace, resource_version=resource_version, timeout_seconds=3600
        ) as events:
            ready.set()
            async for event in events:
                name = str((event.object.get("metadata") or {}).get("name") or "")
                future = self._waiting.pop((name, event.type), None)
                if future is not None and not future.done():
                    future.set_result(time.perf_counter())


def _task(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "loopd.dev/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {"target": {"kind": "operator", "key": "bench"}, "revision": 1},
    }


async def run_series(kubeconfig: dict[str, Any], namespace: str, *, tasks: int, concurrency: int, tag: str) -> Series:
    """``tasks`` Tasks through create → ADDED → delete → DELETED, ``concurrency`` at once."""
    series = Series()
    async with open_http_client(kubeconfig) as client:
        listed = await client.list(TASKS, namespace=namespace)
        watcher = Watcher()
        ready = asyncio.Event()
        gate = asyncio.Semaphore(concurrency)

        async def one(index: int) -> None:
            name = f"{tag}-{index}"
            async with gate:
                added = watcher.expect(name, "ADDED")
                t0 = time.perf_counter()
                await client.create(TASKS, _task(name), namespace=namespace)
                t1 = time.perf_counter()
                seen = await asyncio.wait_for(added, WATCH_TIMEOUT)
                deleted = watcher.expect(name, "DELETED")
                t2 = time.perf_counter()
                await client.delete(TASKS, name, namespace=namespace)
                t3 = time.perf_counter()
                gone = await asyncio.wait_for(deleted, WATCH_TIMEOUT)
            series.create_ms.append((t1 - t0) * 1000)
            series.added_ms.append((seen - t0) * 1000)
            series.delete_ms.append((t3 - t2) * 1000)
            series.deleted_ms.append((gone - t2) * 1000)

        async with asyncio.TaskGroup() as group:
            watching = group.create_task(watcher.run(client, namespace, listed.resource_version, ready))
            await asyncio.wait_for(ready.wait(), WATCH_TIMEOUT)
            started = time.perf_counter()
            async with asyncio.TaskGroup() as work:
                for index in range(tasks):
                    work.create_task(one(index))
            series.seconds = time.perf_counter() - started
            watching.cancel()
    return series


@contextlib.contextmanager
def real_api(directory: Path) -> Iterator[dict[str, Any]]:
    """etcd + kube-apiserver (scripts/k8s_tools.py builds), the Task CRD applied; an admin kubeconfig."""
    sys.path.insert(0, str(ROOT))
    from tests.k8s.cluster import cached_tool, running_cluster  # the test suite's starter: one way to run them

    absent = [name for name in ("etcd", "kube-apiserver") if cached_tool(name) is None]
    if absent:
        raise SystemExit(f"{', '.join(absent)} not built: run `python scripts/k8s_tools.py ensure` first")
    with running_cluster(directory) as cluster:
        cluster.apply(subprocess.run([LOOPD, "manifests", "crds"], capture_output=True, text=True, check=True).stdout)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/tasks.loopd.dev", timeout=90)
        yield cluster.kubeconfig_dict()


@contextlib.contextmanager
def embedded_api(directory: Path) -> Iterator[dict[str, Any]]:
    """A `loopd up` process (no operators); the admin kubeconfig of its embedded API."""
    with running_server(directory, extra_args=["--no-router", "--no-longhorizon"]) as server:
        printed = subprocess.run(
            [LOOPD, "kubeconfig", "--data-dir", str(server.data_dir)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        yield yaml.safe_load(printed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=positive_int, default=500, help="Tasks per series")
    parser.add_argument("--concurrency", default="1,10,50", help="Tasks in flight at once (comma-separated)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="series per setting; the median series is shown")
    parser.add_argument("--quick", action="store_true", help="100 Tasks, concurrency 1 and 10, one series")
    args = parser.parse_args(argv)
    tasks = 100 if args.quick else max(1, args.tasks)
    levels = [1, 10] if args.quick else [int(x) for x in args.concurrency.split(",") if x.strip()]
    repeat = 1 if args.quick else max(1, args.repeat)

    rows: list[tuple[object, ...]] = []
    with tempfile.TemporaryDirectory(prefix="loopd-bench-k8s-") as directory:
        root = Path(directory)
        (root / "real").mkdir()
        (root / "embedded").mkdir()
        with real_api(root / "real") as real, embedded_api(root / "embedded") as embedded:
            apis = [("kube-apiserver + etcd", real), ("loopd embedded API", embedded)]
            for level in levels:
                rates: dict[str, float] = {}
                for label, kubeconfig in apis:
                    runs = [
                        asyncio.run(
                            run_series(kubeconfig, "default", tasks=tasks, concurrency=level, tag=f"c{level}r{n}")
                        )
                        for n in range(repeat)
                    ]
                    runs.sort(key=lambda s: s.rate)
                    chosen = runs[len(runs) // 2]
                    rates[label] = chosen.rate
                    rows.append(
                        (
                            label,
                            level,
                            round(chosen.rate, 1),
                            percentile(chosen.create_ms, 50),
                            percentile(chosen.create_ms, 95),
                            percentile(chosen.added_ms, 50),
                            percentile(chosen.added_ms, 95),
                            percentile(chosen.delete_ms, 50),
                            percentile(chosen.deleted_ms, 95),
                        )
                    )
                    print(
                        f"  {label}, {level} at once: {chosen.rate:.1f} Tasks/s, create → ADDED p50 "
                        f"{percentile(chosen.added_ms, 50):.1f} ms (median of {repeat} series: "
                        f"{', '.join(f'{s.rate:.1f}' for s in runs)} Tasks/s)",
                        flush=True,
                    )
                ratio = rates["loopd embedded API"] / max(rates["kube-apiserver + etcd"], 1e-9)
                print(f"  {level} at once: embedded / real = {ratio:.2f}× the Tasks/s", flush=True)
    print_table(
        f"A Task per question on the Kubernetes API: create → ADDED → delete → DELETED, {tasks} Tasks per series",
        [
            "API",
            "at once",
            "Tasks/s",
            "create p50 ms",
            "create p95 ms",
            "create → ADDED p50 ms",
            "create → ADDED p95 ms",
            "delete p50 ms",
            "delete → DELETED p95 ms",
        ],
        rows,
        note="Both through loopd's kubernetes_asyncio client over TLS on 127.0.0.1 with a bearer token. "
        "kube-apiserver + etcd: built from their Go modules by scripts/k8s_tools.py, etcd fsyncs each write; "
        "loopd embedded API: `loopd up` (SQLite WAL, synchronous=NORMAL). Median series of --repeat by Tasks/s.",
    )


if __name__ == "__main__":
    run_main(main)
