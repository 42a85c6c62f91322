"""loopd next to LangGraph and the OpenAI Agents SDK: per-step durable overhead, its growth with history, storage.

**Matched durability.** Every peer runs at each SQLite ``synchronous`` level of ``--durability`` (default both):
FULL (SQLite's default, an fsync per commit; loopd's journal opened with ``synchronous="FULL"``) and NORMAL (the
peers' connections — LangGraph's AsyncSqliteSaver, the Agents SDK's SQLiteSession — set to ``PRAGMA
synchronous=NORMAL``, loopd's journal at NORMAL). Every "× loopd" ratio and every goal compares runs of the same
level only. loopd runs through its real OpenAI-compatible adapter (`benchmarks._peer_loopd`).

Every run is a fresh subprocess (`benchmarks._peer_main`) in its own temporary directory, so one library's
imports, caches and garbage never weigh on another's figures; runs of different peers are interleaved and the
order rotates between repetitions, so slow phases of a noisy machine spread over all of them.

Per peer:
  * one 50-step run with a probe that counts durable rows at every model call (does each step persist before the
    next model call?) — it also gives the storage after 50 steps;
  * ``--repeat`` runs of ``--steps`` (default 200) steps: (wall − model time) / steps;
  * ``--repeat`` runs of ``--long`` (default 500) steps: ms/step over the 25 steps ending at history 50, 200, 500,
    and the storage after 200 and 500 steps.

python -m benchmarks.peers [--repeat N] [--quick] [--steps N] [--long N] [--peers loopd,langgraph,...]
    [--durability FULL,NORMAL]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from benchmarks._common import median, positive_int, print_environment, print_table, run_child
from benchmarks._goals import print_goals
from benchmarks._workload import WINDOW, PeerRun, raw_message_bytes

ALL_PEERS = ("loopd", "langgraph", "langgraph-async", "langgraph-delta", "agents")
DURABILITIES = ("FULL", "NORMAL")
QUICK_PEERS = ("loopd", "langgraph", "agents")
HISTORIES = (50, 200, 500)
RUN_TIMEOUT = 900.0
T = TypeVar("T")


@dataclass
class Results:
    probe: dict[str, PeerRun] = field(default_factory=dict)
    short: dict[str, list[PeerRun]] = field(default_factory=dict)
    long: dict[str, list[PeerRun]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)


class PeerFailed(RuntimeError):
    pass


def key(peer: str, sync: str) -> str:
    """One measured configuration: a peer at one synchronous level."""
    return f"{peer}@{sync}"


def run_peer(peer: str, steps: int, *, sync: str, probe: bool = False, base: Path | None = None) -> PeerRun:
    with tempfile.TemporaryDirectory(prefix=f"loopd-bench-{peer}-", dir=base) as directory:
        args = ["--peer", peer, "--steps", str(steps), "--dir", directory, "--synchronous", sync]
        args += ["--probe"] if probe else []
        result = PeerRun.from_dict(run_child("benchmarks._peer_main", args, timeout=RUN_TIMEOUT))
    if not result.ok:
        raise PeerFailed(f"{peer} at {sync} ({steps} steps) did not do the work: {result.problem}")
    return result


def rotated(peers: Sequence[T], shift: int) -> list[T]:
    shift %= len(peers)
    return [*peers[shift:], *peers[:shift]]


def collect(
    peers: Sequence[str], durabilities: Sequence[str], repeat: int, steps: int, long: int, base: Path | None
) -> Results:
    results = Results()
    runs = [(peer, sync) for sync in durabilities for peer in peers]
    for peer, sync in runs:
        print(f"  {peer} at {sync}: 50-step probe run", flush=True)
        results.probe[key(peer, sync)] = run_peer(peer, 50, sync=sync, probe=True, base=base)
        results.names[key(peer, sync)] = results.probe[key(peer, sync)].peer
    for round_ in range(repeat):
        for peer, sync in rotated(runs, round_):
            print(f"  round {round_ + 1}/{repeat}: {peer} at {sync}, {steps} and {long} steps", flush=True)
            results.short.setdefault(key(peer, sync), []).append(run_peer(peer, steps, sync=sync, base=base))
            results.long.setdefault(key(peer, sync), []).append(run_peer(peer, long, sync=sync, base=base))
    return results


def persisted_each_step(run: PeerRun) -> str:
    """From the probe: did every step add durable rows before the next model call?"""
    gains = [b - a for a, b in zip(run.durable_rows, run.durable_rows[1:], strict=False)]
    if not gains:
        return "unknown"
    if min(gains) > 0:
        if run.unsynced_calls:
            return (
                f"stored yes (+{median(gains):g} rows/step); {run.unsynced_calls} of {len(run.durable_rows)} "
                "calls began before its fsync"
            )
        return f"yes (+{median(gains):g} rows/step)"
    stalled = sum(1 for g in gains if g <= 0)
    return f"no ({stalled} of {len(gains)} steps added nothing before the next call)"


def window(runs: list[PeerRun], history: int) -> float | None:
    values = [v for r in runs if (v := r.windows.get(history)) is not None]
    return median(values) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base == 0:
        return "—"
    return f"{value / base:,.1f}×"


def report(
    results: Results, peers: Sequence[str], durabilities: Sequence[str], repeat: int, steps: int, long: int
) -> None:
    runs = [key(p, sync) for sync in durabilities for p in peers]
    short_ms = {k: median([r.overhead_ms for r in results.short[k]]) for k in runs}
    rows: list[list[object]] = []
    for sync in durabilities:
        base = short_ms.get(key("loopd", sync))
        for p in peers:
            k = key(p, sync)
            done = results.short[k]
            spread = f"{min(r.overhead_ms for r in done):.2f}–{max(r.overhead_ms for r in done):.2f}"
            evidence = ", ".join(f"{name} {v}" for name, v in done[0].persisted.items())
            rows.append(
                [
                    sync,
                    results.names[k],
                    fmt(short_ms[k], 3),
                    spread,
                    ratio(short_ms[k], base),
                    persisted_each_step(results.probe[k]),
                    evidence,
                    fmt(median([r.gc_seconds * 1000 / r.steps for r in done]), 3),
                    fmt(median([r.peak_rss_kb / 1024 for r in done]), 0),
                ]
            )
    print_table(
        f"Per-step durable overhead: (wall − model time) / steps, {steps} steps in one run, median of {repeat}",
        [
            "synchronous",
            "peer",
            "ms/step",
            "min–max",
            "× loopd (same synchronous)",
            "durable before next model call",
            "persisted (run 1)",
            "of which GC ms/step",
            "peak RSS MB",
        ],
        rows,
        note="Fake model (zero latency, one echo tool call per step, ~200-byte messages); loopd through its real "
        "OpenAI-compatible adapter over an in-process transport; each run a fresh process. Ratios compare rows of "
        "the same SQLite synchronous level only. At FULL the peers fsync every write before going on; loopd commits "
        "each step before the next model call (a process crash keeps it) and fsyncs it within 5 ms, before anyone "
        "sees it and before any tool with effects runs — the echo tool reads only, so its next call may start "
        "while the fsync is due ('calls began before its fsync': counted at each model call of the probe run).",
    )

    long_ms = {k: median([r.overhead_ms for r in results.long[k]]) for k in runs}
    windows = {k: {h: window(results.long[k], h) for h in HISTORIES} for k in runs}
    rows = []
    for sync in durabilities:
        for p in peers:
            k = key(p, sync)
            w = windows[k]
            last = max((h for h in HISTORIES if w[h] is not None), default=50)
            rows.append(
                [
                    sync,
                    results.names[k],
                    *(fmt(w[h]) for h in HISTORIES),
                    ratio(w[last], w[50]),
                    ratio(w[500], windows.get(key("loopd", sync), {}).get(500)),
                    fmt(long_ms[k]),
                ]
            )
    print_table(
        f"Growth with history: ms/step over the {WINDOW} steps ending at history length h ({long}-step run), "
        f"median of {repeat}",
        [
            "synchronous",
            "peer",
            *(f"h={h}" for h in HISTORIES),
            "last h ÷ h=50",
            "× loopd at h=500 (same synchronous)",
            f"whole run ms/step ({long})",
        ],
        rows,
        note="'whole run' includes work a library defers past the window (LangGraph durability=async writes "
        "checkpoints in the background and waits for them at the end).",
    )

    sizes = {k: _sizes(results, k, steps, long) for k in runs}
    raw = {n: raw_message_bytes(n) for n in (50, steps, long)}
    rows = [["—", "raw message bytes", *(f"{raw[n]:,}" for n in (50, steps, long)), "1.0×", "—"]]
    for sync in durabilities:
        for p in peers:
            k = key(p, sync)
            size = sizes[k]
            rows.append(
                [
                    sync,
                    results.names[k],
                    *(f"{size[n]:,}" if size.get(n) is not None else "—" for n in (50, steps, long)),
                    ratio(size.get(long), raw[long]),
                    ratio(size.get(long), sizes.get(key("loopd", sync), {}).get(long)),
                ]
            )
    print_table(
        "Storage: bytes on disk (database + WAL, after close) for one conversation of N steps",
        ["synchronous", "", f"{50} steps", f"{steps} steps", f"{long} steps", f"× raw ({long})", f"× loopd ({long})"],
        rows,
        note="Raw = user text + tool-call argument JSON + tool outputs + final answer, in UTF-8.",
    )
    print_goals("peers", peer_goals(short_ms, windows, sizes, raw, long))


def _sizes(results: Results, run: str, steps: int, long: int) -> dict[int, int | None]:
    out: dict[int, int | None] = {50: results.probe[run].disk_bytes}
    out[steps] = int(median([r.disk_bytes for r in results.short[run]]))
    out[long] = int(median([r.disk_bytes for r in results.long[run]]))
    return out


def _quotient(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def peer_goals(
    short_ms: dict[str, float],
    windows: dict[str, dict[int, float | None]],
    sizes: dict[str, dict[int, int | None]],
    raw: dict[int, int],
    long: int,
) -> dict[str, float | None]:
    """The figures `benchmarks._goals` judges; every ratio between runs of the same synchronous level."""
    measured: dict[str, float | None] = {}
    for sync in DURABILITIES:
        ours = windows.get(key("loopd", sync), {}).get(500)
        for peer, name in (("langgraph", "langgraph"), ("agents", "agents")):
            theirs = windows.get(key(peer, sync), {}).get(500)
            measured[f"x_{name}_{sync.lower()}"] = _quotient(theirs, ours)
    normal = key("loopd", "NORMAL")
    measured["step_ms_normal"] = short_ms.get(normal)
    ours_w = windows.get(normal, {})
    last = max((h for h in HISTORIES if ours_w.get(h) is not None), default=None)
    measured["growth_normal"] = None if last is None or last == HISTORIES[0] else _quotient(ours_w[last], ours_w[50])
    level = next((d for d in DURABILITIES if key("loopd", d) in sizes), None)
    ours_bytes = None if level is None else sizes[key("loopd", level)].get(long)
    lg_bytes = None if level is None else sizes.get(key("langgraph", level), {}).get(long)
    judged = long >= 500  # the storage goals are for a 500-step conversation; a shorter run's ratios are not judged
    measured["storage_vs_langgraph"] = _quotient(lg_bytes, ours_bytes) if judged else None
    measured["storage_vs_raw"] = _quotient(ours_bytes, raw[long]) if judged else None
    return measured


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repeat", type=positive_int, default=3, help="timed runs per peer and length (median reported)"
    )
    parser.add_argument("--quick", action="store_true", help="1 repetition, 100/200 steps, 3 peers")
    parser.add_argument("--steps", type=positive_int, default=None, help="steps of the overhead run (default 200)")
    parser.add_argument("--long", type=positive_int, default=None, help="steps of the history run (default 500)")
    parser.add_argument("--peers", default=None, help=f"comma-separated subset of {','.join(ALL_PEERS)}")
    parser.add_argument(
        "--durability", default=",".join(DURABILITIES), help="SQLite synchronous levels to run: FULL,NORMAL (both)"
    )
    parser.add_argument("--tmp", type=Path, default=None, help="parent directory for the runs' temporary dirs")
    parser.add_argument("--environment", action="store_true", help="print the machine and versions first")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else max(1, args.repeat)
    steps = args.steps or (100 if args.quick else 200)
    long = args.long or (200 if args.quick else 500)
    if args.peers:
        peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
        unknown = set(peers) - set(ALL_PEERS)
        if unknown:
            raise SystemExit(f"unknown peers {sorted(unknown)}; choose from {', '.join(ALL_PEERS)}")
    else:
        peers = QUICK_PEERS if args.quick else ALL_PEERS
    durabilities = tuple(d.strip().upper() for d in args.durability.split(",") if d.strip())
    if not durabilities or set(durabilities) - set(DURABILITIES):
        raise SystemExit(f"--durability takes FULL, NORMAL or FULL,NORMAL, not {args.durability!r}")
    if "loopd" not in peers:
        peers = ("loopd", *peers)  # every ratio is against loopd
    if args.environment:
        print_environment()
    results = collect(peers, durabilities, repeat, steps, long, args.tmp)
    report(results, peers, durabilities, repeat, steps, long)


if __name__ == "__main__":
    main([*sys.argv[1:], "--environment"])
