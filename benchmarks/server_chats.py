"""Chats: N concurrent chats to the built-in harness (``harness:assistant``, the demo model) of a `loopd up` server.

The server runs in its own process (`loopd up --port 0`). Each chat has its own conversation and is one
``POST /v1/conversations/{id}/messages`` with ``Accept: text/event-stream`` (the answer streams in the response),
all N sent at once on raw asyncio connections. Per chat: time to first token = POST start → the first ``append``
(or ``set``) of the response's ``answer`` block on that stream; completion = POST start → the response's ``end``.
Throughput = N / (last completion − first POST start). Also a single chat alone, as the unloaded reference.

Peers, measured the same way in the same run (``--peers``, default ``bare,langgraph``), their rounds alternating
with loopd's (loopd, then each peer, for each repetition; every server started before the first round):

* ``bare``: a bare FastAPI + SQLite server (`benchmarks._chat_peer_bare`) that stores the two messages and streams
  the same number of pieces with no Task, engine, harness or ledger — the floor; both it and loopd keep SQLite at
  ``synchronous=NORMAL`` in WAL mode (a commit survives a process crash, not a power loss);
* ``langgraph``: LangGraph's Agent Server, ``langgraph dev --no-browser`` (`benchmarks._langgraph`: in-memory
  state, pickled to disk every 10 s), serving a one-node graph whose zero-latency fake chat model streams the bare
  peer's answer in the same pieces (`benchmarks._chat_peer_langgraph`); one chat = a thread (created before the
  clock starts, like loopd's conversations) and ``POST /threads/{id}/runs/stream``. A full run installs the peer's
  own virtualenv when it is missing (``python -m benchmarks._langgraph ensure``; a ``--quick`` run only says so).

Then the 1,000-chat round (``--thousand``, loopd only): 1,000 chats at once, after which every conversation is read
back (``GET …/messages``) and a chat counts as lost unless its stream ended ``completed`` and the stored answer is
``completed`` with the very text that was streamed (which begins by echoing that chat's own question).

Last, the paced series (``--paced``, loopd only): the same rounds against a model that streams at a reader's pace —
the demo model served on its own (`benchmarks._server.running_model_server`: a 12-character piece every 20 ms, from
another process over HTTP) and a fresh `loopd up` pointed at it as at any OpenAI-compatible provider. Each piece then
arrives on its own, so what the server does per piece (live text is stored before anyone sees it) shows here, where
the zero-latency demo hands over whole answers. No goal judges it; the table gives the pace a lone answer would take.

python -m benchmarks.server_chats [--chats 100] [--repeat N] [--quick] [--peers bare,langgraph|none]
                                  [--thousand 1000] [--paced 0.02] [--langgraph-jobs N] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

from benchmarks._chat_peer_bare import running_bare_server
from benchmarks._chat_peer_langgraph import GRAPH_ID, GRAPH_SOURCE, expected_text
from benchmarks._chat_peer_langgraph import one_chat as langgraph_chat
from benchmarks._children import run_main
from benchmarks._common import count_or_zero, positive_int, print_table, seconds_or_zero
from benchmarks._goals import print_goals
from benchmarks._langgraph import LANGGRAPH_ENV, ensure_venv, langgraph_command, peer_versions, running_graph
from benchmarks._server import (
    Api,
    ServerProcess,
    StreamRefused,
    cpu_seconds,
    frame_data,
    now,
    open_event_stream,
    percentile,
    raise_open_files,
    running_model_server,
    running_server,
    sampling,
    tree_cpu_seconds,
)
from benchmarks._stacks import read, render
from loopd.server._composition import UpSettings
from loopd.server.responder import HarnessResponder

ANSWER_BLOCK: Final = "answer"
CAPACITY: Final = int(inspect.signature(UpSettings).parameters["engine_capacity"].default)
_RESPONDER = inspect.signature(HarnessResponder.__init__).parameters
CAPACITY_RETRY: Final[float] = _RESPONDER["capacity_retry"].default
POLL: Final[float] = _RESPONDER["poll"].default
CHAT_TIMEOUT: Final = 120.0
THOUSAND_TIMEOUT: Final = 600.0
"""The 1,000-chat round's bound per chat: a chat still unanswered after it counts as lost."""
PACED_DELAY: Final = 0.02
"""Seconds between the pieces of the paced series' model (``--paced``)."""
PACED_MODEL: Final = "paced-demo"
"""The model name `loopd up` asks the paced series' model server for (it answers any)."""
PIECE: Final = 12
"""Characters per streamed piece: the demo model's chunk size."""
COLUMNS: Final = (
    "chats",
    "completed",
    "chats/s",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "done p50 ms",
    "done p95 ms",
    "wall s",
    "server CPU ms/chat",
)
PEERS: Final = ("bare", "langgraph")
PEER_NAMES: Final = {"bare": "bare FastAPI + SQLite", "langgraph": "LangGraph Agent Server"}


