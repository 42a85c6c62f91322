"""Reconcile start in the embedded server: chat POST → the harness responder's ``reconcile`` called for its Task.

In-process: the whole composition of `loopd up` (`open_loop_server`) runs in this process with its
`HarnessResponder` replaced, for this benchmark only, by a subclass that notes when ``reconcile`` first runs for
each Task and when the first reconcile that got past the commit window and the capacity check ran ("effective":
its result is neither the context-retry nor the capacity-retry requeue). Chats are sent over HTTP on 127.0.0.1
(httpx, same process) to ``harness:assistant`` (demo model), each in its own conversation:

- ``sequential``: one chat at a time, ``--gap`` seconds apart (the chats' own completions run in between);
- ``burst``: ``--burst`` chats at once.

Reported: POST start → first reconcile and → effective reconcile (p50 / p99 / max), how many first reconciles
hit the commit window (the Task is created inside the chat's transaction, so a reconcile can run before the
question has committed) and POST start → POST returned, for reference.

python -m benchmarks.server_reconcile [--count N] [--burst N] [--gap S] [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from unittest import mock

import httpx

import loopd.server._composition as composition
from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table, verdict
from benchmarks._server import now, percentile
from loopd.harness.models import ModelConfig
from loopd.resources.reconcile import Request, Result
from loopd.server._composition import UpSettings, open_loop_server
from loopd.server.responder import HarnessResponder

GOAL_P50_MS: Final = 10.0
WAIT: Final = 30.0
_DEFAULTS = inspect.signature(HarnessResponder.__init__).parameters
CONTEXT_RETRY: Final[float] = _DEFAULTS["context_retry"].default
CAPACITY_RETRY: Final[float] = _DEFAULTS["capacity_retry"].default


@dataclass
class Reconciles:
    """When reconcile first ran for each Task, and when the first effective reconcile ran."""

    first: dict[str, float] = field(default_factory=dict)
    effective: dict[str, float] = field(default_factory=dict)
    commit_window: set[str] = field(default_factory=set)
    took: dict[str, float] = field(default_factory=dict)
    """How long the effective reconcile ran (it starts the harness call)."""
    arrived: dict[str, asyncio.Event] = field(default_factory=dict)

    def event(self, name: str) -> asyncio.Event:
        return self.arrived.setdefault(name, asyncio.Event())

    def responder_class(self) -> type[HarnessResponder]:
        seen = self

        class RecordingResponder(HarnessResponder):
            async def reconcile(self, request: Request) -> Result:
                started = now()
                first = request.name not in seen.first
                seen.first.setdefault(request.name, started)
                result = await super().reconcile(request)
                if first and result.requeue_after == CONTEXT_RETRY:
                    seen.commit_window.add(request.name)
                if result.requeue_after not in (CONTEXT_RETRY, CAPACITY_RETRY) and request.name not in seen.effective:
                    seen.effective[request.name] = started
                    seen.took[request.name] = now() - started
                    seen.event(request.name).set()
                return result

        return RecordingResponder


@dataclass(frozen=True)
class Sample:
    task_id: str
    posted: float
    returned: float


@dataclass(frozen=True)
class Row:
    mode: str
    n: int
    first_p50: float
    first_p99: float
    first_max: float
    effective_p50: float
    effective_p99: float
    commit_window: int
    took_p50: float
    post_p50: float


async def chat(client: httpx.AsyncClient, conversation: str, text: str) -> Sample:
    body = {"target": {"kind": "harness", "key": "assistant"}, "text": text}
    posted = now()
    response = await client.post(f"/v1/conversations/{conversation}/messages", json=body)
    returned = now()
    if response.status_code != 201:
        raise RuntimeError(f"chat POST: {response.status_code} {response.text[:300]}")
    return Sample(str(response.json()["task_id"]), posted, returned)


def summarize(mode: str, samples: Sequence[Sample], seen: Reconciles) -> Row:
    first = [(seen.first[s.task_id] - s.posted) * 1000 for s in samples]
    effective = [(seen.effective[s.task_id] - s.posted) * 1000 for s in samples]
    return Row(
        mode=mode,
        n=len(samples),
        first_p50=percentile(first, 50),
        first_p99=percentile(first, 99),
        first_max=max(first),
        effective_p50=percentile(effective, 50),
        effective_p99=percentile(effective, 99),
        commit_window=sum(1 for s in samples if s.task_id in seen.commit_window),
        took_p50=percentile([seen.took[s.task_id] * 1000 for s in samples], 50),
        post_p50=percentile([(s.returned - s.posted) * 1000 for s in samples], 50),
    )


async def measure(count: int, burst: int, gap: float, profile: Path | None = None) -> list[Row]:
    seen = Reconciles()
    with tempfile.TemporaryDirectory(prefix="loopd-bench-reconcile-") as directory:
        settings = UpSettings(data_dir=Path(directory) / "data", port=0, model=ModelConfig())
        with mock.patch.object(composition, "HarnessResponder", seen.responder_class()):
            async with open_loop_server(settings) as server:
                token = server.token_file.read_text().strip()
                headers = {"Authorization": f"Bearer {token}"}
                limits = httpx.Limits(max_connections=max(burst, 10))
                async with httpx.AsyncClient(
                    base_url=server.url, headers=headers, timeout=WAIT, limits=limits
                ) as client:

                    async def conversations(n: int, label: str) -> list[str]:
                        made = [await client.post("/v1/conversations", json={"name": f"{label}-{i}"}) for i in range(n)]
                        return [str(r.json()["id"]) for r in made]

                    async def settled(samples: Sequence[Sample]) -> None:
                        async with asyncio.timeout(WAIT):
                            for s in samples:
                                await seen.event(s.task_id).wait()

                    warm = await conversations(3, "warm")
                    await settled([await chat(client, c, "warm up") for c in warm])

                    rows: list[Row] = []
                    sequential: list[Sample] = []
                    for index, conversation in enumerate(await conversations(count, "seq")):
                        sequential.append(await chat(client, conversation, f"hello {index}"))
                        await settled(sequential[-1:])
                        await asyncio.sleep(gap)
                    rows.append(summarize("sequential", sequential, seen))

                    await asyncio.sleep(1.5)  # let the sequential chats finish
                    targets = await conversations(burst, "burst")
                    with profiling(profile):
                        together = await asyncio.gather(*(chat(client, c, f"burst {i}") for i, c in enumerate(targets)))
                        await settled(together)
                    rows.append(summarize(f"burst of {burst}", together, seen))
    return rows


@contextlib.contextmanager
def profiling(out: Path | None) -> Iterator[None]:
    """pyinstrument over the block (this process, the event-loop thread), its text report written to ``out``."""
    if out is None:
        yield
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    with profiler:
        yield
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profiler.output_text(unicode=True, color=False, show_all=False))
    print(f"  profile of the burst: {out}", flush=True)


def _median_rows(runs: Sequence[Sequence[Row]]) -> list[Row]:
    merged: list[Row] = []
    for group in zip(*runs, strict=True):

        def med(name: str, rows: Sequence[Row] = group) -> Any:
            return statistics.median(getattr(r, name) for r in rows)

        merged.append(
            Row(
                mode=group[0].mode,
                n=group[0].n,
                first_p50=med("first_p50"),
                first_p99=med("first_p99"),
                first_max=med("first_max"),
                effective_p50=med("effective_p50"),
                effective_p99=med("effective_p99"),
                commit_window=max(r.commit_window for r in group),
                took_p50=med("took_p50"),
                post_p50=med("post_p50"),
            )
        )
    return merged


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=positive_int, default=100, help="chats sent one at a time")
    parser.add_argument("--burst", type=positive_int, default=50, help="chats sent at once")
    parser.add_argument("--gap", type=float, default=0.05, help="pause between sequential chats (s)")
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run, 20 sequential, burst of 20")
    parser.add_argument("--profile", type=Path, default=None, help="pyinstrument the first run's burst into this file")
    args = parser.parse_args(argv)
    count, burst = (20, 20) if args.quick else (args.count, args.burst)
    repeat = 1 if args.quick else max(1, args.repeat)
    runs = [asyncio.run(measure(count, burst, args.gap, args.profile if i == 0 else None)) for i in range(repeat)]
    rows = _median_rows(runs)
    print_table(
        f"Reconcile start, embedded server: chat POST → HarnessResponder.reconcile (medians of {repeat} run(s))",
        [
            "mode",
            "n",
            "first p50 ms",
            "first p99 ms",
            "first max ms",
            "effective p50 ms",
            "effective p99 ms",
            "first hit commit window",
            "reconcile runs p50 ms",
            "POST p50 ms",
            f"goal p50 < {GOAL_P50_MS:g} ms",
        ],
        [
            (
                r.mode,
                r.n,
                r.first_p50,
                r.first_p99,
                r.first_max,
                r.effective_p50,
                r.effective_p99,
                r.commit_window,
                r.took_p50,
                r.post_p50,
                verdict(r.first_p50 < GOAL_P50_MS) if r.mode == "sequential" else "n/a",
            )
            for r in rows
        ],
        note="first: POST start → first reconcile call for the Task. effective: → the first reconcile that went "
        f"past the commit window (requeue {CONTEXT_RETRY:g} s) and the capacity check (requeue {CAPACITY_RETRY:g} s). "
        "reconcile runs: how long that effective reconcile took (it starts the harness call). "
        "POST: POST start → 201 received. Client and server share one event loop.",
    )


if __name__ == "__main__":
    run_main(main)
