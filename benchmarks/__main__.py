"""`make bench`: run every benchmark module and print their tables.

python -m benchmarks [--quick] [--repeat N] [--markdown PATH] [module ...]

Modules whose ``main`` takes an ``argv`` get ``--repeat N`` (and ``--quick``); the others run with their own
defaults (``--quick`` shrinks the known ones). ``--markdown PATH`` also writes every table to PATH as Markdown.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import pkgutil
import sys
import time
from pathlib import Path

from benchmarks._common import MARKDOWN_ENV, print_environment

# Smaller settings for modules that do not take --quick themselves.
QUICK_ARGV = {"reconcile_latency": ["--count", "50", "--burst", "50"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="run only these benchmark modules")
    parser.add_argument("--quick", action="store_true", help="one repetition and smaller sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; medians are reported (default 3)")
    parser.add_argument("--markdown", type=Path, default=None, help="also append every table to this file")
    args = parser.parse_args()
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
    for name in names:
        if args.modules and name not in args.modules:
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        entry = getattr(module, "main", None)
        if entry is None:
            continue
        print(f"\n== benchmarks.{name} ==", flush=True)
        t0 = time.perf_counter()
        if inspect.signature(entry).parameters:
            entry(["--repeat", str(args.repeat), *(["--quick"] if args.quick else [])])
        else:
            saved = sys.argv
            sys.argv = [name, *(QUICK_ARGV.get(name, []) if args.quick else [])]
            try:
                entry()
            finally:
                sys.argv = saved
        print(f"(benchmarks.{name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"\nall benchmarks: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
