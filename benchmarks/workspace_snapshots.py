"""Workspace snapshots: time and bytes for a large workspace, first snapshot and after a small change.

A workspace of ``--files`` files (default 10,000; 100 directories of 100 files, 1-4 KiB of text each) is
snapshotted once (everything is hashed and stored), then ``--change`` files (default 10) are modified and it is
snapshotted again: the stat cache means only the changed files are read, and only they and the trees on their
paths are stored. Then the workspace is restored to the first snapshot. Reported per phase: the wall time
(median of ``--repeat``), the files hashed, the objects and bytes written to the store.

python -m benchmarks.workspace_snapshots [--files 10000] [--change 10] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._children import run_main
from benchmarks._common import positive_int, print_table
from loopd.harness.snapshots import SnapshotStore

_OLD = 10**9  # files get an mtime far in the past, as a workspace's untouched files have (not "racy")


def _workspace(root: Path, files: int, rng: random.Random) -> list[Path]:
    paths = []
    per_dir = 100
    for i in range(files):
        d = root / f"pkg{i // per_dir:03d}"
        d.mkdir(exist_ok=True)
        p = d / f"mod{i % per_dir:03d}.py"
        p.write_text(f"# file {i}\n" + "x = 1\n" * rng.randint(170, 680))
        os.utime(p, ns=(_OLD * 10**9, _OLD * 10**9))
        paths.append(p)
    return paths


def _once(files: int, change: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="loopd-bench-snap-") as tmp:
        ws, store_dir = Path(tmp) / "ws", Path(tmp) / "store"
        ws.mkdir()
        paths = _workspace(ws, files, rng)
        store = SnapshotStore(store_dir, ws)
        t0 = time.perf_counter()
        first = store.checkpoint_sync()
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        same = store.checkpoint_sync()
        t_same = time.perf_counter() - t0
        for p in rng.sample(paths, change):
            p.write_text(p.read_text() + "y = 2\n")
        t0 = time.perf_counter()
        changed = store.checkpoint_sync()
        t_changed = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.restore_sync(first.ref)
        t_restore = time.perf_counter() - t0
        assert same.ref == first.ref and changed.ref != first.ref
        return {
            "first": (t_first, first.hashed, first.objects_new, first.bytes_new),
            "unchanged": (t_same, same.hashed, same.objects_new, same.bytes_new),
            "changed": (t_changed, changed.hashed, changed.objects_new, changed.bytes_new),
            "restore": (t_restore, 0, 0, 0),
        }


def run(files: int, change: int, repeat: int) -> None:
    runs = [_once(files, change, seed) for seed in range(repeat)]
    rows = []
    for phase, label in (
        ("first", f"first snapshot of {files:,} files"),
        ("unchanged", "again, nothing changed"),
        ("changed", f"after {change} files changed"),
        ("restore", "restore the first snapshot"),
    ):
        t = statistics.median(r[phase][0] for r in runs)
        _, hashed, objects, written = runs[0][phase]
        rows.append((label, f"{t * 1000:.0f} ms", hashed, objects, f"{written / 1024:.1f} KiB"))
    print_table(
        "Workspace snapshots (content-addressed store, stat cache)",
        ("phase", f"time (median of {repeat})", "files hashed", "objects written", "bytes written"),
        rows,
        note="one process, local disk; time includes walking the workspace and writing the trees",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=positive_int, default=10_000)
    parser.add_argument("--change", type=positive_int, default=10)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repetition")
    args = parser.parse_args(argv)
    run(args.files, args.change, 1 if args.quick else max(1, args.repeat))


if __name__ == "__main__":
    run_main(main)