@dataclass(frozen=True)
class Chat:
    """One chat's timings, whether its stream ended ``completed``, and the answer it streamed."""

    first_token: float
    completed: float
    ok: bool
    answer: str = ""
    error: str = ""
    """Why it did not complete: the exception, the status it ended with, or that the stream closed before its end."""


@dataclass(frozen=True)
class ChatRun:
    """One round of N chats sent at once: how many completed, the wall time and the latency percentiles."""

    chats: int
    ok: int
    wall: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    done_p50_ms: float
    done_p95_ms: float
    cpu_ms_per_chat: float | None = None
    """The server's CPU (its process and its children, user + system) from the round's start until it was idle
    again, per chat: the work the round cost, including what trails it (None: not measured)."""

    @property
    def per_second(self) -> float:
        return self.chats / self.wall


@dataclass(frozen=True)
class ThousandRun:
    """The 1,000-chat round: the round, and how many chats' answers were read back complete and stored."""

    run: ChatRun
    streamed: int
    stored: int
    reasons: tuple[tuple[str, int], ...] = ()
    """Why chats were lost, with how many: see `Chat.error`; "not stored as streamed" for the read-back check."""

    @property
    def lost(self) -> int:
        return self.run.chats - self.stored


def summarize(chats: Sequence[Chat], wall: float, ok: int | None = None) -> ChatRun:
    """A round's figures from its chats (``ok``: how many count as completed; default, those whose stream did)."""
    ttft = [c.first_token * 1000 for c in chats if c.first_token == c.first_token]
    completed = [c.completed * 1000 for c in chats]
    return ChatRun(
        chats=len(chats),
        ok=sum(1 for c in chats if c.ok) if ok is None else ok,
        wall=wall,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p95_ms=percentile(ttft, 95),
        done_p50_ms=percentile(completed, 50),
        done_p95_ms=percentile(completed, 95),
    )


def _lost_chat(started: float, error: BaseException) -> Chat:
    status = re.search(r"HTTP/1\.[01] (\d{3})", str(error)) if isinstance(error, StreamRefused) else None
    why = f"refused with HTTP {status[1]}" if status else type(error).__name__
    return Chat(float("nan"), now() - started, False, error=why)


async def one_chat(
    server: ServerProcess, conversation: str, text: str, gate: asyncio.Event, timeout: float = CHAT_TIMEOUT
) -> Chat:
    """One chat on ``conversation`` once ``gate`` opens (see the module's docstring for what is timed)."""
    await gate.wait()
    started = now()
    first_token = float("nan")
    response_id: str | None = None
    ended: str | None = None
    answer = ""
    body = {"target": {"kind": "harness", "key": "assistant"}, "text": text}
    async with await open_event_stream(
        server.host,
        server.port,
        f"/v1/conversations/{conversation}/messages",
        token=server.token,
        method="POST",
        body=body,
        timeout=timeout,
    ) as stream:
        async with asyncio.timeout(timeout):
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
                op = event.get("op")
                if op in ("append", "set") and block.get("id") == ANSWER_BLOCK:
                    if first_token != first_token:  # NaN: no token yet
                        first_token = now() - started
                    piece = str(block.get("content") or "")
                    answer = answer + piece if op == "append" else piece
                if op == "end":
                    ended = str((data.get("message") or {}).get("status"))
                    break
    ok = ended == "completed"
    error = "" if ok else "stream closed before its end" if ended is None else f"ended {ended}"
    return Chat(first_token, now() - started, ok, answer, error)


