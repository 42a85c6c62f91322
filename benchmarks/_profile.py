"""Profile (pyinstrument) the loopd paths the issue-6 goals measure, and write the text reports to a directory.

python -m benchmarks._profile [--out DIR] [--what step,journal,restore]

* step: one 500-step turn of the peer workload (`benchmarks._peer_main --profile`), in a fresh process;
* journal: 1 and 100 sessions appending one record at a time (the event-loop thread only: pyinstrument does not
  sample the journal's writer thread, whose share shows up as ``epoll.poll``, i.e. waiting for it);
* restore: `Rig.restore_session` of a 10k-event session in a fresh process (`benchmarks._restore_main --profile`).

Not part of ``make bench`` (a profiled run is slower than an unprofiled one; never quote its timings).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from benchmarks._children import run_main
from benchmarks._common import run_child
from benchmarks.harness_core import journal_appends, write_session


def profile_step(out: Path) -> Path:
    target = out / "step.txt"
    with tempfile.TemporaryDirectory() as d:
        args = ["--peer", "loopd", "--steps", "500", "--dir", d, "--profile", str(target)]
        run_child("benchmarks._peer_main", args, timeout=600)
    return target


def profile_journal(out: Path, sessions: int) -> Path:
    from pyinstrument import Profiler

    target = out / f"journal-{sessions}.txt"
    profiler = Profiler(interval=0.0002, async_mode="disabled")
    with profiler:
        asyncio.run(journal_appends(sessions, 20_000 // sessions))
    target.write_text(profiler.output_text(unicode=True, color=False, show_all=False))
    return target


def profile_restore(out: Path) -> Path:
    target = out / "restore-10k.txt"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "restore.db"
        asyncio.run(write_session(path, 10_000))
        run_child(
            "benchmarks._restore_main", ["--db", str(path), "--events", "10000", "--profile", str(target)], timeout=600
        )
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "loopd-profiles")
    parser.add_argument("--what", default="step,journal,restore")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = {w.strip() for w in args.what.split(",")}
    written: list[Path] = []
    if "step" in wanted:
        written.append(profile_step(args.out))
    if "journal" in wanted:
        written += [profile_journal(args.out, 1), profile_journal(args.out, 100)]
    if "restore" in wanted:
        written.append(profile_restore(args.out))
    for path in written:
        print(f"\n===== {path} =====")
        print(path.read_text())


if __name__ == "__main__":
    run_main(main)
