"""Live streams: N concurrent SSE subscribers on one conversation of a `loopd up` server, events at a fixed rate.

The server runs in its own process (`loopd up --port 0`). One message of the conversation streams: the benchmark
registers operator ``bench``, asks it a question (a Task for ``operator:bench``) and publishes ``append`` events
into the response through the Task API (``POST /v1/tasks/{id}/events`` as ``operator:bench``) at ``--rate`` per
second for ``--seconds``. Each event's text carries its index and its publish time (CLOCK_MONOTONIC, taken just
before the POST). The subscribers (``GET /v1/conversations/{id}/stream``) are spread over ``--workers`` worker
processes with raw asyncio connections; each notes when every event arrived. Reported: publish → receipt delay
percentiles over every (subscriber, event) pair, how many subscribers received every event, the emit POST's own
latency, and the server's CPU use while publishing.

python -m benchmarks.server_streams [--subscribers 100,1000] [--rate 20] [--seconds 10] [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.context
import re
import statistics
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from benchmarks._children import run_main
from benchmarks._common import positive_float, positive_int, positive_ints, print_table, verdict
from benchmarks._goals import GOALS, Goal, print_goals
from benchmarks._server import (
    Api,
    ServerProcess,
    cpu_seconds,
    now,
    percentile,
    raise_open_files,
    running_server,
    sampling,
)
from benchmarks._stream_peer_langgraph import LANGGRAPH_ENV, langgraph_command

TICK = re.compile(rb"bench:(\d+):(\d+\.\d+);")
DONE_MARK: Final = b"bench-done"
CONNECT_AT_ONCE: Final = 32
READY_TIMEOUT: Final = 180.0
DRAIN_GRACE: Final = 60.0


# --- the subscriber side (worker processes) ----------------------------------------------------------------
#
# Each worker holds its share of the connections on uvloop (when installed) with one bare `asyncio.Protocol` per
# connection: no reader task and no stream object per connection, the bytes scanned for ticks as they arrive. A
# client that costs little per event keeps the figures the server's (the workers' CPU is reported beside).


class _Subscriber(asyncio.Protocol):
    """One SSE connection: sends the GET, checks the response head, then notes when each tick arrived."""

    def __init__(self, request: bytes, events: int, delays: array[float], connected: asyncio.Future[str]) -> None:
        self._request = request
        self.seen = bytearray(events)
        self.received = 0
        self.failed = ""
        self._delays = delays
        self._connected = connected
        self.finished: asyncio.Future[None] = connected.get_loop().create_future()
        self._head = True
        self._rest = b""
        self._transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # uvloop's transport is not an asyncio.Transport subclass
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        arrived = now()
        data = self._rest + data if self._rest else data
        if self._head:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._rest = data
                return
            status_line = data[: data.find(b"\r\n")]
            if b" 200 " not in status_line + b" " or b"text/event-stream" not in data[:end]:
                self._fail(f"refused: {data[:300]!r}")
                return
            self._head = False
            if not self._connected.done():
                self._connected.set_result("")
            data = data[end + 4 :]
        # Scan whole SSE messages only (a tick never spans a chunk boundary: every chunk holds whole frames).
        cut = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4)  # LF or CRLF line ends (peers)
        if cut < 4:
            self._rest = data
            return
        body, self._rest = data[:cut], data[cut:]
        seen = self.seen
        for match in TICK.finditer(body):
            index = int(match.group(1))
            if index < len(seen) and not seen[index]:
                seen[index] = 1
                self.received += 1
                self._delays.append(arrived - float(match.group(2)))
        if DONE_MARK in body:
            self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self._fail(f"connection lost: {exc}")

    def _fail(self, why: str) -> None:
        self.failed = why
        if not self._connected.done():
            self._connected.set_result(why)
        self._finish()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
        if self._transport is not None:
            self._transport.close()


async def _subscribe(pipe: Connection, target: dict[str, Any]) -> dict[str, Any]:
    count, events = int(target["count"]), int(target["events"])
    host, port = str(target["host"]), int(target["port"])
    auth = f"Authorization: Bearer {target['token']}\r\n" if target.get("token") else ""
    request = (
        f"GET {target['path']} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}Accept: text/event-stream\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)
    delays: array[float] = array("d")
    t0 = now()

    async def connect() -> _Subscriber | str:
        async with gate:
            connected: asyncio.Future[str] = loop.create_future()
            subscriber = _Subscriber(request, events, delays, connected)
            try:
                async with asyncio.timeout(60):
                    await loop.create_connection(lambda: subscriber, host, port)
                    refused = await connected
            except (OSError, TimeoutError) as exc:
                return f"{type(exc).__name__}: {exc}"
            return refused or subscriber

    opened = await asyncio.gather(*(connect() for _ in range(count)))
    subs = [s for s in opened if isinstance(s, _Subscriber)]
    refused = [s for s in opened if isinstance(s, str)]
    pipe.send({"ready": len(subs), "refused": refused[:3], "connect_s": now() - t0})
    waits = [s.finished for s in subs]
    _, pending = await asyncio.wait(waits, timeout=float(target["deadline_s"])) if waits else (set(), set())
    return {
        "delays": delays.tobytes(),
        "received": [s.received for s in subs],
        "failed": [s.failed for s in subs if s.failed][:3],
        "timed_out": len(pending),
        "refused": len(refused),
    }


def _subscriber_process(pipe: Connection, target: dict[str, Any]) -> None:
    raise_open_files(int(target["count"]) + 256)
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # a cheaper client loop: the figures stay the server's

        runner = uvloop.run
    try:
        result = runner(_subscribe(pipe, target))
    except BaseException as exc:
        pipe.send({"error": f"{type(exc).__name__}: {exc}"})
        raise
    pipe.send(result)
    pipe.close()


# --- the publisher side (this process) ---------------------------------------------------------------------


@dataclass(frozen=True)
class StreamRun:
    subscribers: int
    events: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    complete: int
    delivered: float
    emit_p50_ms: float
    emit_p95_ms: float
    server_cpu: float
    clients_cpu: float
    connect_s: float
    idle_kib_per_stream: float
    """Server RSS growth from before the subscribers connected to when all were connected and idle, per stream."""


def _tick(index: int) -> dict[str, Any]:
    text = f"bench:{index}:{now():.6f};"
    return {"op": "append", "mask": "block.content", "block": {"id": "tick", "type": "text", "content": text}}


Workers = tuple[list[multiprocessing.process.BaseProcess], list[Connection]]


@contextlib.contextmanager
def _workers() -> Iterator[Workers]:
    """The subscriber processes a measurement starts (`_start_worker`) and their pipes: each joined when it ends
    (at most 10 s, then terminated); all terminated at once when it fails or is interrupted."""
    processes: list[multiprocessing.process.BaseProcess] = []
    pipes: list[Connection] = []
    try:
        yield processes, pipes
    except BaseException:
        for worker in processes:
            worker.terminate()  # each started by this measurement; ended by its own handle
        raise
    finally:
        for worker in processes:
            worker.join(10)
            if worker.is_alive():
                worker.terminate()
                worker.join(5)
        for pipe in pipes:
            pipe.close()


def _start_worker(
    context: multiprocessing.context.SpawnContext,
    target: dict[str, Any],
    processes: list[multiprocessing.process.BaseProcess],
    pipes: list[Connection],
) -> None:
    """One subscriber process for ``target`` (see `_subscriber_process`), added with its pipe to `_workers`'s."""
    parent, child = context.Pipe()
    process = context.Process(target=_subscriber_process, args=(child, target), daemon=True)
    process.start()
    child.close()
    pipes.append(parent)
    processes.append(process)