async def _guarded(chat: Awaitable[Chat], started: Callable[[], float]) -> Chat:
    """``chat``, or a lost chat when it failed (a refused or broken stream, a timeout): the round goes on."""
    try:
        return await chat
    except (OSError, TimeoutError, ValueError, KeyError, RuntimeError, EOFError) as exc:
        return _lost_chat(started(), exc)


async def _release(chats: Sequence[Awaitable[Chat]], gate: asyncio.Event) -> tuple[list[Chat], float]:
    """Start every chat (each waits for ``gate``), open the gate, and wait for all: the chats and the wall time."""
    t0 = now()
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(_guarded(chat, lambda: t0)) for chat in chats]
        await asyncio.sleep(0.05)
        t0 = now()
        gate.set()
    return [task.result() for task in tasks], now() - t0


async def _chat_round(
    server: ServerProcess, count: int, label: str, *, timeout: float = CHAT_TIMEOUT
) -> tuple[list[str], list[Chat], float]:
    async with Api(server, connections=min(count, 50), timeout=60.0) as api:
        limit = asyncio.Semaphore(50)  # no request waits for a pooled connection (a pool timeout) behind 1,000 others

        async def create(index: int) -> str:
            async with limit:
                return await api.create_conversation(f"{label}-{index}")

        conversations = await asyncio.gather(*(create(i) for i in range(count)))
    gate = asyncio.Event()
    chats = [one_chat(server, c, question(i), gate, timeout) for i, c in enumerate(conversations)]
    done, wall = await _release(chats, gate)
    return conversations, done, wall


def question(index: int) -> str:
    """The question of chat ``index`` of a round (each chat's own: its answer echoes it)."""
    return f"hello number {index}"


async def run_chats(server: ServerProcess, count: int, label: str) -> ChatRun:
    """One round of ``count`` chats at once to a server with loopd's chat routes (loopd, or the bare peer)."""
    _, done, wall = await _chat_round(server, count, label)
    return summarize(done, wall)


# --- the 1,000-chat round: every answer complete and stored ---------------------------------------------------


def stored_answer(messages: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """The status and the ``answer`` block's text of the harness's response among a conversation's messages."""
    for message in messages:
        if message.get("purpose") != "response":
            continue
        blocks = (message.get("content") or {}).get("blocks") or []
        text = next((str(b.get("content") or "") for b in blocks if b.get("id") == ANSWER_BLOCK), "")
        return str(message.get("status")), text
    return None


def answer_kept(chat: Chat, index: int, stored: tuple[str, str] | None) -> bool:
    """Whether chat ``index`` is not lost: its stream ended completed, and the stored answer is completed, is the
    text that was streamed, and answers this chat's own question."""
    if not chat.ok or stored is None:
        return False
    status, text = stored
    return status == "completed" and text == chat.answer and f"“{question(index)}”" in text.split("\n", 1)[0]


async def run_thousand(server: ServerProcess, count: int) -> ThousandRun:
    """``count`` chats at once, then every conversation read back: the round and how many answers were kept."""
    raise_open_files(count + 256)
    conversations, done, wall = await _chat_round(server, count, "thousand", timeout=THOUSAND_TIMEOUT)
    async with Api(server, connections=50, timeout=60.0) as api:
        limit = asyncio.Semaphore(50)

        async def read(conversation: str) -> tuple[str, str] | None:
            async with limit:
                try:
                    page = await api._json("GET", f"/v1/conversations/{conversation}/messages")
                except (httpx.HTTPError, RuntimeError):
                    return None
            return stored_answer(page.get("data") or [])

        stored = await asyncio.gather(*(read(c) for c in conversations))
    reasons: Counter[str] = Counter()
    for index, (chat, answer) in enumerate(zip(done, stored, strict=True)):
        if not answer_kept(chat, index, answer):
            reasons[chat.error or "not stored as streamed"] += 1
    kept = count - sum(reasons.values())
    return ThousandRun(summarize(done, wall, ok=kept), sum(1 for c in done if c.ok), kept, tuple(reasons.most_common()))


# --- the LangGraph Agent Server peer -------------------------------------------------------------------------


async def run_langgraph_chats(host: str, port: int, count: int) -> ChatRun:
    """One round of ``count`` chats at once to LangGraph's Agent Server: a chat completes when it streamed the
    whole answer with no error event."""
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=30.0) as client:

        async def thread() -> str:
            response = await client.post("/threads", json={})
            response.raise_for_status()
            return str(response.json()["thread_id"])

        threads = await asyncio.gather(*(thread() for _ in range(count)))
    gate = asyncio.Event()
    timed = [langgraph_chat(host, port, t, question(i), gate, CHAT_TIMEOUT) for i, t in enumerate(threads)]

    async def as_chat(index: int, chat: Awaitable[Any]) -> Chat:
        got = await chat
        ok = got.errors == 0 and got.text == expected_text(question(index))
        return Chat(got.first_token, got.completed, ok, got.text)

    done, wall = await _release([as_chat(i, c) for i, c in enumerate(timed)], gate)
    return summarize(done, wall)


