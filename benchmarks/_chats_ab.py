"""Like for like between two source trees: two `loopd up` side by side, rounds of chats alternating between them.

python -m benchmarks._chats_ab --base DIR [--head DIR] [--pairs N] [--chats N] [--paced SECONDS]

``--base`` and ``--head`` are source trees of loopd (a checkout or ``git worktree add --detach DIR REV``; ``--head``
defaults to this repository). Each server runs its tree's code (``PYTHONPATH=DIR/src:DIR``), both are warmed up, then
each pair runs one round of ``--chats`` concurrent chats (`benchmarks.server_chats`'s round: the demo model, all sent
at once) on each server, the order flipping from pair to pair. Because both rounds of a pair run within seconds of
each other, a machine whose pace drifts over minutes (a shared VM: ±20 % within an hour here) weighs on both alike:
the per-pair ratios (head ÷ base) are what to quote, with their median. Server CPU is the server process tree's CPU
time from the round's start until it is idle again, per chat. ``--paced SECONDS``: both servers ask one demo model
served on its own, a piece every SECONDS (`benchmarks.server_chats`' paced series), instead of each its built-in
zero-latency one. Prints a table per pair and the medians; makes no timed assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from benchmarks._children import run_main
from benchmarks._common import print_table, seconds_or_zero
from benchmarks._server import ServerProcess, running_model_server, running_server, tree_cpu_seconds
from benchmarks.server_chats import PACED_MODEL, _chat_round, run_chats, settle, summarize

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Round:
    per_second: float
    ttft_p95_ms: float
    cpu_ms: float
    ok: int


async def _round(server: ServerProcess, chats: int, label: str) -> Round:
    await settle([server.pid])
    cpu = tree_cpu_seconds(server.pid)
    _, done, wall = await _chat_round(server, chats, label)
    got = summarize(done, wall)
    await settle([server.pid])
    return Round(got.per_second, got.ttft_p95_ms, (tree_cpu_seconds(server.pid) - cpu) * 1000 / chats, got.ok)


async def _pairs(base: ServerProcess, head: ServerProcess, pairs: int, chats: int) -> list[tuple[Round, Round]]:
    for server in (base, head):
        await run_chats(server, 1, "warm")
        await run_chats(server, chats, "warm-round")
    out: list[tuple[Round, Round]] = []
    for index in range(pairs):
        if index % 2 == 0:
            b = await _round(base, chats, f"base-{index}")
            h = await _round(head, chats, f"head-{index}")
        else:
            h = await _round(head, chats, f"head-{index}")
            b = await _round(base, chats, f"base-{index}")
        out.append((b, h))
        print(f"  pair {index + 1}: base {_line(b)} | head {_line(h)}", flush=True)
    return out


def _line(result: Round) -> str:
    return f"{result.per_second:.1f}/s, {result.cpu_ms:.2f} ms CPU/chat, TTFT p95 {result.ttft_p95_ms:.0f} ms"


def _tree(value: str) -> Path:
    path = Path(value).expanduser().resolve()
    if not (path / "src" / "loopd" / "__init__.py").is_file() or not (path / "benchmarks").is_dir():
        raise argparse.ArgumentTypeError(
            f"{value} is not a loopd source tree (no src/loopd or benchmarks/ in it); "
            "make one with: git worktree add --detach DIR REV"
        )
    return path


def report(pairs: Sequence[tuple[Round, Round]], chats: int, base: Path, head: Path) -> None:
    figures: list[tuple[str, Callable[[Round], float]]] = [
        ("chats/s", lambda r: r.per_second),
        ("server CPU ms/chat", lambda r: r.cpu_ms),
        ("TTFT p95 ms", lambda r: r.ttft_p95_ms),
    ]
    rows: list[list[object]] = []
    for name, pick in figures:
        b = median(pick(p[0]) for p in pairs)
        h = median(pick(p[1]) for p in pairs)
        ratios = [pick(p[1]) / pick(p[0]) for p in pairs]
        rows.append([name, f"{b:,.2f}", f"{h:,.2f}", f"{median(ratios):.3f}", " ".join(f"{r:.3f}" for r in ratios)])
    completed = sum(p[0].ok + p[1].ok for p in pairs)
    print_table(
        f"chats, base vs head, {len(pairs)} pairs of rounds (medians; ratios head ÷ base per pair)",
        ["figure", "base", "head", "median ratio", "ratio per pair"],
        rows,
        note=f"base: {base}; head: {head}; {completed} of {2 * len(pairs) * chats} chats completed",
    )


def comparison_arguments(
    argv: Sequence[str] | None,
    description: str | None,
    *,
    repeat: tuple[str, int, str],
    chats: tuple[int, str],
    paced: bool = False,
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The arguments of a comparison of two source trees: ``--base`` (required), ``--head`` (default: this
    repository), how often to repeat (``repeat``: option name, default, help) and ``--chats`` (default, help); with
    ``paced``, ``--paced SECONDS`` too (0: the built-in demo model)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=_tree, required=True, help="the source tree to compare against")
    parser.add_argument("--head", type=_tree, default=ROOT, help="the source tree measured (default: this one)")
    name, default, text = repeat
    parser.add_argument(f"--{name}", type=int, default=default, help=text)
    parser.add_argument("--chats", type=int, default=chats[0], help=chats[1])
    if paced:
        parser.add_argument(
            "--paced",
            type=seconds_or_zero,
            default=0.0,
            help="both servers ask one demo model served on its own, streaming a piece every this many seconds "
            "(server_chats' paced series; default 0: each its built-in zero-latency demo model)",
        )
    args = parser.parse_args(argv)
    if getattr(args, name) < 1 or args.chats < 1:
        parser.error(f"--{name} and --chats must be at least 1")
    return parser, args


def main(argv: Sequence[str] | None = None) -> None:
    _, args = comparison_arguments(
        argv,
        __doc__,
        repeat=("pairs", 8, "pairs of rounds (default 8)"),
        chats=(100, "concurrent chats per round (default 100)"),
        paced=True,
    )
    saved = os.environ.get("PYTHONPATH")
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        if args.paced:
            model = stack.enter_context(running_model_server(Path(directory), chunk_delay=args.paced))
            env = {"LOOPD_MODEL": PACED_MODEL, "OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "unused"}
        servers: list[ServerProcess] = []
        for name, tree in (("base", args.base), ("head", args.head)):
            os.environ["PYTHONPATH"] = f"{tree / 'src'}{os.pathsep}{tree}"
            (Path(directory) / name).mkdir()
            try:
                servers.append(stack.enter_context(running_server(Path(directory) / name, env=env)))
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        pairs = asyncio.run(_pairs(servers[0], servers[1], args.pairs, args.chats))
    report(pairs, args.chats, args.base, args.head)


if __name__ == "__main__":
    run_main(main)