def _receive(pipe: Connection, timeout: float) -> dict[str, Any]:
    if not pipe.poll(timeout):
        raise TimeoutError(f"a subscriber worker said nothing within {timeout:g} s")
    message: dict[str, Any] = pipe.recv()
    if "error" in message:
        raise RuntimeError(f"a subscriber worker failed: {message['error']}")
    return message


async def _publish(api: Api, task_id: str, events: int, rate: float) -> list[float]:
    """Emit ``events`` ticks at ``rate`` per second on a fixed schedule; each POST's latency in seconds."""
    latencies: list[float] = []

    async def emit(index: int) -> None:
        event = _tick(index)
        started = now()
        await api.emit(task_id, [event])
        latencies.append(now() - started)

    start = now() + 0.05
    pending: list[asyncio.Task[None]] = []
    for index in range(events):
        await asyncio.sleep(max(0.0, start + index / rate - now()))
        pending.append(asyncio.create_task(emit(index)))
    await asyncio.gather(*pending)
    done = {"op": "append", "mask": "block.content", "block": {"id": "tick", "type": "text", "content": "bench-done"}}
    await api.emit(task_id, [done])
    return latencies


async def _prepare(api: Api, run: int) -> tuple[str, str]:
    conversation = await api.create_conversation(f"streams-{run}")
    await api.register_operator()
    asked = await api.ask(conversation, "operator", "bench", "stream ticks")
    return conversation, str(asked["task_id"])


