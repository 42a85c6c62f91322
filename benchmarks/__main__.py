"""`make bench`: run every benchmark module and print their tables.

python -m benchmarks [--quick] [--repeat N] [--markdown PATH] [--results [--out FILE] [--docs]] [module ...]
python -m benchmarks MODULE [its own options, e.g. server_streams --subscribers 1000,5000]
python -m benchmarks --compare BEFORE.json AFTER.json

Modules whose ``main`` takes an ``argv`` get ``--repeat N`` (and ``--quick``); the others run with their own
defaults (``--quick`` shrinks the known ones). ``--markdown PATH`` also writes every table to PATH as Markdown.
``--results`` writes ``benchmarks/results/<date>-<short sha>.json``: the command line, the commit, the machine and
the library versions, the load average before and after, the machine class (CPUs, architecture, Python major.minor,
processor model) and the machine's pace before the run (``pace_ms``: what `make bench-check` matches baselines by,
with the class), and every table with its raw rows — the file docs
quote (a quick run's file ends in ``-quick.json``; ``--out FILE`` writes elsewhere). ``--docs`` then regenerates the
generated sections of docs/BENCHMARKS.md and docs/SCALING.md from it (`benchmarks._docs`: only the sections whose
tables the file has).
``--compare BEFORE.json AFTER.json`` prints the change of every figure present in both (matched by table, then by
the row's labels) and runs nothing. A run of several modules with goals ends with all their goals in one table.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks._busy import busy_note, cpu_sample, others_share
from benchmarks._children import run_main
from benchmarks._common import (
    MARKDOWN_ENV,
    MODULE_ENV,
    RESULTS_ENV,
    cpu_model,
    environment_rows,
    machine_pace,
    positive_int,
    print_environment,
    print_table,
)
from benchmarks._goals import board, goal_table, tally
from benchmarks._results import compare, format_changes

# Smaller settings for modules that do not take --quick themselves.
QUICK_ARGV = {"reconcile_latency": ["--count", "50", "--burst", "50"]}


PROG: Final = "python -m benchmarks"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help (with one module: its options)")
    parser.add_argument("modules", nargs="*", help="run only these benchmark modules")
    parser.add_argument("--quick", action="store_true", help="one repetition and smaller sizes (a smoke run)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="repetitions; medians are reported (default 3)")
    parser.add_argument("--markdown", type=Path, default=None, help="also append every table to this file")
    parser.add_argument("--results", action="store_true", help="write benchmarks/results/<date>-<sha>.json")
    parser.add_argument("--out", type=Path, default=None, help="with --results: write the results file here")
    parser.add_argument(
        "--docs", action="store_true", help="with --results: regenerate docs/BENCHMARKS.md and docs/SCALING.md from it"
    )
    parser.add_argument(
        "--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="print the change per figure and exit"
    )
    args, extra = parser.parse_known_args()
    if args.help:
        if len(args.modules) == 1 and _takes_argv(args.modules[0]):
            _run_module(args.modules[0], ["--help"])  # its own options (argparse exits after printing them)
        parser.print_help()
        return
    if extra and (len(args.modules) != 1 or not _takes_argv(args.modules[0])):
        parser.error(f"unrecognized arguments: {' '.join(extra)} (a module's own options need exactly one module)")
    if args.compare is not None:
        compare_files(args.compare[0], args.compare[1])
        return
    if args.out is not None and not args.modules:
        # A file named for one benchmark would otherwise start every one of them (the peers' included, ~1 h).
        parser.error(
            "--out names the results file of the modules you list: add them (e.g. `--results --out FILE "
            "tracing_overhead`), or drop --out to run every benchmark into benchmarks/results/<date>-<sha>.json"
        )
    # Every table of the run, as JSON lines: the results file's (--results), and the goals summed up at the end.
    tables = Path(tempfile.mkstemp(prefix="loopd-bench-", suffix=".jsonl")[1])
    os.environ[RESULTS_ENV] = str(tables)
    try:
        _run(args, extra, tables)
    finally:
        tables.unlink(missing_ok=True)


def _run(args: argparse.Namespace, extra: list[str], tables: Path) -> None:
    """Run the modules ``args`` names (all by default), their tables collected in ``tables``."""
    load_before = os.getloadavg()
    pace = machine_pace() if args.results else None  # before the run loads the machine
    tree = tree_state()  # the code this run measures: the tree as it starts (edits during the run are noted apart)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("")
        os.environ[MARKDOWN_ENV] = str(args.markdown.resolve())
    here = Path(__file__).parent
    names = sorted(i.name for i in pkgutil.iter_modules([str(here)]) if not i.name.startswith("_"))
    unknown = set(args.modules) - set(names)
    if unknown:
        raise SystemExit(f"unknown benchmark modules {sorted(unknown)}; choose from {', '.join(names)}")
    print_environment()
    started = time.perf_counter()
    shares: dict[str, float | None] = {}  # per module: the share of the machine's CPU others took meanwhile
    for name in names:
        if args.modules and name not in args.modules:
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        entry = getattr(module, "main", None)
        if entry is None:
            continue
        print(f"\n== benchmarks.{name} ==", flush=True)
        os.environ[MODULE_ENV] = name
        t0 = time.perf_counter()
        sample = cpu_sample()
        if inspect.signature(entry).parameters:
            _run_module(name, ["--repeat", str(args.repeat), *(["--quick"] if args.quick else []), *extra])
        else:
            saved = sys.argv
            sys.argv = [f"{PROG} {name}", *(QUICK_ARGV.get(name, []) if args.quick else [])]
            try:
                entry()
            finally:
                sys.argv = saved
        print(f"(benchmarks.{name}: {time.perf_counter() - t0:.0f} s)", flush=True)
        share = shares[name] = others_share(sample, cpu_sample())
        note = busy_note(name, share)
        if note is not None:
            print(note, flush=True)
    print(f"\nall benchmarks: {time.perf_counter() - started:.0f} s")
    recorded = [json.loads(line) for line in tables.read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.results:
        out = args.out or results_path(tree, quick=args.quick)
        written = write_results(
            tables,
            load_before,
            time.perf_counter() - started,
            out,
            quick=args.quick,
            tree=tree,
            pace_ms=pace,
            other_cpu_share=shares,
        )
        print(f"results: {written}")
        if args.docs and args.quick:
            print("docs: not regenerated from a --quick run (the docs quote full runs)")
        elif args.docs:
            from benchmarks._docs import GENERATED, regenerate

            for document in GENERATED:
                changed = regenerate(document, written)
                shown = ", ".join(changed) or "no generated section has tables in this run"
                print(f"docs: {shown} regenerated in {document}")
    print_run_goals(recorded)


def _run_module(name: str, argv: list[str]) -> None:
    """Call benchmark module ``name``'s ``main(argv)``, its parser naming it as it is run (its usage and errors read
    ``python -m benchmarks NAME``, not ``__main__.py``)."""
    entry = importlib.import_module(f"benchmarks.{name}").main
    saved = sys.argv[0]
    sys.argv[0] = f"{PROG} {name}"
    try:
        entry(argv)
    finally:
        sys.argv[0] = saved


def _takes_argv(name: str) -> bool:
    """Whether benchmark module ``name`` exists and its ``main`` takes an ``argv`` (so it can get its own options)."""
    try:
        entry = getattr(importlib.import_module(f"benchmarks.{name}"), "main", None)
    except ImportError:
        return False
    return entry is not None and bool(inspect.signature(entry).parameters)


def compare_files(before: Path, after: Path) -> None:
    """Print every figure of ``after`` that ``before`` has too, with its change (see `benchmarks._results`)."""
    try:
        documents = [json.loads(path.read_text(encoding="utf-8")) for path in (before, after)]
    except (OSError, ValueError) as exc:
        raise SystemExit(f"cannot read a results file: {exc}") from None
    changes = compare(documents[0], documents[1])
    if not changes:
        raise SystemExit(f"{before} and {after} have no figure in common (same module, table title and row labels)")
    print_table(
        f"{after.name} against {before.name}",
        ["module", "row", "figure", "before", "after", "change"],
        format_changes(changes),
        note=f"before: commit {documents[0].get('commit')}, load {documents[0].get('load_average_before')}; "
        f"after: commit {documents[1].get('commit')}, load {documents[1].get('load_average_before')}. "
        "Lower is better for times, higher for rates: read each figure's unit.",
    )


@dataclass(frozen=True)
class TreeState:
    """The checkout's commit and its uncommitted changes to tracked files (``git status --porcelain`` lines)."""

    commit: str
    changes: frozenset[str]


