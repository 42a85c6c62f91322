"""What a streamed model reply costs the process that reads it, per piece of text: a model adapter over ``httpx2``'s
own transport (its SDK's default client) against loopd's default client (aiohttp under ``httpx2``'s API,
`loopd.harness.models._http`), side by side in one run.

python -m benchmarks._model_reads [--provider openai|anthropic] [--pairs 6] [--streams 100] [--delay 0.02]

The model is served on its own, in another process on loopback, a 12-character piece every ``--delay`` seconds:
``openai``, loopd's demo model (`benchmarks._server.running_model_server`, ≈ 29 pieces an answer) read by
`OpenAICompatibleModel`; ``anthropic``, the scripted Messages API server streaming an answer of the same length
(`running_anthropic_model`) read by `AnthropicModel`. Each round opens ``--streams`` concurrent calls through one
adapter with the client under test (on uvloop, loopd's event loop) and reads every reply to its end; this process's
CPU during the round, divided by the text pieces the adapter yielded, is the figure. Rounds alternate between the
two clients, the order flipping every pair, so the machine's drift weighs on both; the per-pair ratio (loopd's ÷
httpx2's) is what to quote. Run at two commits, the same command compares the adapters' own code. Prints a table;
makes no timed assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import anthropic
import httpx2
import openai
import uvloop

from benchmarks._children import run_main, spawn
from benchmarks._common import positive_int, print_table, seconds_or_zero
from benchmarks._server import running_model_server
from loopd.harness.core import Message
from loopd.harness.models._anthropic import AnthropicModel
from loopd.harness.models._fallback import ProviderModel
from loopd.harness.models._http import default_http_client
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.harness.models._protocol import ModelRequest, TextDelta

Provider = Literal["openai", "anthropic"]
ADAPTERS: Final = {"openai": "OpenAI-compatible adapter", "anthropic": "Anthropic adapter"}
TIMEOUT: Final = 60.0
START_TIMEOUT: Final = 30.0
CLIENT_NAMES: Final = ("httpx2 (the SDK's default client)", "loopd's default client (aiohttp)")
ANSWER: Final = "You said: hello. " + "This answer streams in pieces, as a provider sends them. " * 6
"""The Anthropic server's answer: about as long as the demo model's (≈ 29 pieces of 12 characters)."""
_ANTHROPIC_SERVER: Final = """
import asyncio, sys
from loopd.harness.models._anthropic_server import open_anthropic_server
from loopd.harness.models._scripted_server import ServerReply

async def main() -> None:
    reply = ServerReply(text=sys.argv[2], chunk_size=12, chunk_delay=float(sys.argv[1]))
    async with open_anthropic_server(lambda request: reply) as url:
        print("serving on " + url, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def clients(provider: Provider) -> tuple[Callable[[], httpx2.AsyncClient], Callable[[], httpx2.AsyncClient]]:
    """(its SDK's default client, loopd's default client) for ``provider``'s adapter."""
    if provider == "anthropic":
        return lambda: anthropic.DefaultAsyncHttpxClient(timeout=TIMEOUT), lambda: default_http_client(
            TIMEOUT, "anthropic"
        )
    return lambda: openai.DefaultAsyncHttpxClient(timeout=TIMEOUT), lambda: default_http_client(TIMEOUT)


def adapter(provider: Provider, base_url: str, client: httpx2.AsyncClient) -> ProviderModel:
    if provider == "anthropic":
        return AnthropicModel("claude-bench", api_key="unused", base_url=base_url, http_client=client)
    return OpenAICompatibleModel("gpt-4o-mini", base_url=base_url, api_key="unused", http_client=client)


@contextlib.contextmanager
def running_anthropic_model(directory: Path, *, chunk_delay: float) -> Iterator[str]:
    """The scripted Messages API server in its own process on loopback, streaming `ANSWER` a 12-character piece
    every ``chunk_delay`` seconds; its base URL. Stopped on exit."""
    log_path = directory / "anthropic.log"
    with log_path.open("wb") as log:
        command = [sys.executable, "-c", _ANTHROPIC_SERVER, f"{chunk_delay:g}", ANSWER]
        child = spawn(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not (found := re.search(r"serving on (http://\S+)", log_path.read_text(errors="replace"))):
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Anthropic server did not start:\n{log_path.read_text(errors='replace')}")
                time.sleep(0.05)
            yield found.group(1)
        finally:
            child.terminate()
            try:
                child.wait(10.0)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@dataclass(frozen=True)
class Round:
    """One round of one client: text pieces read, this process's CPU seconds, wall seconds."""

    pieces: int
    cpu: float
    wall: float

    @property
    def us_per_piece(self) -> float:
        return self.cpu * 1e6 / max(self.pieces, 1)


async def _round(provider: Provider, base_url: str, make: Callable[[], httpx2.AsyncClient], streams: int) -> Round:
    model = adapter(provider, base_url, make())
    request = ModelRequest(model="", messages=(Message(role="user", content="hello"),))

    async def read() -> int:
        return sum([isinstance(chunk, TextDelta) async for chunk in model.stream(request)])

    try:
        await asyncio.gather(*(read() for _ in range(min(streams, 4))))  # connections and encoders warmed
        cpu, wall = time.process_time(), time.perf_counter()
        counts = await asyncio.gather(*(read() for _ in range(streams)))
        return Round(sum(counts), time.process_time() - cpu, time.perf_counter() - wall)
    finally:
        await model.aclose()


def run(provider: Provider, base_url: str, pairs: int, streams: int) -> list[tuple[Round, Round]]:
    """``pairs`` pairs of rounds, (httpx2's, loopd's) each, the order flipping every pair."""
    makers = clients(provider)
    out: list[tuple[Round, Round]] = []
    for pair in range(pairs):
        order = (0, 1) if pair % 2 == 0 else (1, 0)
        rounds: dict[int, Round] = {}
        for index in order:
            rounds[index] = uvloop.run(_round(provider, base_url, makers[index], streams))
        out.append((rounds[0], rounds[1]))
    return out


def report(provider: Provider, pairs: Sequence[tuple[Round, Round]], streams: int, delay: float) -> None:
    rows: list[list[object]] = []
    for index, name in enumerate(CLIENT_NAMES):
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
        f"A streamed reply read by the {ADAPTERS[provider]}: {streams} concurrent calls, a piece every "
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
    parser.add_argument(
        "--provider", choices=("openai", "anthropic"), default="openai", help="whose adapter reads (default openai)"
    )
    parser.add_argument("--pairs", type=positive_int, default=6, help="pairs of rounds (default 6)")
    parser.add_argument("--streams", type=positive_int, default=100, help="concurrent calls per round (default 100)")
    parser.add_argument(
        "--delay", type=seconds_or_zero, default=0.02, help="seconds between two pieces of a reply (default 0.02)"
    )
    args = parser.parse_args(argv)
    report(args.provider, run_served(args.provider, args.pairs, args.streams, args.delay), args.streams, args.delay)


def run_served(provider: Provider, pairs: int, streams: int, delay: float) -> list[tuple[Round, Round]]:
    """`run` against ``provider``'s model served on its own, streaming a piece every ``delay`` seconds."""
    with tempfile.TemporaryDirectory() as directory:
        if provider == "anthropic":
            with running_anthropic_model(Path(directory), chunk_delay=delay) as base_url:
                return run(provider, base_url, pairs, streams)
        with running_model_server(Path(directory), chunk_delay=delay) as served:
            return run(provider, served.base_url, pairs, streams)


if __name__ == "__main__":
    run_main(main)
