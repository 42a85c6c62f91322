"""One long conversation: what each chat costs as the history fills up.

python -m benchmarks.long_conversation [--chats 100] [--window 25] [--question-bytes 600] [--repeat N] [--quick]

A `loopd up` subprocess (demo model) and one conversation; ``--chats`` questions of ~``--question-bytes`` bytes are
sent one after another (each waits for its answer's end). Per window of ``--window`` chats: the server's CPU per chat
(`/proc` user + system, in clock ticks), the wall time per chat, and how many bytes the stored data grew by per chat
(the pages in use of every database — loop-server's, the harness journal, the resource store —, SQLite's ``dbstat``),
beside the chat's own text (question + streamed answer). Every chat is a new harness call given the conversation's
recent history (the Task API's last 100 messages), so per-chat costs grow until the history is full, then stay flat:
the last window is the steady state. The biggest tables of each database are listed at the end (SQLite's ``dbstat``).
No goal: the figures are for comparing builds (`make bench-check` rules match their columns).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from benchmarks._server import Api, cpu_seconds, running_server
from benchmarks.server_chats import one_chat
from loopd._infra import eventloop

FILLER = "lorem ipsum dolor sit amet "


@dataclass(frozen=True)
class Window:
    first: int
    last: int
    cpu_ms: float
    wall_ms: float
    bytes_per_chat: float
    text_per_chat: float


def table_bytes(directory: Path) -> list[tuple[str, str, int]]:
    """(database file, table or index, bytes in use) for every SQLite database under ``directory`` (``dbstat``: the
    pages a reader sees now, committed WAL content included)."""
    found: list[tuple[str, str, int]] = []
    for path in sorted(directory.rglob("*.db")):
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as conn:
                rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        except sqlite3.Error:
            continue  # (dbstat missing from this SQLite build, or the file is no database)
        found += [(path.relative_to(directory).as_posix(), str(name), int(size)) for name, size in rows]
    return found


def stored_bytes(directory: Path) -> int:
    return sum(size for _, _, size in table_bytes(directory))


def question(index: int, size: int) -> str:
    head = f"question {index}: "
    return head + (FILLER * (1 + size // len(FILLER)))[: max(0, size - len(head))]


def largest_tables(directory: Path, top: int = 4) -> list[tuple[str, str, int]]:
    return sorted(table_bytes(directory), key=lambda row: -row[2])[:top]


async def one_run(chats: int, window: int, size: int) -> tuple[list[Window], list[tuple[str, str, int]]]:
    with tempfile.TemporaryDirectory(prefix="loopd-bench-long-") as d, running_server(Path(d)) as server:
        data = Path(d) / "data"
        async with Api(server, connections=2, timeout=60.0) as api:
            conversation = await api.create_conversation("long conversation")
        opened = asyncio.Event()
        opened.set()
        windows: list[Window] = []
        cpu, wall, disk, text = cpu_seconds(server.pid), time.perf_counter(), stored_bytes(data), 0
        for index in range(chats):
            asked = question(index, size)
            chat = await one_chat(server, conversation, asked, opened)
            if not chat.ok:
                raise RuntimeError(f"chat {index} of the long conversation failed: {chat.error}")
            text += len(asked.encode()) + len(chat.answer.encode())
            if (index + 1) % window == 0:
                await asyncio.sleep(0.3)  # the answer's last writes (title, ledger) land before the reading
                now_cpu, now_wall, now_disk = cpu_seconds(server.pid), time.perf_counter(), stored_bytes(data)
                windows.append(
                    Window(
                        index + 2 - window,
                        index + 1,
                        1000 * (now_cpu - cpu) / window,
                        1000 * (now_wall - wall - 0.3) / window,
                        (now_disk - disk) / window,
                        text / window,
                    )
                )
                cpu, wall, disk, text = cpu_seconds(server.pid), time.perf_counter(), stored_bytes(data), 0
        return windows, largest_tables(data)


def run(chats: int, window: int, size: int, repeat: int) -> None:
    runs = [eventloop.run(one_run(chats, window, size)) for _ in range(repeat)]
    rows = []
    for position, first in enumerate(runs[0][0]):
        same = [windows[position] for windows, _ in runs]
        rows.append(
            [
                f"{first.first}–{first.last}",
                f"{statistics.median(w.cpu_ms for w in same):.1f}",
                f"{statistics.median(w.wall_ms for w in same):.1f}",
                f"{statistics.median(w.bytes_per_chat for w in same):,.0f}",
                f"{statistics.median(w.text_per_chat for w in same):,.0f}",
                f"{statistics.median(w.bytes_per_chat / max(1.0, w.text_per_chat) for w in same):.0f}×",
            ]
        )
    print_table(
        f"one conversation, {chats} chats one after another, ~{size}-byte questions (medians of {repeat} run(s))",
        ["chats", "server CPU ms/chat", "wall ms/chat", "stored bytes/chat", "text bytes/chat", "stored ÷ text"],
        rows,
        note="server CPU: the `loopd up` process, user + system. stored: growth of the pages in use of every database "
        "of the data directory (SQLite dbstat, as a reader sees them). text: the question and the streamed answer. "
        "Each later chat's harness call goes on from the previous answer's session (a fork at its end).",
    )
    _, tables = runs[-1]
    print_table(
        "largest tables after the last run",
        ["database", "table", "bytes"],
        [[database, table, f"{size:,}"] for database, table, size in tables],
        note="SQLite dbstat: pages in use, as a reader sees them.",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=positive_int, default=100)
    parser.add_argument("--window", type=positive_int, default=25)
    parser.add_argument("--question-bytes", type=positive_int, default=600)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run of 40 chats")
    args = parser.parse_args(argv)
    if args.chats < 1 or args.window < 1 or args.chats % args.window:
        parser.error("--chats must be a positive multiple of --window")
    if args.quick:
        args.chats, args.window, args.repeat = 40, 20, 1
    run(args.chats, args.window, args.question_bytes, max(1, args.repeat))


if __name__ == "__main__":
    run_main(main)
