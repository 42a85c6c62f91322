"""`make bench`: run every benchmark module side by side and print their tables."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    only = set(sys.argv[1:])
    for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda i: i.name):
        if info.name.startswith("_") or (only and info.name not in only):
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        entry = getattr(module, "main", None)
        if entry is None:
            continue
        print(f"\n== benchmarks.{info.name} ==", flush=True)
        saved = sys.argv
        sys.argv = [info.name]
        try:
            entry()
        finally:
            sys.argv = saved


if __name__ == "__main__":
    main()
