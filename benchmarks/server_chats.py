"""Chats: N concurrent chats to the built-in harness (``harness:assistant``, the demo model) of a `loopd up` server.

The server runs in its own process (`loopd up --port 0`). Each chat has its own conversation and is one
``POST /v1/conversations/{id}/messages`` with ``Accept: text/event-stream`` (the answer streams in the response),
all N sent at once on raw asyncio connections. Per chat: time to first token = POST start → the first ``append``
(or ``set``) of the response's ``answer`` block on that stream; completion = POST start → the response's ``end``.
Throughput = N / (last completion − first POST start). Also a single chat alone, as the unloaded reference.

Peers, measured the same way in the same run (``--peers``, default ``bare``): ``bare`` is a bare FastAPI + SQLite
server (`benchmarks._chat_peer_bare`) that stores the two messages and streams the same number of pieces with no
Task, engine, harness or ledger — the floor; both it and loopd keep SQLite at ``synchronous=NORMAL`` in WAL mode (a
commit survives a process crash, not a power loss). LangGraph's Agent Server is not measured yet (its goals print
"n/a").

python -m benchmarks.server_chats [--chats 100] [--repeat N] [--quick] [--peers bare|none]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks._chat_peer_bare import running_bare_server
from benchmarks._common import print_table
from benchmarks._goals import print_goals
from benchmarks._server import (
    Api,
    ServerProcess,
    frame_data,
    now,
    open_event_stream,
    percentile,
    running_server,
    sampling,
)
from loopd.server._composition import UpSettings
from loopd.server.responder import HarnessResponder

ANSWER_BLOCK: Final = "answer"
CAPACITY: Final = int(inspect.signature(UpSettings).parameters["engine_capacity"].default)
_RESPONDER = inspect.signature(HarnessResponder.__init__).parameters
CAPACITY_RETRY: Final[float] = _RESPONDER["capacity_retry"].default
POLL: Final[float] = _RESPONDER["poll"].default
CHAT_TIMEOUT: Final = 120.0
COLUMNS: Final = ("chats", "completed", "chats/s", "TTFT p50 ms", "TTFT p95 ms", "done p50 ms", "done p95 ms", "wall s")


@dataclass(frozen=True)
class Chat:
    first_token: float
    completed: float
    ok: bool


@dataclass(frozen=True)
class ChatRun:
    chats: int
    ok: int
    wall: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    done_p50_ms: float
    done_p95_ms: float

    @property
    def per_second(self) -> float:
        return self.chats / self.wall


async def one_chat(server: ServerProcess, conversation: str, text: str, gate: asyncio.Event) -> Chat:
    await gate.wait()
    started = now()
    first_token = float("nan")
    response_id: str | None = None
    ok = False
    body = {"target": {"kind": "harness", "key": "assistant"}, "text": text}
    async with await open_event_stream(
        server.host,
        server.port,
        f"/v1/conversations/{conversation}/messages",
        token=server.token,
        method="POST",
        body=body,
        timeout=CHAT_TIMEOUT,
    ) as stream:
        async with asyncio.timeout(CHAT_TIMEOUT):
            async for frame in stream.frames():
                _, kind, data = frame_data(frame)
                if not isinstance(data, dict):
                    continue
                if kind == "ack":
                    response_id = str(data["response_message_id"])
                    continue
                if data.get("message_id") != response_id:
                    continue
                event: dict[str, Any] = data.get("event") or {}
                block = event.get("block") or {}
                first = first_token != first_token  # NaN: no token yet
                if first and event.get("op") in ("append", "set") and block.get("id") == ANSWER_BLOCK:
                    first_token = now() - started
                if event.get("op") == "end":
                    ok = (data.get("message") or {}).get("status") == "completed"
                    break
    return Chat(first_token, now() - started, ok)


async def run_chats(server: ServerProcess, count: int, label: str) -> ChatRun:
    async with Api(server, connections=min(count, 50)) as api:
        conversations = await asyncio.gather(*(api.create_conversation(f"{label}-{i}") for i in range(count)))
    gate = asyncio.Event()
    chats = [asyncio.ensure_future(one_chat(server, c, f"hello number {i}", gate)) for i, c in enumerate(conversations)]
    await asyncio.sleep(0.05)
    t0 = now()
    gate.set()
    done = await asyncio.gather(*chats)
    wall = now() - t0
    ttft = [c.first_token * 1000 for c in done if c.first_token == c.first_token]
    completed = [c.completed * 1000 for c in done]
    return ChatRun(
        chats=count,
        ok=sum(1 for c in done if c.ok),
        wall=wall,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p95_ms=percentile(ttft, 95),
        done_p50_ms=percentile(completed, 50),
        done_p95_ms=percentile(completed, 95),
    )


def _median(runs: Sequence[ChatRun]) -> ChatRun:
    def med(name: str) -> float:
        return statistics.median(float(getattr(r, name)) for r in runs)

    return ChatRun(
        chats=runs[0].chats,
        ok=min(r.ok for r in runs),
        wall=med("wall"),
        ttft_p50_ms=med("ttft_p50_ms"),
        ttft_p95_ms=med("ttft_p95_ms"),
        done_p50_ms=med("done_p50_ms"),
        done_p95_ms=med("done_p95_ms"),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=int, default=100, help="concurrent chats")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run of 20 chats")
    parser.add_argument("--profile", type=Path, default=None, help="sample the server with py-spy in the first burst")
    parser.add_argument("--peers", default="bare", help="peers measured in the same run: bare, or none")
    args = parser.parse_args(argv)
    count = 20 if args.quick else args.chats
    repeat = 1 if args.quick else max(1, args.repeat)
    peers = [p.strip() for p in args.peers.split(",") if p.strip() and p.strip() != "none"]
    unknown = set(peers) - {"bare"}
    if unknown:
        raise SystemExit(f"unknown peers {sorted(unknown)}: choose bare (or none)")

    rows: list[tuple[object, ...]] = []
    peer_rows: list[tuple[object, ...]] = []
    measured: dict[int, ChatRun] = {}
    peer_measured: dict[str, dict[int, ChatRun]] = {}

    def series(server: ServerProcess, who: str, into: dict[int, ChatRun], profile: Path | None) -> None:
        out = rows if who == "loopd" else peer_rows

        async def go() -> None:
            await run_chats(server, 1, "warmup")
            for size in (1, count):
                runs: list[ChatRun] = []
                for index in range(repeat):
                    t0 = time.perf_counter()
                    spy = profile / f"chats-{size}.txt" if profile and index == 0 and size > 1 else None
                    with sampling(server.pid, spy, 5.0):
                        runs.append(await run_chats(server, size, f"chats-{size}-{index}"))
                    got = runs[-1]
                    print(
                        f"  {who}, {size} chats: {got.per_second:.1f}/s, TTFT p50 {got.ttft_p50_ms:.0f} ms, done p50 "
                        f"{got.done_p50_ms:.0f} ms, ok {got.ok}/{size} ({time.perf_counter() - t0:.1f} s)",
                        flush=True,
                    )
                m = _median(runs)
                into[size] = m
                out.append(
                    (
                        *(() if who == "loopd" else (who,)),
                        size,
                        f"{m.ok}/{size}",
                        m.per_second,
                        m.ttft_p50_ms,
                        m.ttft_p95_ms,
                        m.done_p50_ms,
                        m.done_p95_ms,
                        m.wall,
                    )
                )

        asyncio.run(go())

    with tempfile.TemporaryDirectory(prefix="loopd-bench-chats-") as directory:
        with running_server(Path(directory)) as server:
            series(server, "loopd", measured, args.profile)
        for peer in peers:  # one server at a time: each has the machine to itself
            peer_dir = Path(directory) / peer
            peer_dir.mkdir()
            with running_bare_server(peer_dir) as bare:
                series(bare, "bare FastAPI + SQLite", peer_measured.setdefault(peer, {}), None)
    print_table(
        f"Chats to harness:assistant (demo model), all sent at once (medians of {repeat} run(s))",
        list(COLUMNS),
        rows,
        note="TTFT: POST start → first append/set of the response's 'answer' block on the chat's own SSE response. "
        "done: POST start → the response's end event. 'completed' is the worst run. Server defaults: "
        f"{CAPACITY} concurrent harness calls; the responder is woken by the engine when a call ends or a slot "
        f"frees (its {POLL:g} s poll and {CAPACITY_RETRY:g} s capacity retry are only safety nets).",
    )
    if peer_rows:
        print_table(
            f"Chats to the peers, measured the same way after loopd (medians of {repeat} run(s))",
            ["server", *COLUMNS],
            peer_rows,
            note="bare FastAPI + SQLite: stores the question and the answer (two transactions) and streams the "
            "same number of pieces, no Task/engine/harness/ledger (benchmarks/_chat_peer_bare.py). Both it and "
            "loopd run SQLite in WAL mode at synchronous=NORMAL (a commit survives a process crash, not a power "
            "loss).",
        )
    print_goals("server_chats", chat_goals(measured, peer_measured.get("bare")))


def chat_goals(measured: dict[int, ChatRun], bare: dict[int, ChatRun] | None = None) -> dict[str, float | None]:
    """The figures `benchmarks._goals` judges: at exactly 100 chats, and the chats lost at 1,000 or more; the
    ratio to the bare server's chats/s at 100 chats when it ran."""
    hundred = measured.get(100)
    thousand = max((size for size in measured if size >= 1000), default=None)
    floor = bare.get(100) if bare else None
    return {
        "chats_per_s": hundred.per_second if hundred else None,
        "ttft_p95_ms": hundred.ttft_p95_ms if hundred else None,
        "lost_1000": None if thousand is None else float(thousand - measured[thousand].ok),
        "x_bare_rate": hundred.per_second / floor.per_second if hundred and floor and floor.per_second else None,
    }


if __name__ == "__main__":
    main()