# --- the run -------------------------------------------------------------------------------------------------

Round = Callable[[int, str], Awaitable[ChatRun]]


@dataclass(frozen=True)
class Target:
    """A server under test: its name in the tables, how to run a round on it, its pid (for profiles)."""

    who: str
    round: Round
    pid: int


def _median(runs: Sequence[ChatRun]) -> ChatRun:
    def med(name: str) -> float:
        return statistics.median(float(getattr(r, name)) for r in runs)

    cpu = [r.cpu_ms_per_chat for r in runs if r.cpu_ms_per_chat is not None]
    return ChatRun(
        chats=runs[0].chats,
        ok=min(r.ok for r in runs),
        wall=med("wall"),
        ttft_p50_ms=med("ttft_p50_ms"),
        ttft_p95_ms=med("ttft_p95_ms"),
        done_p50_ms=med("done_p50_ms"),
        done_p95_ms=med("done_p95_ms"),
        cpu_ms_per_chat=statistics.median(cpu) if cpu else None,
    )


def _row(m: ChatRun, *label: object) -> tuple[object, ...]:
    return (
        *label,
        m.chats,
        f"{m.ok}/{m.chats}",
        m.per_second,
        m.ttft_p50_ms,
        m.ttft_p95_ms,
        m.done_p50_ms,
        m.done_p95_ms,
        m.wall,
        "n/a" if m.cpu_ms_per_chat is None else m.cpu_ms_per_chat,
    )


SETTLE_CPU: Final = 0.1
"""A server has settled when it used less than this share of one core over `SETTLE_STEP`."""
SETTLE_STEP: Final = 0.25
SETTLE_TIMEOUT: Final = 15.0


async def settle(pids: Sequence[int]) -> float:
    """Wait (at most `SETTLE_TIMEOUT`) until the servers ``pids`` are idle — a round's trailing work (loopd's
    conversation titles, a peer's flush) must not fall on the next server's round; the seconds waited."""
    t0 = now()
    before = sum(cpu_seconds(pid) for pid in pids)
    while now() - t0 < SETTLE_TIMEOUT:
        await asyncio.sleep(SETTLE_STEP)
        after = sum(cpu_seconds(pid) for pid in pids)
        if after - before < SETTLE_CPU * SETTLE_STEP:
            break
        before = after
    return now() - t0


