"""Where a profiled server's CPU went: py-spy's collapsed stacks (``--format raw``) by stage of a chat and by kind of
work, idle threads left out.

python -m benchmarks._stacks FILE [FILE ...]        (e.g. the ``chats-100.txt`` of ``server_chats --profile DIR``)

py-spy samples every thread, and a thread blocked in C (a lane thread waiting for its next statement, a pool
worker waiting for a job) shows up as a sample of its loop function: those are counted apart as idle, so the shares
are of the samples where the server did something. A sample's **stage** is the first frame, from the stack's root,
that belongs to one of `STAGES` (a chat's request, the responder's reconcile, the engine's drive, the harness's
session actors, the in-process model server, the answer streams, the deferred cleanup); one that matches none is
the event loop's own work when its leaf is the loop, else ``other``; a stack that does not start at a script's or a
thread's root was cut short by the sampler (``--nonblocking``) and is left unattributed. Its **kind** is its leaf
frame's: SQLite's C code (a statement, a ``COMMIT``, a checkpoint: the leaf is the call site in a SQLite module),
JSON, the event loop and asyncio, the HTTP stack, pydantic and the ``openai`` client, metrics and tracing, loopd's
Python, the rest (the standard library's Python and generated code such as dataclass ``__init__``).

A profile is taken from a sampled run (slower than an unprofiled one): quote its shares, never its timings.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

STAGES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("HTTP requests (middleware, routes, the ask)", ("RequestResponseCycle.", "HttpToolsProtocol.")),
    ("responder (Task reconcile: admission, completion)", ("Controller.", "HarnessResponder.", "Informer.")),
    ("engine drive (harness updates → messages, ledger)", ("Drive.", "CallDriver.", "BuiltinRun.")),
    ("harness (session actors, journal, model client)", ("LoopActor.", "HustleLanes.", "SqliteJournal.")),
    ("model server (in-process, OpenAI-compatible)", ("StreamingAsgiTransport.",)),
    ("answer streams (feeds, SSE out)", ("EventStreamResponse.", "_Feed.", "Subscription.")),
    ("deferred cleanup (Task delete, closed mark)", ("TaskApi.run_cleanup",)),
)
"""A chat's stages and the function-name prefixes that start them (the first match from a stack's root wins)."""
THREADS: Final = "worker threads (SQLite lanes: checkpoints, queued statements)"
PARTIAL: Final = "unattributed (a partial stack: sampled without pausing the process)"
ROOTS: Final = ("<module> ", "Thread._bootstrap ", "_bootstrap ")
"""How a whole stack starts (a script's or a thread's first frame); py-spy ``--nonblocking`` may cut a stack short."""
LOOP: Final = "event loop itself (uvloop, callbacks)"
OTHER: Final = "other"

IDLE_LEAVES: Final = ("_worker ", "_LaneThread._run ", "Thread.wait ", "Condition.wait ", "SimpleQueue.get ")
"""Leaf frames of a thread blocked in C, waiting for work: idle, not CPU."""
LOOP_LEAVES: Final = ("Runner.run ", "run_until_complete ", "run_forever ")

_FRAME: Final = re.compile(r"^(?P<function>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


@dataclass(frozen=True)
class Breakdown:
    """Samples by stage and by kind (busy samples only), and how many were idle."""

    busy: int
    idle: int
    stages: Counter[str]
    kinds: Counter[str]

    def shares(self, table: Counter[str]) -> list[tuple[str, float]]:
        """``table``'s entries with their share of the busy samples, largest first."""
        return [(name, count / self.busy) for name, count in table.most_common()] if self.busy else []


def _split(frame: str) -> tuple[str, str]:
    """A raw frame's function and file (``"Drive.run (loopd/server/engine/_driving.py:12)"``)."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip(), ""
    return match["function"], match["file"]


def is_idle(frames: Sequence[str]) -> bool:
    """Whether a stack (root first) is a thread blocked waiting for work."""
    return bool(frames) and frames[0].startswith("Thread._bootstrap ") and frames[-1].startswith(IDLE_LEAVES)


def stacks(lines: Iterable[str]) -> Iterator[tuple[list[str], int]]:
    """The stacks of collapsed-stack ``lines`` (``frame;frame;… count``), root first, with their sample counts; lines
    that are not one are skipped."""
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def _stage(frames: Sequence[str]) -> str:
    if not frames or not frames[0].startswith(ROOTS):
        return PARTIAL
    for frame in frames:
        function = _split(frame)[0]
        for stage, prefixes in STAGES:
            if function.startswith(prefixes):
                return stage
    if frames[0].startswith("Thread._bootstrap "):
        return THREADS
    return LOOP if frames[-1].startswith(LOOP_LEAVES) else OTHER


def kind_of(leaf: str) -> str:
    """The kind of work of a stack whose leaf frame is ``leaf``."""
    function, file = _split(leaf)
    top = file.split("/", 1)[0]
    if file.endswith(("sqlite.py", "_sqlite.py")) and ("<lambda>" in function or "<locals>" in function):
        return "SQLite (statements, commits, checkpoints)"
    if top == "sqlite3":
        return "SQLite (statements, commits, checkpoints)"
    if file.endswith("jsontext.py") or top == "json" or top in ("msgspec", "orjson"):
        return "JSON"
    if top in ("asyncio", "uvloop") or leaf.startswith(LOOP_LEAVES):
        return "event loop and asyncio"
    if top in ("uvicorn", "starlette", "fastapi", "httptools", "h11", "httpx", "httpcore", "anyio", "email"):
        return "HTTP stack (uvicorn, Starlette, FastAPI, httpx)"
    if top in ("pydantic", "pydantic_core", "openai"):
        return "pydantic and the openai client"
    if top in ("prometheus_client", "opentelemetry"):
        return "metrics and tracing"
    if top == "loopd":
        return "loopd Python"
    return "standard library and generated code (dataclasses, contextlib, uuid…)"


def breakdown(lines: Iterable[str]) -> Breakdown:
    """Tally collapsed-stack ``lines`` (``frame;frame;… count``)."""
    stages: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    busy = idle = 0
    for frames, samples in stacks(lines):
        if is_idle(frames):
            idle += samples
            continue
        busy += samples
        stages[_stage(frames)] += samples
        kinds[kind_of(frames[-1])] += samples
    return Breakdown(busy, idle, stages, kinds)


def read(paths: Sequence[Path]) -> Breakdown:
    """The breakdown of every stack in ``paths`` together."""
    lines: list[str] = []
    for path in paths:
        lines += path.read_text().splitlines()
    return breakdown(lines)


def render(found: Breakdown, source: str) -> str:
    """``found`` as two ranked lists (stage, kind) of shares of the busy samples."""
    if not found.busy:
        return f"{source}: no busy samples"
    lines = [f"where the CPU went — {source}: {found.busy} busy samples ({found.idle} idle thread samples left out)"]
    for title, table in (("by stage", found.stages), ("by kind of work", found.kinds)):
        lines.append(f" {title}:")
        lines += [f"  {share:6.1%}  {name}" for name, share in found.shares(table)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="py-spy collapsed stacks (record --format raw)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"no such profile: {', '.join(missing)} (record one with `server_chats --profile DIR`)")
    print(render(read(args.files), ", ".join(str(p) for p in args.files)))


if __name__ == "__main__":
    main()
