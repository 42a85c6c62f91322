"""Run one peer once, in this process, and print its `PeerRun` as one JSON line.

python -m benchmarks._peer_main --peer PEER --steps N --dir DIR [--synchronous FULL|NORMAL] [--probe]
    [--profile FILE]
    PEER: loopd, langgraph, langgraph-async, langgraph-delta, agents

``--synchronous`` is SQLite's ``PRAGMA synchronous`` of every connection the peer writes through (loopd's journal,
LangGraph's AsyncSqliteSaver, the Agents SDK's SQLiteSession): FULL (SQLite's default) or NORMAL.

`benchmarks.peers` starts one fresh subprocess per run so no library's imports, caches or garbage affect another.
``--profile`` runs under pyinstrument and writes its text report to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal

from benchmarks._workload import PeerRun

PEERS = ("loopd", "langgraph", "langgraph-async", "langgraph-delta", "agents")
Synchronous = Literal["FULL", "NORMAL"]


def runner(peer: str, sync: Synchronous) -> Callable[[int, Path, bool], Coroutine[Any, Any, PeerRun]]:
    """Import only the library under test."""
    if peer == "loopd":
        from benchmarks import _peer_loopd

        return lambda steps, d, probe: _peer_loopd.run(steps, d, probe=probe, synchronous=sync)
    if peer in ("langgraph", "langgraph-async", "langgraph-delta"):
        from benchmarks import _peer_langgraph

        durability: Literal["sync", "async"] = "async" if peer == "langgraph-async" else "sync"
        delta = peer == "langgraph-delta"
        return lambda steps, d, probe: _peer_langgraph.run(
            steps, d, probe=probe, durability=durability, delta=delta, synchronous=sync
        )
    if peer == "agents":
        from benchmarks import _peer_agents

        return lambda steps, d, probe: _peer_agents.run(steps, d, probe=probe, synchronous=sync)
    raise SystemExit(f"unknown peer {peer!r}; one of {', '.join(PEERS)}")


def peak_rss_kb() -> int:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: that keeps the spawning parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer", required=True, choices=PEERS)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL", help="SQLite's synchronous")
    parser.add_argument("--probe", action="store_true", help="count durable rows at every model call")
    parser.add_argument("--profile", type=Path, default=None, help="write a pyinstrument text report here")
    args = parser.parse_args()
    run = runner(args.peer, args.synchronous)
    gc.collect()
    if args.profile is None:
        result = asyncio.run(run(args.steps, args.dir, args.probe))
    else:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005, async_mode="enabled")
        with profiler:
            result = asyncio.run(run(args.steps, args.dir, args.probe))
        args.profile.write_text(profiler.output_text(unicode=True, color=False, show_all=False))
    result.peak_rss_kb = peak_rss_kb()
    sys.stdout.write(result.to_json() + "\n")


if __name__ == "__main__":
    main()
