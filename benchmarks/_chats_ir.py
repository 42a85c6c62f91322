"""Like for like where time is too noisy: a server's instructions per chat under callgrind, two source trees.

python -m benchmarks._chats_ir --base DIR [--head DIR] [--chats 20] [--runs 2]

Where a machine's pace swings from one round to the next (a shared VM: ±25 % between two rounds seconds apart here),
`benchmarks._chats_ab` needs many pairs to see a change of a few percent. Instructions do not swing: each tree's
`loopd up` runs under ``valgrind --tool=callgrind`` with collection off, is warmed up (three rounds of 5 chats), then
collects while one round of ``--chats`` concurrent chats runs and the server settles (3 s), and the instructions
counted are divided by the chats. The runs alternate base, head, base, head… (``--runs`` of each); the figure to
quote is the median ratio head ÷ base. Instructions are not time (cache misses, system calls and waiting are not in
them), and a server runs 50–100× slower under callgrind, so its timers (lease renewals, heartbeats) fire relatively
more often — a cost both trees share. Needs valgrind (``callgrind_control``); makes no timed assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Final
from urllib.parse import urlsplit

from benchmarks._chats_ab import comparison_arguments
from benchmarks._children import run_main, spawn
from benchmarks._common import print_table
from benchmarks._server import _LAUNCH, ServerProcess
from benchmarks.server_chats import run_chats

START_TIMEOUT: Final = 300.0
"""Seconds a server under callgrind may take to start (about a minute here)."""
SETTLE: Final = 3.0
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)


def callgrind_total(path: Path) -> int:
    """The instructions (``Ir``) a callgrind output file counted in all (its ``totals:`` line)."""
    found = _TOTALS.search(path.read_bytes())
    if found is None:
        raise ValueError(f"{path} has no 'totals:' line: not a callgrind output file (or it was cut short)")
    return int(found.group(1))


async def _wait_for(child: subprocess.Popen[bytes], data: Path, log: Path) -> ServerProcess:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"loopd up exited {child.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads((data / "server.json").read_text())
            token = Path(info["token_file"]).read_text().strip()
            if token:
                parts = urlsplit(str(info["url"]))
                host, port = parts.hostname or "127.0.0.1", parts.port or 80
                return ServerProcess(str(info["url"]), host, port, token, child.pid, data)
        await asyncio.sleep(0.5)
    raise RuntimeError(f"loopd up under callgrind did not start within {START_TIMEOUT:g} s")


def _control(pid: int, switch: str) -> None:
    subprocess.run(["callgrind_control", "-i", switch, str(pid)], check=True, capture_output=True, timeout=60)


async def instructions_per_chat(tree: Path, chats: int, directory: Path) -> float:
    """One run: ``tree``'s server under callgrind, warmed up, then one round of ``chats`` counted."""
    data, out, log_path = directory / "data", directory / "callgrind.out", directory / "server.log"
    env = dict(os.environ, LOOPD_MODEL="demo", COLUMNS="200", PYTHONPATH=f"{tree / 'src'}{os.pathsep}{tree}")
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-c",
        _LAUNCH,
        "up",
        "--port",
        "0",
        "--data-dir",
        str(data),
    ]
    with log_path.open("wb") as log:
        child = spawn(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            server = await _wait_for(child, data, log_path)
            for index in range(3):
                await run_chats(server, 5, f"warm-{index}")
            await asyncio.sleep(SETTLE)
            _control(child.pid, "on")
            done = await run_chats(server, chats, "counted")
            await asyncio.sleep(SETTLE)
            _control(child.pid, "off")
            if done.ok != chats:
                raise RuntimeError(f"only {done.ok} of {chats} chats completed under callgrind")
        finally:
            child.terminate()  # callgrind writes its file as the process ends
            try:
                child.wait(120)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(30)
    return callgrind_total(out) / chats


def report(base: Sequence[float], head: Sequence[float], chats: int, trees: tuple[Path, Path]) -> None:
    ratios = [h / b for b, h in zip(base, head, strict=True)]
    print_table(
        f"instructions per chat under callgrind, base vs head, {len(base)} run(s) each of {chats} chats",
        ["figure", "base", "head", "median ratio", "ratio per run"],
        [
            [
                "million instructions per chat",
                f"{median(base) / 1e6:,.2f}",
                f"{median(head) / 1e6:,.2f}",
                f"{median(ratios):.3f}",
                " ".join(f"{r:.3f}" for r in ratios),
            ]
        ],
        note=f"base: {trees[0]}; head: {trees[1]}; counted: one round of concurrent chats and {SETTLE:g} s after it, "
        "warm servers (instructions, not time)",
    )


async def _measure(base: Path, head: Path, chats: int, runs: int) -> tuple[list[float], list[float]]:
    counts: dict[str, list[float]] = {"base": [], "head": []}
    for index in range(runs):
        order = (("base", base), ("head", head)) if index % 2 == 0 else (("head", head), ("base", base))
        for name, tree in order:
            with tempfile.TemporaryDirectory(prefix=f"loopd-ir-{name}-") as directory:
                value = await instructions_per_chat(tree, chats, Path(directory))
            counts[name].append(value)
            print(f"  run {index + 1} {name}: {value / 1e6:,.2f} M instructions/chat", flush=True)
    return counts["base"], counts["head"]


def main(argv: Sequence[str] | None = None) -> None:
    parser, args = comparison_arguments(
        argv,
        __doc__,
        repeat=("runs", 2, "runs of each tree, alternating (default 2)"),
        chats=(20, "concurrent chats in the counted round (default 20)"),
    )
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error(
            "valgrind is not installed (it brings callgrind_control): install it, e.g. apt-get install valgrind"
        )
    base, head = asyncio.run(_measure(args.base, args.head, args.chats, args.runs))
    report(base, head, args.chats, (args.base, args.head))


if __name__ == "__main__":
    run_main(main)
