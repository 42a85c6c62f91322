"""What a streamed model reply costs the process that reads it, per piece of text: the OpenAI-compatible adapter over
``httpx2``'s own transport (the SDK's default client) against loopd's default client (aiohttp under ``httpx2``'s
API, `loopd.harness.models._http`), side by side in one run.

python -m benchmarks._model_reads [--pairs 6] [--streams 100] [--delay 0.02]

The demo model is served on its own (`benchmarks._server.running_model_server`: the scripted server in another
process on loopback, a 12-character piece every ``--delay`` seconds, the answer in ≈ 29 pieces). Each round opens
``--streams`` concurrent calls through one adapter (`OpenAICompatibleModel` with the client under test, the event
loop loopd runs: uvloop) and reads every reply to its end; the CPU of this process during the round, divided by the
text pieces the adapter yielded, is the figure. Rounds alternate between the two clients, the order flipping every
pair, so the machine's drift weighs on both; the per-pair ratio (loopd's ÷ httpx2's) is what to quote. Prints a
table; makes no timed assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx2
import openai
import uvloop

from benchmarks._common import positive_int, print_table, seconds_or_zero
from benchmarks._server import running_model_server
from loopd.harness.core import Message
from loopd.harness.models._http import default_http_client
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.harness.models._protocol import ModelRequest, TextDelta

TIMEOUT: Final = 60.0
CLIENTS: Final[tuple[tuple[str, Callable[[], httpx2.AsyncClient]], ...]] = (
    ("httpx2 (the SDK's default client)", lambda: openai.DefaultAsyncHttpxClient(timeout=TIMEOUT)),
    ("loopd's default client (aiohttp)", lambda: default_http_client(TIMEOUT)),
)


@dataclass(frozen=True)
class Round:
    """One round of one client: text pieces read, this process's CPU seconds, wall seconds."""

    pieces: int
    cpu: float
    wall: float

    @property
    def us_per_piece(self) -> float:
        return self.cpu * 1e6 / max(self.pieces, 1)


async def _round(base_url: str, make: Callable[[], httpx2.AsyncClient], streams: int) -> Round:
    adapter = OpenAICompatibleModel("gpt-4o-mini", base_url=base_url, api_key="unused", http_client=make())
    request = ModelRequest(model="", messages=(Message(role="user", content="hello"),))

    async def read() -> int:
        return sum([isinstance(chunk, TextDelta) async for chunk in adapter.stream(request)])

    try:
        await asyncio.gather(*(read() for _ in range(min(streams, 4))))  # connections and encoders warmed
        cpu, wall = time.process_time(), time.perf_counter()
        counts = await asyncio.gather(*(read() for _ in range(streams)))
        return Round(sum(counts), time.process_time() - cpu, time.perf_counter() - wall)
    finally:
        await adapter.aclose()


def run(base_url: str, pairs: int, streams: int) -> list[tuple[Round, Round]]:
    """``pairs`` pairs of rounds, (httpx2's, loopd's) each, the order flipping every pair."""
    out: list[tuple[Round, Round]] = []
    for pair in range(pairs):
        order = (0, 1) if pair % 2 == 0 else (1, 0)
        rounds: dict[int, Round] = {}
        for index in order:
            rounds[index] = uvloop.run(_round(base_url, CLIENTS[index][1], streams))
        out.append((rounds[0], rounds[1]))
    return out


def report(pairs: Sequence[tuple[Round, Round]], streams: int, delay: float) -> None:
    rows: list[list[object]] = []
    for index, (name, _) in enumerate(CLIENTS):
        rounds = [pair[index] for pair in pairs]
        rows.append(
            [
                name,
                statistics.median(r.pieces for r in rounds),
                statistics.median(r.us_per_piece for r in rounds),
                statistics.median(r.wall for r in rounds),
            ]
        )
    ratios = [head.us_per_piece / base.us_per_piece for base, head in pairs]
    rows.append(["ratio (loopd's ÷ httpx2's), median of pairs", "", statistics.median(ratios), ""])
    print_table(
        f"A streamed reply read by the OpenAI-compatible adapter: {streams} concurrent calls, a piece every "
        f"{delay:g} s (medians of {len(pairs)} pairs of rounds)",
        ["client", "text pieces per round", "CPU µs per piece", "wall s"],
        rows,
        "CPU: this process's (the reader's) only; the model server is another process. Per-pair ratios: "
        + " ".join(f"{r:.3f}" for r in ratios),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks._model_reads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pairs", type=positive_int, default=6, help="pairs of rounds (default 6)")
    parser.add_argument("--streams", type=positive_int, default=100, help="concurrent calls per round (default 100)")
    parser.add_argument(
        "--delay", type=seconds_or_zero, default=0.02, help="seconds between two pieces of a reply (default 0.02)"
    )
    args = parser.parse_args(argv)
    report(run_served(args.pairs, args.streams, args.delay), args.streams, args.delay)


def run_served(pairs: int, streams: int, delay: float) -> list[tuple[Round, Round]]:
    """`run` against the demo model served on its own, streaming a piece every ``delay`` seconds."""
    with tempfile.TemporaryDirectory() as directory, running_model_server(Path(directory), chunk_delay=delay) as model:
        return run(model.base_url, pairs, streams)


if __name__ == "__main__":
    main()
