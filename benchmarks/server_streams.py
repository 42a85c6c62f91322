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
import multiprocessing
import re
import statistics
import tempfile
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from benchmarks._common import print_table, verdict
from benchmarks._goals import GOALS, Goal, print_goals
from benchmarks._server import (
    Api,
    EventStream,
    ServerProcess,
    cpu_seconds,
    now,
    open_event_stream,
    percentile,
    raise_open_files,
    running_server,
    sampling,
)

TICK = re.compile(rb"bench:(\d+):(\d+\.\d+);")
DONE_MARK: Final = b"bench-done"
CONNECT_AT_ONCE: Final = 32
READY_TIMEOUT: Final = 180.0
DRAIN_GRACE: Final = 60.0


# --- the subscriber side (worker processes) ----------------------------------------------------------------


@dataclass
class _Subscription:
    seen: bytearray
    received: int = 0
    failed: str = ""


async def _follow(stream: EventStream, sub: _Subscription, delays: array[float]) -> None:
    try:
        async for frame in stream.frames():
            arrived = now()
            for match in TICK.finditer(frame):
                index = int(match.group(1))
                if index < len(sub.seen) and not sub.seen[index]:
                    sub.seen[index] = 1
                    sub.received += 1
                    delays.append(arrived - float(match.group(2)))
            if DONE_MARK in frame:
                return
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        sub.failed = f"{type(exc).__name__}: {exc}"
    finally:
        await stream.aclose()


async def _subscribe(pipe: Connection, target: dict[str, Any]) -> dict[str, Any]:
    count, events = int(target["count"]), int(target["events"])
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)
    t0 = now()

    async def connect() -> EventStream | str:
        async with gate:
            try:
                return await open_event_stream(
                    target["host"], target["port"], target["path"], token=target["token"], timeout=60
                )
            except (OSError, TimeoutError, RuntimeError, ValueError) as exc:
                return f"{type(exc).__name__}: {exc}"

    opened = await asyncio.gather(*(connect() for _ in range(count)))
    streams = [s for s in opened if isinstance(s, EventStream)]
    refused = [s for s in opened if isinstance(s, str)]
    pipe.send({"ready": len(streams), "refused": refused[:3], "connect_s": now() - t0})
    delays: array[float] = array("d")
    subs = [_Subscription(bytearray(events)) for _ in streams]
    followers = [asyncio.ensure_future(_follow(s, sub, delays)) for s, sub in zip(streams, subs, strict=True)]
    deadline = float(target["deadline_s"])
    _, pending = await asyncio.wait(followers, timeout=deadline) if followers else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return {
        "delays": delays.tobytes(),
        "received": [s.received for s in subs],
        "failed": [s.failed for s in subs if s.failed][:3],
        "timed_out": len(pending),
        "refused": len(refused),
    }


def _subscriber_process(pipe: Connection, target: dict[str, Any]) -> None:
    raise_open_files(int(target["count"]) + 256)
    try:
        result = asyncio.run(_subscribe(pipe, target))
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


def _tick(index: int) -> dict[str, Any]:
    text = f"bench:{index}:{now():.6f};"
    return {"op": "append", "mask": "block.content", "block": {"id": "tick", "type": "text", "content": text}}


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
    shares = [subscribers // workers + (1 if i < subscribers % workers else 0) for i in range(workers)]
    pipes: list[Connection] = []
    processes: list[multiprocessing.process.BaseProcess] = []
    try:
        for share in shares:
            parent, child = context.Pipe()
            target = {
                "host": server.host,
                "port": server.port,
                "token": server.token,
                "path": f"/v1/conversations/{conversation}/stream",
                "count": share,
                "events": events,
                "deadline_s": seconds + DRAIN_GRACE,
            }
            process = context.Process(target=_subscriber_process, args=(child, target), daemon=True)
            process.start()
            child.close()
            pipes.append(parent)
            processes.append(process)
        ready = [_receive(pipe, READY_TIMEOUT) for pipe in pipes]
        connected = sum(int(r["ready"]) for r in ready)
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
    finally:
        for worker in processes:
            worker.join(10)
            if worker.is_alive():
                worker.terminate()  # this worker process was started above; it ends by its own handle
                worker.join(5)
        for pipe in pipes:
            pipe.close()

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
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", default="100,1000", help="comma-separated subscriber counts")
    parser.add_argument("--rate", type=float, default=20.0, help="events per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to publish")
    parser.add_argument("--workers", type=int, default=2, help="subscriber worker processes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run, 200 subscribers, 5 s")
    parser.add_argument(
        "--profile", type=Path, default=None, help="sample the server with py-spy in the largest count's first run"
    )
    args = parser.parse_args(argv)
    counts = [200] if args.quick else [int(c) for c in args.subscribers.split(",") if c.strip()]
    seconds = 5.0 if args.quick else args.seconds
    repeat = 1 if args.quick else max(1, args.repeat)
    raise_open_files(max(counts) + 1024)

    rows: list[tuple[object, ...]] = []
    measured: dict[str, float | None] = {}
    with (
        tempfile.TemporaryDirectory(prefix="loopd-bench-streams-") as directory,
        running_server(Path(directory)) as server,
    ):
        run = 0
        for count in counts:
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
                    f"{m.server_cpu:.0%}",
                    f"{m.clients_cpu:.0%}",
                    m.connect_s,
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
            "server CPU",
            "subscribers' CPU",
            "connect s",
            "goal (p95 and every event)",
        ],
        rows,
        note="Delay = receipt in a subscriber process − the time taken just before the emit POST (one clock). "
        "'got every event' and 'delivered' are the worst run; the rest are medians. CPU: share of one core while "
        f"publishing (server process; all {args.workers} subscriber processes together).",
    )
    print_goals("server_streams", measured)


def _p95_goal(count: int) -> Goal | None:
    """The p95 goal of ``count`` subscribers (`benchmarks._goals`), if it has one."""
    return next((g for g in GOALS if g.module == "server_streams" and g.key == f"p95_ms_{count}"), None)


if __name__ == "__main__":
    main()
