"""Router overhead: what the Router adds to an answer beyond the harness calls it makes.

A `loopd up` process (demo model: scripted, zero latency) runs the Router in process. One question at a time,
``Introduce A, B, and C`` (three different names each time, so the Router plans three parallel tasks): the wall time
is the chat request's start → the response's ``end`` event on the request's own SSE response. Its five harness calls
(``plan``, ``work/0..2``, ``summarize``) are read afterwards from the ledger and ``GET /v1/harness/calls/{id}``;
their time is the union of their ``created_at → updated_at`` intervals (the three work calls overlap, so they count
once). Overhead = wall − harness time: accepting the question and creating the Task, the watch noticing it, the
reconciles, reading the context, starting and waiting on calls, publishing the answer and completing the Task.
Target (issue 12): ≤ 50 ms at p50.

``--standalone`` measures the Router as its own process instead (`loopd up --no-router` plus
`loopd operator router --data-dir`), so it does not share the server's event loop.

python -m benchmarks.router_overhead [--questions 50] [--repeat N] [--quick] [--standalone]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import httpx

from benchmarks._children import run_main, spawn
from benchmarks._common import positive_int, print_table
from benchmarks._server import (
    STOP_TIMEOUT,
    ServerProcess,
    frame_data,
    now,
    open_event_stream,
    percentile,
    running_server,
)

TARGET_P50_MS: Final = 50.0
ANSWER_TIMEOUT: Final = 60.0
_NAMES: Final = (
    "Liu Bei", "Guan Yu", "Zhang Fei", "Zhuge Liang", "Zhao Yun", "Cao Cao", "Sun Quan", "Zhou Yu", "Lu Bu",
    "Diao Chan", "Ma Chao", "Huang Zhong", "Sima Yi", "Lu Xun", "Xu Shu", "Pang Tong", "Dong Zhuo", "Yuan Shao",
    "Sun Ce", "Gan Ning", "Wei Yan", "Jiang Wei", "Deng Ai", "Zhang Liao", "Xiahou Dun",
)  # fmt: skip


@dataclass(frozen=True)
class Answer:
    wall_ms: float
    harness_ms: float
    calls: int
    ok: bool
    start_ms: float
    """The response's creation → the first harness call's (server clock): the Task noticed, its context read."""
    gaps_ms: float
    """The first call's start → the last call's end, minus the calls' union: waits noticed, the next calls started."""
    finish_ms: float
    """The last call's end → the response's last update (server clock): the answer published, the Task completed."""

    @property
    def overhead_ms(self) -> float:
        return self.wall_ms - self.harness_ms


def questions(count: int) -> list[str]:
    """``count`` questions naming three different people each."""
    trios = itertools.cycle(itertools.combinations(_NAMES, 3))
    return [f"Introduce {a}, {b}, and {c}" for a, b, c in itertools.islice(trios, 0, count * 7, 7)]


def union_ms(intervals: Sequence[tuple[datetime, datetime]]) -> float:
    """The total length of the union of ``intervals``, in milliseconds."""
    total = 0.0
    current: tuple[datetime, datetime] | None = None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current is not None:
                total += (current[1] - current[0]).total_seconds()
            current = (start, end)
        elif end > current[1]:
            current = (current[0], end)
    if current is not None:
        total += (current[1] - current[0]).total_seconds()
    return total * 1000


async def harness_intervals(http: httpx.AsyncClient, task_id: str) -> list[tuple[datetime, datetime]]:
    """``created_at → updated_at`` of every harness call the ledger shows under the Task."""
    trail = (await http.get("/v1/ledger", params={"task_id": task_id})).raise_for_status().json()
    call_ids = sorted({lane["harness_call_id"] for lane in trail["lanes"] if lane.get("harness_call_id")})
    intervals = []
    for call_id in call_ids:
        call = (await http.get(f"/v1/harness/calls/{call_id}")).raise_for_status().json()
        intervals.append((datetime.fromisoformat(call["created_at"]), datetime.fromisoformat(call["updated_at"])))
    return intervals


async def message_times(http: httpx.AsyncClient, conversation: str, message_id: str) -> tuple[datetime, datetime]:
    """A message's ``created_at`` and ``updated_at``."""
    page = (await http.get(f"/v1/conversations/{conversation}/messages", params={"limit": 100})).raise_for_status()
    for message in page.json()["data"]:
        if message["id"] == message_id:
            return datetime.fromisoformat(message["created_at"]), datetime.fromisoformat(message["updated_at"])
    raise RuntimeError(f"no message {message_id}")


