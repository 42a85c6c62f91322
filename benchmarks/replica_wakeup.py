"""Cross-replica wake-up latency: a write committed on replica A → a streaming reader on replica B sees it.

Two `loopd server` processes (replicas A and B, their own data directories) share one PostgreSQL (a throwaway
server started from the installed binaries, or ``--dsn``). Operator ``bench`` is registered and asked a question on
A; the benchmark then publishes ``append`` events into the response through A's Task API
(``POST /v1/tasks/{id}/events``) at ``--rate`` per second. Each event's text carries its index and its publish time
(CLOCK_MONOTONIC, taken just before the POST). Two SSE readers follow the conversation
(``GET /v1/conversations/{id}/stream``): one on B (the cross-replica path: A's commit → NOTIFY → B's listener → B's
bus → B's feed reads the durable log → SSE) and one on A (the same-replica path, for comparison). Reported: publish →
receipt delay p50/p95 on B and on A, and the emit POST's own latency (what A's commit costs before any wake-up).

python -m benchmarks.replica_wakeup [--events 200] [--rate 20] [--dsn postgresql://…]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from benchmarks._children import run_main, spawn
from benchmarks._common import positive_float, positive_int, print_table
from benchmarks._server import (
    _LAUNCH,
    START_TIMEOUT,
    Api,
    EventStream,
    ServerProcess,
    _stop,
    now,
    open_event_stream,
    percentile,
)

TICK: Final = re.compile(rb"bench:(\d+):(\d+\.\d+);")
DONE_MARK: Final = b"bench-done"
DRAIN_TIMEOUT: Final = 60.0


@contextlib.contextmanager
def replica(directory: Path, name: str, dsn: str, token: str) -> Iterator[ServerProcess]:
    """`loopd server` on a free loopback port, state in PostgreSQL ``dsn``, admin token ``token``; stopped by pid."""
    data_dir = directory / name
    log_path = directory / f"{name}.log"
    command = [sys.executable, "-c", _LAUNCH, "server", "--port", "0", "--data-dir", str(data_dir), "--database", dsn]
    env = dict(os.environ, LOOPD_MODEL="demo", LOOPD_ADMIN_TOKEN=token, LOOPD_SANDBOX="none", COLUMNS="200")
    with log_path.open("wb") as log:
        child = spawn(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            yield _wait(child, data_dir, log_path, token)
        finally:
            _stop(child)


def _wait(child: subprocess.Popen[bytes], data_dir: Path, log: Path, token: str) -> ServerProcess:
    import json
    from urllib.parse import urlsplit

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"loopd server exited {child.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError, ValueError):
            info = json.loads((data_dir / "server.json").read_text())
            if info.get("pid") == child.pid:
                url = str(info["url"])
                parts = urlsplit(url)
                return ServerProcess(url, parts.hostname or "127.0.0.1", parts.port or 80, token, child.pid, data_dir)
        time.sleep(0.05)
    raise RuntimeError(f"loopd server did not write {data_dir / 'server.json'} within {START_TIMEOUT:g} s")


def _tick(index: int) -> dict[str, Any]:
    text = f"bench:{index}:{now():.6f};"
    return {"op": "append", "mask": "block.content", "block": {"id": "tick", "type": "text", "content": text}}


async def _follow(stream: EventStream, events: int) -> list[float]:
    """Publish → receipt delays (seconds) of the ticks this reader saw, until the done mark."""
    seen: set[int] = set()
    delays: list[float] = []
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT + events):
            async for frame in stream.frames():
                arrived = now()
                for match in TICK.finditer(frame):
                    index = int(match.group(1))
                    if index not in seen:
                        seen.add(index)
                        delays.append(arrived - float(match.group(2)))
                if DONE_MARK in frame:
                    break
    finally:
        await stream.aclose()
    return delays


async def measure(a: ServerProcess, b: ServerProcess, events: int, rate: float) -> dict[str, list[float]]:
    async with Api(a) as api:
        conversation = await api.create_conversation("replica-wakeup")
        await api.register_operator()
        task_id = str((await api.ask(conversation, "operator", "bench", "stream ticks"))["task_id"])
        path = f"/v1/conversations/{conversation}/stream"
        on_b = await open_event_stream(b.host, b.port, path, token=b.token)
        on_a = await open_event_stream(a.host, a.port, path, token=a.token)
        readers = [asyncio.create_task(_follow(on_b, events)), asyncio.create_task(_follow(on_a, events))]
        await asyncio.sleep(0.5)  # both streams attached
        posts: list[float] = []
        start = now() + 0.05
        for index in range(events):
            await asyncio.sleep(max(0.0, start + index / rate - now()))
            started = now()
            await api.emit(task_id, [_tick(index)])
            posts.append(now() - started)
        done = {
            "op": "append",
            "mask": "block.content",
            "block": {"id": "tick", "type": "text", "content": "bench-done"},
        }
        await api.emit(task_id, [done])
        cross, same = await asyncio.gather(*readers)
        await api.complete(task_id)
    return {"cross": cross, "same": same, "posts": posts}


def _ms(values: Sequence[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:.1f}" if values else "-"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=positive_int, default=200)
    parser.add_argument("--rate", type=positive_float, default=20.0, help="events per second")
    parser.add_argument("--dsn", default=None, help="an existing PostgreSQL database (default: a throwaway server)")
    parser.add_argument(
        "--repeat", type=positive_int, default=1, help="accepted for `python -m benchmarks`; one series runs"
    )
    parser.add_argument("--quick", action="store_true", help="50 events")
    args = parser.parse_args(argv)
    if args.quick:
        args.events = min(args.events, 50)

    with contextlib.ExitStack() as stack:
        dsn = args.dsn
        if dsn is None:
            from tests.support.postgres import start_postgres

            server = start_postgres()
            stack.callback(server.stop)
            dsn = server.create_database()
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loopd-replicas-")))
        token = secrets.token_urlsafe(24)
        a = stack.enter_context(replica(directory, "a", dsn, token))
        b = stack.enter_context(replica(directory, "b", dsn, token))
        load = os.getloadavg()[0]
        result = asyncio.run(measure(a, b, args.events, args.rate))

    cross, same, posts = result["cross"], result["same"], result["posts"]
    rows = [
        ("A commit → reader on B (cross-replica)", cross),
        ("A commit → reader on A (same replica)", same),
        ("emit POST on A (the write itself)", posts),
    ]
    print_table(
        "Cross-replica wake-up latency",
        ["path", "received", "p50 ms", "p95 ms", "max ms"],
        [[label, len(values), _ms(values, 50), _ms(values, 95), _ms(values, 100)] for label, values in rows],
        note=f"{args.events} events at {args.rate:g}/s; load average at start {load:.2f}",
    )


if __name__ == "__main__":
    run_main(main)