def tree_state() -> TreeState:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return TreeState(_git("rev-parse", "--short", "HEAD") or "unknown", frozenset(status.splitlines()))


def changed_during_run(start: TreeState, end: TreeState) -> list[str]:
    """What changed in the checkout while a run went on (a commit, or files edited): not what the run measured."""
    changed = [f"commit {start.commit} → {end.commit}"] if end.commit != start.commit else []
    return changed + sorted({line[3:] for line in start.changes ^ end.changes})


def results_path(tree: TreeState, *, quick: bool) -> Path:
    """``benchmarks/results/<date>-<short sha>[-dirty][-quick].json`` for a run started on ``tree``."""
    dirty = bool(tree.changes)
    name = f"{datetime.now(UTC):%Y-%m-%d}-{tree.commit}{'-dirty' if dirty else ''}{'-quick' if quick else ''}.json"
    return Path(__file__).resolve().parent / "results" / name


def machine_class() -> dict[str, str]:
    """What makes two machines' figures comparable for `make bench-check`: CPUs, architecture, Python major.minor
    and the processor model (two 2-CPU VMs of different processors differ by more than any tolerance)."""
    return {
        "cpus": str(os.cpu_count()),
        "arch": platform.machine(),
        "python": ".".join(platform.python_version_tuple()[:2]),
        "cpu": cpu_model(),
    }