def _ms(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000


async def ask(server: ServerProcess, http: httpx.AsyncClient, text: str) -> Answer:
    conversation = (await http.post("/v1/conversations", json={"name": text[:60]})).raise_for_status().json()["id"]
    body = {"target": {"kind": "operator", "key": "router"}, "text": text}
    response_id: str | None = None
    task_id: str | None = None
    ok = False
    started = now()
    async with await open_event_stream(
        server.host,
        server.port,
        f"/v1/conversations/{conversation}/messages",
        token=server.token,
        method="POST",
        body=body,
        timeout=ANSWER_TIMEOUT,
    ) as stream:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            async for frame in stream.frames():
                _, kind, data = frame_data(frame)
                if not isinstance(data, dict):
                    continue
                if kind == "ack":
                    response_id = str(data["response_message_id"])
                    task_id = str(data["task_id"])
                    continue
                if data.get("message_id") != response_id:
                    continue
                event: dict[str, Any] = data.get("event") or {}
                if event.get("op") == "end":
                    ok = (data.get("message") or {}).get("status") == "completed"
                    break
    wall_ms = (now() - started) * 1000
    if task_id is None:
        raise RuntimeError("the chat request was not acknowledged")
    intervals = await harness_intervals(http, task_id)
    if response_id is None or not intervals:
        return Answer(wall_ms, union_ms(intervals), len(intervals), False, 0.0, 0.0, 0.0)
    created, updated = await message_times(http, conversation, response_id)
    first = min(start for start, _ in intervals)
    last = max(end for _, end in intervals)
    harness = union_ms(intervals)
    return Answer(
        wall_ms, harness, len(intervals), ok, _ms(created, first), _ms(first, last) - harness, _ms(last, updated)
    )


async def router_registered(server: ServerProcess) -> None:
    """Until ``/v1/actors`` lists operator:router (it registers just after the server is up)."""
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30.0) as http:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            while True:
                actors = (await http.get("/v1/actors")).raise_for_status().json()["data"]
                if any(a["kind"] == "operator" and a["key"] == "router" for a in actors):
                    return
                await asyncio.sleep(0.05)


async def run_round(server: ServerProcess, texts: Sequence[str]) -> list[Answer]:
    headers = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30.0) as http:
        return [await ask(server, http, text) for text in texts]


@contextlib.contextmanager
def standalone_router(server: ServerProcess, directory: Path) -> Iterator[None]:
    """`loopd operator router --data-dir` beside ``server``, stopped by its pid on exit."""
    with (directory / "router.log").open("wb") as log:
        child = spawn(
            [str(Path(sys.executable).parent / "loopd"), "operator", "router", "--data-dir", str(server.data_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, LOOPD_MODEL="demo"),
        )
        try:
            yield
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(STOP_TIMEOUT)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=positive_int, default=50, help="questions per round, asked one at a time")
    parser.add_argument("--repeat", type=positive_int, default=3, help="rounds; the table shows each and their median")
    parser.add_argument("--quick", action="store_true", help="1 round of 10 questions")
    parser.add_argument("--standalone", action="store_true", help="the Router in its own process")
    args = parser.parse_args(argv)
    count = 10 if args.quick else max(1, args.questions)
    repeat = 1 if args.quick else max(1, args.repeat)

    rows: list[tuple[object, ...]] = []
    p50s: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="loopd-bench-router-") as directory,
        running_server(Path(directory), extra_args=["--no-router"] if args.standalone else []) as server,
        standalone_router(server, Path(directory)) if args.standalone else contextlib.nullcontext(),
    ):

        async def series() -> None:
            await router_registered(server)
            await run_round(server, questions(3))  # warm-up: imports, connections, the first plan
            texts = questions(count)
            for index in range(repeat):
                t0 = time.perf_counter()
                cpu0 = server.cpu_seconds()
                answers = await run_round(server, texts)
                cpu_ms = (server.cpu_seconds() - cpu0) * 1000.0 / len(texts)
                overhead = [a.overhead_ms for a in answers]
                wall = [a.wall_ms for a in answers]
                harness = [a.harness_ms for a in answers]
                ok = sum(1 for a in answers if a.ok and a.calls == 5)
                p50s.append(percentile(overhead, 50))
                rows.append(
                    (
                        index + 1,
                        f"{ok}/{len(answers)}",
                        percentile(overhead, 50),
                        percentile(overhead, 95),
                        percentile(wall, 50),
                        percentile(harness, 50),
                        percentile([a.start_ms for a in answers], 50),
                        percentile([a.gaps_ms for a in answers], 50),
                        percentile([a.finish_ms for a in answers], 50),
                        cpu_ms,
                    )
                )
                print(
                    f"  round {index + 1}: overhead p50 {rows[-1][2]:.1f} ms p95 {rows[-1][3]:.1f} ms, "
                    f"wall p50 {rows[-1][4]:.1f} ms, server CPU {cpu_ms:.1f} ms/answer, ok {ok}/{len(answers)} "
                    f"({time.perf_counter() - t0:.1f} s)",
                    flush=True,
                )

        asyncio.run(series())
    median_p50 = statistics.median(p50s)
    print_table(
        f"Router overhead ({'standalone process' if args.standalone else 'in loopd up'}): wall − harness-call time "
        f"of one answer, {count} questions per round (demo model)",
        [
            "round",
            "5 calls + completed",
            "overhead p50 ms",
            "overhead p95 ms",
            "wall p50 ms",
            "harness p50 ms",
            "start p50 ms",
            "between calls p50 ms",
            "finish p50 ms",
            "server CPU ms/answer",
        ],
        rows,
        note=f"median p50 {median_p50:.1f} ms; target ≤ {TARGET_P50_MS:g} ms p50 "
        f"({'met' if median_p50 <= TARGET_P50_MS else 'missed'}). Harness time: the union of the five calls' "
        "created_at → updated_at (server clock); wall: chat POST start → the response's end event (client). Parts "
        "of the overhead (server clock): start = response created → first call created (the Task noticed, its "
        "context read); between calls = first call start → last call end − harness time (a finished call noticed, "
        "the next started); finish = last call end → the response's last update (answer published, completed). Server "
        "CPU: the `loopd up` process's user + system CPU time over the round, per answer (harness calls included; "
        "with --standalone the Router's own process is not counted).",
    )


if __name__ == "__main__":
    run_main(main)