async def measure(
    targets: Sequence[Target], sizes: Sequence[int], repeat: int, profile: Path | None
) -> dict[str, dict[int, ChatRun]]:
    """Every target's medians per size; for each size and repetition the targets take turns (loopd first), each
    round starting once every server is idle."""
    runs: dict[str, dict[int, list[ChatRun]]] = {t.who: {} for t in targets}
    pids = [t.pid for t in targets]
    for target in targets:
        await target.round(1, "warmup")
    for size in sizes:
        sampled: list[Path] = []
        for index in range(repeat):
            for target in targets:
                waited = await settle(pids)
                t0 = time.perf_counter()
                cpu0 = tree_cpu_seconds(target.pid)
                spy = profile / f"chats-{size}-{index}.txt" if profile and size > 1 and target.who == "loopd" else None
                if spy is not None:
                    sampled.append(spy)
                with sampling(target.pid, spy, 5.0, summary=False):
                    got = await target.round(size, f"chats-{size}-{index}")
                await settle([target.pid])  # its trailing work (e.g. loopd's conversation titles) counts too
                cpu_ms = (tree_cpu_seconds(target.pid) - cpu0) * 1000 / size
                got = dataclasses.replace(got, cpu_ms_per_chat=cpu_ms)
                runs[target.who].setdefault(size, []).append(got)
                print(
                    f"  {target.who}, {size} chats: {got.per_second:.1f}/s, TTFT p50 {got.ttft_p50_ms:.0f} ms, p95 "
                    f"{got.ttft_p95_ms:.0f} ms, done p50 {got.done_p50_ms:.0f} ms, ok {got.ok}/{size}, "
                    f"server CPU {cpu_ms:.1f} ms/chat ({time.perf_counter() - t0:.1f} s, after {waited:.1f} s "
                    "settling)",
                    flush=True,
                )
        profiled = [path for path in sampled if path.exists()]
        if profiled:  # every repetition's samples together: a round of 100 chats lasts under a second
            print(render(read(profiled), f"loopd, {size} chats, {len(profiled)} round(s) sampled"), flush=True)
    return {who: {size: _median(r) for size, r in by_size.items()} for who, by_size in runs.items()}


def _langgraph(quick: bool) -> tuple[Path | None, str]:
    """The ``langgraph`` CLI for the peer (installed first on a full run when missing), or None and why not."""
    command = langgraph_command()
    if command is not None or quick:
        hint = "python -m benchmarks._langgraph ensure, or set " + LANGGRAPH_ENV
        return command, "" if command else f"LangGraph Agent Server not installed ({hint})"
    print(
        "  installing LangGraph's Agent Server into its own virtualenv (once): python -m benchmarks._langgraph ensure",
        flush=True,
    )
    try:
        return ensure_venv(), ""
    except (OSError, subprocess.SubprocessError) as exc:  # offline, or pip failed
        return None, f"LangGraph Agent Server could not be installed: {exc}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=positive_int, default=100, help="concurrent chats")
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run of 20 chats, no 1,000-chat round")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="sample loopd with py-spy in every burst (DIR/chats-N-I.txt) and print where its CPU went",
    )
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="peers measured in the same run: bare, langgraph (or none)"
    )
    parser.add_argument(
        "--thousand",
        type=count_or_zero,
        default=None,
        help="chats in the lost-chats round (default 1000; 0 skips; quick: 0)",
    )
    parser.add_argument(
        "--paced",
        type=seconds_or_zero,
        default=PACED_DELAY,
        help=f"seconds between the pieces of the paced series' model (default {PACED_DELAY:g}; 0 skips the series)",
    )
    parser.add_argument(
        "--langgraph-jobs",
        type=positive_int,
        default=None,
        help="langgraph dev --n-jobs-per-worker (default: its own, 10)",
    )
    args = parser.parse_args(argv)
    count = 20 if args.quick else args.chats
    repeat = 1 if args.quick else max(1, args.repeat)
    thousand = max(0, args.thousand if args.thousand is not None else 0 if args.quick else 1000)
    peers = [p.strip() for p in args.peers.split(",") if p.strip() and p.strip() != "none"]
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise SystemExit(f"unknown peers {sorted(unknown)}: choose from {', '.join(PEERS)} (or none)")

    notes: list[str] = []
    measured: dict[str, dict[int, ChatRun]] = {}
    kept: ThousandRun | None = None
    paced: dict[int, ChatRun] = {}
    with tempfile.TemporaryDirectory(prefix="loopd-bench-chats-") as directory, contextlib.ExitStack() as stack:
        loopd = stack.enter_context(running_server(Path(directory)))
        targets = [Target("loopd", lambda n, label: run_chats(loopd, n, label), loopd.pid)]
        if "bare" in peers:
            (Path(directory) / "bare").mkdir()
            bare = stack.enter_context(running_bare_server(Path(directory) / "bare"))
            targets.append(Target(PEER_NAMES["bare"], lambda n, label: run_chats(bare, n, label), bare.pid))
        versions: dict[str, str] = {}
        if "langgraph" in peers:
            command, why = _langgraph(args.quick)
            if command is None:
                print(f"  ({why}: its goals print n/a)", flush=True)
                notes.append(why)
            else:
                versions = peer_versions(command)
                (Path(directory) / "langgraph").mkdir()
                graph = running_graph(
                    Path(directory) / "langgraph", command, GRAPH_SOURCE, graph_id=GRAPH_ID, jobs=args.langgraph_jobs
                )
                lg = stack.enter_context(graph)
                targets.append(
                    Target(PEER_NAMES["langgraph"], lambda n, _: run_langgraph_chats(lg.host, lg.port, n), lg.pid)
                )
        measured = asyncio.run(measure(targets, (1, count), repeat, args.profile))
        stack.close()  # the peers stop: the 1,000-chat round has the machine to itself
        if thousand:
            (Path(directory) / "thousand").mkdir()
            with running_server(Path(directory) / "thousand") as server:
                t0 = time.perf_counter()
                kept = asyncio.run(run_thousand(server, thousand))
                print(
                    f"  loopd, {thousand} chats: {kept.stored / kept.run.wall:.1f} kept/s, TTFT p95 "
                    f"{kept.run.ttft_p95_ms:.0f} ms, stored {kept.stored}/{thousand}, lost {kept.lost} "
                    f"{dict(kept.reasons) or ''} ({time.perf_counter() - t0:.1f} s)",
                    flush=True,
                )
        if args.paced:
            paced = asyncio.run(_paced(Path(directory) / "paced", args.paced, count, repeat))
    _print_tables(measured, kept, repeat, versions, args.langgraph_jobs, notes)
    if paced:
        _print_paced(paced, args.paced, repeat)
    print_goals("server_chats", chat_goals(measured, kept))