def write_results(
    tables: Path,
    load_before: tuple[float, float, float],
    seconds: float,
    out: Path,
    *,
    quick: bool = False,
    tree: TreeState | None = None,
    pace_ms: float | None = None,
    other_cpu_share: Mapping[str, float | None] | None = None,
) -> Path:
    """The results document at ``out`` from the tables collected in ``tables`` (JSON lines); ``tree``: the checkout
    when the run started (its commit and whether it had uncommitted changes are what the run measured); ``pace_ms``:
    `machine_pace` measured before the run (how fast this machine ran plain Python then); ``other_cpu_share``: per
    module, the share of the machine's CPU that other processes took while it ran (`benchmarks._busy`)."""
    now = tree_state()
    start = tree or now
    stamp = datetime.now(UTC)
    document = {
        "date": stamp.isoformat(timespec="seconds"),
        "commit": start.commit,
        "dirty": bool(start.changes),
        "changed_during_run": changed_during_run(start, now),
        "quick": quick,
        "machine_class": machine_class(),
        "pace_ms": pace_ms,
        "command": " ".join(["python -m benchmarks", *sys.argv[1:]]),
        "seconds": round(seconds, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "other_cpu_share": {
            module: None if share is None else round(share, 3) for module, share in (other_cpu_share or {}).items()
        },
        "environment": dict(environment_rows()),
        "tables": [json.loads(line) for line in tables.read_text(encoding="utf-8").splitlines() if line.strip()],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tables.unlink(missing_ok=True)
    return out


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=Path(__file__).parent)
    return done.stdout.strip() if done.returncode == 0 else ""


def print_run_goals(recorded: Sequence[Mapping[str, Any]]) -> None:
    """When more than one module of the run has goals: every goal of the run in one table, with the tally (the
    ``recorded`` tables of the run; printed after its results file is written, so it is not one of them)."""
    modules = list(dict.fromkeys(str(t.get("module")) for t in recorded))
    entries = [(m, rows, None) for m in modules if (rows := goal_table(recorded, m)) is not None]
    if len(entries) < 2:
        return  # one module's goals were its last table
    rows = board(entries)
    print_table(
        f"Every goal of this run: {tally(rows)}",
        ["benchmark", "goal", "target", "measured", "verdict"],
        rows,
        note="Each module's own goal table, together (n/a: not measured in this run). Goals: benchmarks/_goals.py.",
    )


if __name__ == "__main__":
    run_main(main)
