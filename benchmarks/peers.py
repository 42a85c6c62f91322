"""loopd next to LangGraph and the OpenAI Agents SDK: per-step durable overhead, its growth with history, storage.

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
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._common import median, print_environment, print_table, run_child, verdict
from benchmarks._workload import WINDOW, PeerRun, raw_message_bytes

ALL_PEERS = ("loopd", "loopd-full", "langgraph", "langgraph-async", "langgraph-delta", "agents")
QUICK_PEERS = ("loopd", "langgraph", "agents")
HISTORIES = (50, 200, 500)
RUN_TIMEOUT = 900.0


@dataclass
class Results:
    probe: dict[str, PeerRun] = field(default_factory=dict)
    short: dict[str, list[PeerRun]] = field(default_factory=dict)
    long: dict[str, list[PeerRun]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)


class PeerFailed(RuntimeError):
    pass


def run_peer(peer: str, steps: int, *, probe: bool = False, base: Path | None = None) -> PeerRun:
    with tempfile.TemporaryDirectory(prefix=f"loopd-bench-{peer}-", dir=base) as directory:
        args = ["--peer", peer, "--steps", str(steps), "--dir", directory] + (["--probe"] if probe else [])
        result = PeerRun.from_dict(run_child("benchmarks._peer_main", args, timeout=RUN_TIMEOUT))
    if not result.ok:
        raise PeerFailed(f"{peer} ({steps} steps) did not do the work: {result.problem}")
    return result


def rotated(peers: Sequence[str], shift: int) -> list[str]:
    shift %= len(peers)
    return [*peers[shift:], *peers[:shift]]


def collect(peers: Sequence[str], repeat: int, steps: int, long: int, base: Path | None) -> Results:
    results = Results()
    for peer in peers:
        print(f"  {peer}: 50-step probe run", flush=True)
        results.probe[peer] = run_peer(peer, 50, probe=True, base=base)
        results.names[peer] = results.probe[peer].peer
    for round_ in range(repeat):
        for peer in rotated(peers, round_):
            print(f"  round {round_ + 1}/{repeat}: {peer} {steps} and {long} steps", flush=True)
            results.short.setdefault(peer, []).append(run_peer(peer, steps, base=base))
            results.long.setdefault(peer, []).append(run_peer(peer, long, base=base))
    return results


def persisted_each_step(run: PeerRun) -> str:
    """From the probe: did every step add durable rows before the next model call?"""
    gains = [b - a for a, b in zip(run.durable_rows, run.durable_rows[1:], strict=False)]
    if not gains:
        return "unknown"
    if min(gains) > 0:
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


def report(results: Results, peers: Sequence[str], repeat: int, steps: int, long: int) -> None:
    base = "loopd"
    short_ms = {p: median([r.overhead_ms for r in results.short[p]]) for p in peers}
    rows: list[list[object]] = []
    for p in peers:
        runs = results.short[p]
        spread = f"{min(r.overhead_ms for r in runs):.2f}–{max(r.overhead_ms for r in runs):.2f}"
        evidence = ", ".join(f"{k} {v}" for k, v in runs[0].persisted.items())
        rows.append(
            [
                results.names[p],
                fmt(short_ms[p], 3),
                spread,
                ratio(short_ms[p], short_ms.get(base)),
                persisted_each_step(results.probe[p]),
                evidence,
                fmt(median([r.gc_seconds * 1000 / r.steps for r in runs]), 3),
                fmt(median([r.peak_rss_kb / 1024 for r in runs]), 0),
            ]
        )
    print_table(
        f"Per-step durable overhead: (wall − model time) / steps, {steps} steps in one run, median of {repeat}",
        [
            "peer",
            "ms/step",
            "min–max",
            "× loopd",
            "durable before next model call",
            "persisted (run 1)",
            "of which GC ms/step",
            "peak RSS MB",
        ],
        rows,
        note="Fake model (zero latency, one echo tool call per step, ~200-byte messages); each run a fresh process.",
    )

    long_ms = {p: median([r.overhead_ms for r in results.long[p]]) for p in peers}
    windows = {p: {h: window(results.long[p], h) for h in HISTORIES} for p in peers}
    rows = []
    for p in peers:
        w = windows[p]
        last = max((h for h in HISTORIES if w[h] is not None), default=50)
        growth = ratio(w[last], w[50])
        rows.append(
            [
                results.names[p],
                *(fmt(w[h]) for h in HISTORIES),
                growth,
                ratio(w[500], windows.get(base, {}).get(500)),
                fmt(long_ms[p]),
            ]
        )
    print_table(
        f"Growth with history: ms/step over the {WINDOW} steps ending at history length h ({long}-step run), "
        f"median of {repeat}",
        ["peer", *(f"h={h}" for h in HISTORIES), "last h ÷ h=50", "× loopd at h=500", f"whole run ms/step ({long})"],
        rows,
        note="'whole run' includes work a library defers past the window (LangGraph durability=async writes "
        "checkpoints in the background and waits for them at the end).",
    )

    sizes = {p: _sizes(results, p, steps, long) for p in peers}
    raw = {n: raw_message_bytes(n) for n in (50, steps, long)}
    rows = [["raw message bytes", *(f"{raw[n]:,}" for n in (50, steps, long)), "1.0×", "—"]]
    for p in peers:
        s = sizes[p]
        rows.append(
            [
                results.names[p],
                *(f"{s[n]:,}" if s.get(n) is not None else "—" for n in (50, steps, long)),
                ratio(s.get(long), raw[long]),
                ratio(s.get(long), sizes.get(base, {}).get(long)),
            ]
        )
    print_table(
        "Storage: bytes on disk (database + WAL, after close) for one conversation of N steps",
        ["", f"{50} steps", f"{steps} steps", f"{long} steps", f"× raw ({long})", f"× loopd ({long})"],
        rows,
        note="Raw = user text + tool-call argument JSON + tool outputs + final answer, in UTF-8.",
    )
    goals(short_ms, windows, sizes, raw, long)


def _sizes(results: Results, peer: str, steps: int, long: int) -> dict[int, int | None]:
    out: dict[int, int | None] = {50: results.probe[peer].disk_bytes}
    out[steps] = int(median([r.disk_bytes for r in results.short[peer]]))
    out[long] = int(median([r.disk_bytes for r in results.long[peer]]))
    return out


def goals(
    short_ms: dict[str, float],
    windows: dict[str, dict[int, float | None]],
    sizes: dict[str, dict[int, int | None]],
    raw: dict[int, int],
    long: int,
) -> None:
    if "loopd" not in short_ms:
        return
    ours = windows["loopd"]
    rows: list[list[object]] = []
    rows.append(["per-step durable overhead", "≤ 1 ms", f"{short_ms['loopd']:.3f} ms", verdict(short_ms["loopd"] <= 1)])
    last = max((h for h in HISTORIES if ours[h] is not None), default=None)
    first = ours[HISTORIES[0]]
    flat = None if last is None or not first else (ours[last] or 0.0) / first  # growth, not noise between windows
    rows.append(
        [
            "flat in history length",
            "ms/step at the last h ≤ 1.25× h=50",
            " / ".join(fmt(ours[h], 3) for h in HISTORIES) + " ms",
            verdict(None if flat is None else flat <= 1.25),
        ]
    )
    lg = windows.get("langgraph", {}).get(500)
    speedup = None if lg is None or ours[500] is None else lg / ours[500]
    rows.append(
        [
            "faster than LangGraph at h=500",
            "≥ 20×",
            "—" if speedup is None else f"{speedup:.1f}×",
            verdict(None if speedup is None else speedup >= 20),
        ]
    )
    ours_bytes, lg_bytes = sizes["loopd"].get(long), sizes.get("langgraph", {}).get(long)
    smaller = None if not ours_bytes or not lg_bytes else lg_bytes / ours_bytes
    rows.append(
        [
            f"storage vs LangGraph ({long} steps)",
            "≥ 100× smaller",
            "—" if smaller is None else f"{smaller:.0f}× smaller",
            verdict(None if smaller is None else smaller >= 100),
        ]
    )
    over_raw = None if not ours_bytes else ours_bytes / raw[long]
    rows.append(
        [
            f"storage vs raw message bytes ({long} steps)",
            "≤ 3×",
            "—" if over_raw is None else f"{over_raw:.2f}×",
            verdict(None if over_raw is None else over_raw <= 3),
        ]
    )
    delta_ms = windows.get("langgraph-delta", {}).get(500)
    delta_bytes = sizes.get("langgraph-delta", {}).get(long)
    if delta_ms is not None and ours[500] is not None:
        rows.append(
            ["(context) faster than LangGraph + DeltaChannel at h=500", "—", f"{delta_ms / ours[500]:.1f}×", "—"]
        )
    if delta_bytes and ours_bytes:
        rows.append(
            [
                f"(context) storage vs LangGraph + DeltaChannel ({long} steps)",
                "—",
                f"{delta_bytes / ours_bytes:.1f}× smaller",
                "—",
            ]
        )
    print_table("Goals (issue 6): per step and storage", ["goal", "target", "measured", "verdict"], rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per peer and length (median reported)")
    parser.add_argument("--quick", action="store_true", help="1 repetition, 100/200 steps, 3 peers")
    parser.add_argument("--steps", type=int, default=None, help="steps of the overhead run (default 200)")
    parser.add_argument("--long", type=int, default=None, help="steps of the history run (default 500)")
    parser.add_argument("--peers", default=None, help=f"comma-separated subset of {','.join(ALL_PEERS)}")
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
    if args.environment:
        print_environment()
    results = collect(peers, repeat, steps, long, args.tmp)
    report(results, peers, repeat, steps, long)


if __name__ == "__main__":
    main([*sys.argv[1:], "--environment"])