def _print_tables(
    measured: dict[str, dict[int, ChatRun]],
    kept: ThousandRun | None,
    repeat: int,
    versions: dict[str, str],
    jobs: int | None,
    notes: Sequence[str],
) -> None:
    print_table(
        f"Chats to harness:assistant (demo model), all sent at once (medians of {repeat} run(s))",
        list(COLUMNS),
        [_row(m) for _, m in sorted(measured.get("loopd", {}).items())],
        note="TTFT: POST start → first append/set of the response's 'answer' block on the chat's own SSE response. "
        "done: POST start → the response's end event. 'completed' is the worst run. server CPU: the server "
        "process's (and its children's) user + system CPU from the round's start until it is idle again, per chat "
        "(counted in clock ticks, so a 1-chat row is coarse; the load generator runs in another process). Server "
        "defaults: "
        f"{CAPACITY} concurrent harness calls; the responder is woken by the engine when a call ends or a slot "
        f"frees (its {POLL:g} s poll and {CAPACITY_RETRY:g} s capacity retry are only safety nets).",
    )
    peer_rows = [
        _row(m, who) for who, by_size in measured.items() if who != "loopd" for _, m in sorted(by_size.items())
    ]
    if peer_rows or notes:
        lg = ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))
        print_table(
            f"Chats to the peers, measured the same way, rounds alternating with loopd's (medians of {repeat} run(s))",
            ["server", *COLUMNS],
            peer_rows,
            note="bare FastAPI + SQLite: stores the question and the answer (two transactions) and streams the "
            "same number of pieces, no Task/engine/harness/ledger (benchmarks/_chat_peer_bare.py). Both it and "
            "loopd run SQLite in WAL mode at synchronous=NORMAL (a commit survives a process crash, not a power "
            "loss). LangGraph Agent Server: `langgraph dev --no-browser` "
            f"({lg or 'versions unknown'}; --n-jobs-per-worker {jobs if jobs is not None else 'default, 10'}), a "
            "one-node graph whose zero-latency fake chat model streams the same answer in the same pieces; one chat "
            "= a thread + POST /threads/{id}/runs/stream (stream_mode messages-tuple), TTFT = the first message "
            "chunk with text. LangGraph's dev mode keeps its state IN MEMORY (pickled to disk every 10 s): it "
            "is not durable, loopd is (benchmarks/_chat_peer_langgraph.py)." + "".join(f" {n}." for n in notes),
        )
    if kept is not None:
        m = kept.run
        print_table(
            f"{m.chats:,} concurrent chats to loopd: every answer complete and stored",
            [
                "chats",
                "streamed completed",
                "stored complete",
                "lost",
                "chats/s",
                "TTFT p50 ms",
                "TTFT p95 ms",
                "done p95 ms",
                "wall s",
            ],
            [
                (
                    m.chats,
                    kept.streamed,
                    kept.stored,
                    kept.lost,
                    kept.stored / m.wall,
                    m.ttft_p50_ms,
                    m.ttft_p95_ms,
                    m.done_p95_ms,
                    m.wall,
                )
            ],
            note="One round on a fresh `loopd up`, all chats released at once (each bounded by "
            f"{THOUSAND_TIMEOUT:g} s); chats/s counts the chats kept (stored complete) over the round's wall time. "
            "Afterwards every conversation is read back: a chat is lost unless its stream ended completed and the "
            "stored answer is completed, equals the streamed text and echoes its own question."
            + (" Lost: " + "; ".join(f"{n} {why}" for why, n in kept.reasons) + "." if kept.reasons else ""),
        )