def measure(
    server: ServerProcess,
    run: int,
    subscribers: int,
    rate: float,
    seconds: float,
    workers: int,
    profile: Path | None = None,
) -> StreamRun:
    events = max(1, round(rate * seconds))

    async def prepare() -> tuple[str, str]:
        async with Api(server) as api:
            return await _prepare(api, run)

    conversation, task_id = asyncio.run(prepare())
    context = multiprocessing.get_context("spawn")
    workers = max(1, min(workers, subscribers))
    rss_before = server.rss_kb()
    shares = [subscribers // workers + (1 if i < subscribers % workers else 0) for i in range(workers)]
    with _workers() as (processes, pipes):
        for share in shares:
            target = {
                "host": server.host,
                "port": server.port,
                "token": server.token,
                "path": f"/v1/conversations/{conversation}/stream",
                "count": share,
                "events": events,
                "deadline_s": seconds + DRAIN_GRACE,
            }
            _start_worker(context, target, processes, pipes)
        ready = [_receive(pipe, READY_TIMEOUT) for pipe in pipes]
        connected = sum(int(r["ready"]) for r in ready)
        idle_kib = (server.rss_kb() - rss_before) / max(1, connected)
        if connected < subscribers:
            refused = [msg for r in ready for msg in r["refused"]]
            print(f"  only {connected} of {subscribers} subscribers connected; e.g. {refused[:2]}", flush=True)

        async def publish() -> list[float]:
            async with Api(server) as api:
                return await _publish(api, task_id, events, rate)

        pids = [p.pid for p in processes if p.pid is not None]
        with sampling(server.pid, profile, seconds):
            cpu0, clients0, wall0 = server.cpu_seconds(), sum(cpu_seconds(p) for p in pids), now()
            latencies = asyncio.run(publish())
            wall = max(1e-9, now() - wall0)
            cpu = (server.cpu_seconds() - cpu0) / wall
            clients_cpu = (sum(cpu_seconds(p) for p in pids) - clients0) / wall
        results = [_receive(pipe, seconds + DRAIN_GRACE + 30) for pipe in pipes]

    delays: array[float] = array("d")
    received: list[int] = []
    for result in results:
        delays.frombytes(result["delays"])
        received += result["received"]
        if result["failed"] or result["timed_out"]:
            print(f"  worker: {result['timed_out']} timed out, failures {result['failed']}", flush=True)
    received += [0] * (subscribers - len(received))  # refused connections received nothing
    ms = [d * 1000 for d in delays]
    return StreamRun(
        subscribers=subscribers,
        events=events,
        p50_ms=percentile(ms, 50),
        p95_ms=percentile(ms, 95),
        p99_ms=percentile(ms, 99),
        max_ms=max(ms, default=float("nan")),
        complete=sum(1 for r in received if r == events),
        delivered=sum(received) / (subscribers * events),
        emit_p50_ms=percentile(latencies, 50) * 1000,
        emit_p95_ms=percentile(latencies, 95) * 1000,
        server_cpu=cpu,
        clients_cpu=clients_cpu,
        connect_s=max(float(r["connect_s"]) for r in ready),
        idle_kib_per_stream=idle_kib,
    )


def _median_run(runs: Sequence[StreamRun]) -> StreamRun:
    def med(name: str) -> float:
        return statistics.median(float(getattr(r, name)) for r in runs)

    return StreamRun(
        subscribers=runs[0].subscribers,
        events=runs[0].events,
        p50_ms=med("p50_ms"),
        p95_ms=med("p95_ms"),
        p99_ms=med("p99_ms"),
        max_ms=med("max_ms"),
        complete=min(r.complete for r in runs),
        delivered=min(r.delivered for r in runs),
        emit_p50_ms=med("emit_p50_ms"),
        emit_p95_ms=med("emit_p95_ms"),
        server_cpu=med("server_cpu"),
        clients_cpu=med("clients_cpu"),
        connect_s=med("connect_s"),
        idle_kib_per_stream=runs[0].idle_kib_per_stream,  # later runs reuse the memory the first one freed
    )


# --- the peer: LangGraph's Agent Server, N clients joined to one run's stream -------------------------------

PEER_GRACE: Final = 240.0
"""How long after the last tick the peer's clients may still be receiving (LangGraph's p95 was ~63 s here)."""


def measure_langgraph(command: Path, subscribers: int, rate: float, seconds: float, workers: int) -> StreamRun:
    """The same delays for N clients joined to one run's stream on ``langgraph dev`` (`_stream_peer_langgraph`)."""
    from benchmarks._stream_peer_langgraph import running_langgraph, start_run

    events = max(1, round(rate * seconds))
    with (
        tempfile.TemporaryDirectory(prefix="loopd-bench-lg-") as directory,
        running_langgraph(Path(directory), command) as server,
    ):
        flag = Path(directory) / "clients-joined"
        path = start_run(server, events, rate, flag)
        context = multiprocessing.get_context("spawn")
        workers = max(1, min(workers, subscribers))
        shares = [subscribers // workers + (1 if i < subscribers % workers else 0) for i in range(workers)]
        with _workers() as (processes, pipes):
            for share in shares:
                target = {
                    "host": server.host,
                    "port": server.port,
                    "token": "",
                    "path": path,
                    "count": share,
                    "events": events,
                    "deadline_s": seconds + PEER_GRACE,
                }
                _start_worker(context, target, processes, pipes)
            ready = [_receive(pipe, READY_TIMEOUT) for pipe in pipes]
            pids = [p.pid for p in processes if p.pid is not None]
            cpu0, clients0, wall0 = cpu_seconds(server.pid), sum(cpu_seconds(p) for p in pids), now()
            flag.touch()  # every client joined: the run starts ticking
            results = [_receive(pipe, seconds + PEER_GRACE + 30) for pipe in pipes]
            wall = max(1e-9, now() - wall0)
            cpu = float("nan")
            with contextlib.suppress(OSError):  # the CLI's process (the server may run in a child of it)
                cpu = (cpu_seconds(server.pid) - cpu0) / wall
            clients_cpu = (sum(cpu_seconds(p) for p in pids) - clients0) / wall
    delays: array[float] = array("d")
    received: list[int] = []
    for result in results:
        delays.frombytes(result["delays"])
        received += result["received"]
    received += [0] * (subscribers - len(received))
    ms = [d * 1000 for d in delays]
    return StreamRun(
        subscribers=subscribers,
        events=events,
        p50_ms=percentile(ms, 50),
        p95_ms=percentile(ms, 95),
        p99_ms=percentile(ms, 99),
        max_ms=max(ms, default=float("nan")),
        complete=sum(1 for r in received if r == events),
        delivered=sum(received) / (subscribers * events),
        emit_p50_ms=float("nan"),
        emit_p95_ms=float("nan"),
        server_cpu=cpu,
        clients_cpu=clients_cpu,
        connect_s=max(float(r["connect_s"]) for r in ready),
        idle_kib_per_stream=float("nan"),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--subscribers", type=positive_ints, default="100,1000", help="comma-separated subscriber counts"
    )
    parser.add_argument("--rate", type=positive_float, default=20.0, help="events per second")
    parser.add_argument("--seconds", type=positive_float, default=10.0, help="how long to publish")
    parser.add_argument("--workers", type=positive_int, default=2, help="subscriber worker processes")
    parser.add_argument(
        "--no-peer", action="store_true", help="skip LangGraph's Agent Server (run at 1,000 subscribers when installed)"
    )
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run, 200 subscribers, 5 s")
    parser.add_argument(
        "--profile", type=Path, default=None, help="sample the server with py-spy in the largest count's first run"
    )
    args = parser.parse_args(argv)
    counts = [200] if args.quick else list(args.subscribers)
    seconds = 5.0 if args.quick else args.seconds
    repeat = 1 if args.quick else max(1, args.repeat)
    raise_open_files(max(counts) + 1024)

    rows: list[tuple[object, ...]] = []
    measured: dict[str, float | None] = {}
    run = 0
    for count in counts:
        # A fresh server per count: its idle memory per stream is measured from a clean start.
        with (
            tempfile.TemporaryDirectory(prefix="loopd-bench-streams-") as directory,
            running_server(Path(directory)) as server,
        ):
            runs: list[StreamRun] = []
            for index in range(repeat):
                run += 1
                t0 = time.perf_counter()
                spy = (
                    args.profile / f"streams-{count}.txt"
                    if args.profile and index == 0 and count == max(counts)
                    else None
                )
                runs.append(measure(server, run, count, args.rate, seconds, args.workers, spy))
                got = runs[-1]
                print(
                    f"  {count} subscribers: p50 {got.p50_ms:.1f} ms, p95 {got.p95_ms:.1f} ms, complete "
                    f"{got.complete}/{count} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
            m = _median_run(runs)
            p95_goal = _p95_goal(count)
            goal = "n/a" if p95_goal is None else verdict(p95_goal.met(m.p95_ms) and m.complete == count)
            if count in (1000, 5000):
                measured[f"p95_ms_{count}"] = m.p95_ms
                measured[f"missing_{count}"] = float(count - m.complete)
            rows.append(
                (
                    m.subscribers,
                    f"{m.events} @ {args.rate:g}/s",
                    m.p50_ms,
                    m.p95_ms,
                    m.p99_ms,
                    m.max_ms,
                    f"{m.complete}/{count}",
                    f"{m.delivered:.2%}",
                    m.emit_p50_ms,
                    m.emit_p95_ms,
                    f"{m.server_cpu:.0%}",
                    f"{m.clients_cpu:.0%}",
                    m.connect_s,
                    m.idle_kib_per_stream,
                    goal,
                )
            )
    print_table(
        f"Live streams: SSE subscribers on one conversation, publish → receipt (medians of {repeat} run(s))",
        [
            "subscribers",
            "events",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "got every event",
            "delivered",
            "emit POST p50 ms",
            "emit POST p95 ms",
            "server CPU",
            "subscribers' CPU",
            "connect s",
            "idle KiB/stream",
            "goal (p95 and every event)",
        ],
        rows,
        note="Delay = receipt in a subscriber process − the time taken just before the emit POST (one clock). "
        "'got every event' and 'delivered' are the worst run; the rest are medians. CPU: share of one core while "
        f"publishing (server process; all {args.workers} subscriber processes together). idle KiB/stream: the "
        "server's RSS growth while the subscribers connected, per open idle stream (first run of a fresh server).",
    )
    peer_count = 1000
    command = None if args.no_peer or peer_count not in counts else langgraph_command()
    if command is None and not args.no_peer and peer_count in counts:
        print(f"  (LangGraph Agent Server not found: pip install 'langgraph-cli[inmem]' or set {LANGGRAPH_ENV})")
    if command is not None:
        t0 = time.perf_counter()
        peer = measure_langgraph(command, peer_count, args.rate, seconds, args.workers)
        print(f"  LangGraph, {peer_count} joined: p95 {peer.p95_ms:.0f} ms ({time.perf_counter() - t0:.0f} s)")
        loopd_p95 = measured.get(f"p95_ms_{peer_count}")
        ratio = peer.p95_ms / loopd_p95 if loopd_p95 else None
        measured[f"x_langgraph_join_{peer_count}"] = ratio
        print_table(
            f"Joined streams: {peer_count} clients on one run's stream, LangGraph Agent Server (langgraph dev, "
            "in-memory) beside loopd (1 run)",
            ["server", "p50 ms", "p95 ms", "p99 ms", "max ms", "got every event", "delivered", "server CPU", "× loopd"],
            [
                (
                    "LangGraph",
                    peer.p50_ms,
                    peer.p95_ms,
                    peer.p99_ms,
                    peer.max_ms,
                    f"{peer.complete}/{peer_count}",
                    f"{peer.delivered:.2%}",
                    f"{peer.server_cpu:.0%}",
                    "n/a" if ratio is None else f"{ratio:.0f}×",
                )
            ],
            note="GET /threads/{id}/runs/{run_id}/stream joined by every client before the run's node writes "
            f"{round(args.rate * seconds)} custom events at {args.rate:g}/s (publish time taken in the node). "
            "LangGraph's dev server keeps its state in memory (loopd's is durable). × loopd = LangGraph p95 ÷ "
            f"loopd's p95 at {peer_count} subscribers above.",
        )
    print_goals("server_streams", measured)


def _p95_goal(count: int) -> Goal | None:
    """The p95 goal of ``count`` subscribers (`benchmarks._goals`), if it has one."""
    return next((g for g in GOALS if g.module == "server_streams" and g.key == f"p95_ms_{count}"), None)


if __name__ == "__main__":
    run_main(main)