async def _paced(directory: Path, delay: float, count: int, repeat: int) -> dict[int, ChatRun]:
    """The paced series: rounds of ``count`` chats to a fresh `loopd up` whose model streams a piece every ``delay``
    seconds from its own process (the model's CPU is not the server's)."""
    directory.mkdir()
    with running_model_server(directory, chunk_delay=delay) as model:
        env = {"LOOPD_MODEL": PACED_MODEL, "OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "unused"}
        with running_server(directory, env=env) as server:
            target = Target("loopd, paced model", lambda n, label: run_chats(server, n, label), server.pid)
            return (await measure([target], (count,), repeat, None))[target.who]


def _print_paced(paced: dict[int, ChatRun], delay: float, repeat: int) -> None:
    pieces = -(-len(expected_text(question(0))) // PIECE)
    print_table(
        f"Chats to a model streaming at a reader's pace: a {PIECE}-character piece every {delay * 1000:g} ms, from "
        f"its own process over HTTP (medians of {repeat} run(s))",
        list(COLUMNS),
        [_row(m) for _, m in sorted(paced.items())],
        note=f"The demo model served on its own (python -m loopd.harness.models._scripted_server --chunk-delay "
        f"{delay:g}) and a fresh `loopd up` pointed at it (LOOPD_MODEL, OPENAI_BASE_URL), as at any OpenAI-compatible "
        f"provider. An answer is {pieces} pieces: streamed alone it takes ≈ {pieces * delay * 1000:.0f} ms after its "
        "first; done beyond that is time the server added. Every piece arrives on its own, and live text is stored "
        "before anyone sees it: while many calls stream, each call's later text waits up to 100 ms to share one "
        "write (the engine's gather_wait). server CPU: loopd's alone (the model server is another process).",
    )


def chat_goals(measured: dict[str, dict[int, ChatRun]], kept: ThousandRun | None = None) -> dict[str, float | None]:
    """The figures `benchmarks._goals` judges: loopd's at exactly 100 chats, its ratios to the peers' at 100 chats
    (when they ran), and the chats lost in a round of at least 1,000."""
    hundred = measured.get("loopd", {}).get(100)
    floor = measured.get(PEER_NAMES["bare"], {}).get(100)
    langgraph = measured.get(PEER_NAMES["langgraph"], {}).get(100)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def rate(run: ChatRun | None) -> float | None:
        return run.per_second if run else None

    def ttft(run: ChatRun | None) -> float | None:
        return run.ttft_p95_ms if run else None

    return {
        "chats_per_s": rate(hundred),
        "ttft_p95_ms": ttft(hundred),
        "lost_1000": float(kept.lost) if kept is not None and kept.run.chats >= 1000 else None,
        "x_langgraph_rate": ratio(rate(hundred), rate(langgraph)),
        "x_langgraph_ttft": ratio(ttft(hundred), ttft(langgraph)),
        "x_bare_rate": ratio(rate(hundred), rate(floor)),
    }


if __name__ == "__main__":
    run_main(main)
