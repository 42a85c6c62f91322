"""Generated sections of docs/BENCHMARKS.md and docs/SCALING.md, rendered from committed results files (no
hand-edited figures).

A generated section is everything between a start marker and ``<!-- /generated -->``::

    <!-- generated:server_chats from results/2026-12-01-9dd453f-dirty.json -->
    … (written by this module: a line naming the file, command, commit and load, then every table the file holds
    for that benchmark module, in the order they were printed) …
    <!-- /generated -->

NAME is a benchmark module; FILE is relative to benchmarks/. Prose stays outside the markers.

A document may also hold one *goal board*: ``<!-- generated:goals -->`` … ``<!-- /generated -->``. Its body is
rendered from the document's own sections — every "Goals: NAME" table the results file of each section holds, in
the sections' order, one row per goal with its verdict and the file it comes from — so it changes exactly when a
section is repointed, and ``--check`` catches a hand edit of it too.

python -m benchmarks._docs                 regenerate every section from the file its marker names
python -m benchmarks._docs --from FILE     point every section whose module FILE has tables for at FILE, regenerate
                                          (docs/SCALING.md only when FILE has every one of its sections: `ONE_RUN`)
python -m benchmarks._docs --check         exit 1 if a section differs from what its file renders (hand edits)
python -m benchmarks._docs --docs PATH     only that document (default: every one of `GENERATED`)

`render_section`, `sections` and `update` are pure; tests/benchmarks/test_docs.py checks the generator is
deterministic and that every generated document matches the files it names.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from benchmarks._common import markdown_table
from benchmarks._goals import board, goal_table, tally

__all__ = [
    "DOCS",
    "GENERATED",
    "SCALING",
    "Section",
    "regenerate",
    "render_board",
    "render_section",
    "sections",
    "update",
]

BENCHMARKS = Path(__file__).resolve().parent
DOCS = BENCHMARKS.parent / "docs" / "BENCHMARKS.md"
SCALING = BENCHMARKS.parent / "docs" / "SCALING.md"
GENERATED: Final = (DOCS, SCALING)
"""The documents with generated sections."""
ONE_RUN: Final = frozenset({SCALING})
"""Documents whose sections all come from one run (the scaling run's figures are read together): a results file
repoints them only when it has tables for every one of their sections — a lone server_chats run repoints
docs/BENCHMARKS.md's section, not docs/SCALING.md's."""
END = "<!-- /generated -->"
_SECTION = re.compile(
    r"<!-- generated:(?P<name>[A-Za-z0-9_]+) from (?P<file>[^ ]+\.json) -->\n(?P<body>.*?)" + re.escape(END),
    re.DOTALL,
)
BOARD = "<!-- generated:goals -->"
_BOARD = re.compile(re.escape(BOARD) + r"\n(?P<body>.*?)" + re.escape(END), re.DOTALL)


class DocsError(ValueError):
    """A marker names a file that cannot be read, or a module the file has no table for."""


@dataclass(frozen=True)
class Section:
    """One generated section: the module it shows, the results file (relative to benchmarks/), its current body."""

    name: str
    file: str
    body: str


def sections(text: str) -> list[Section]:
    """The generated sections of a document, in order."""
    return [Section(m["name"], m["file"], m["body"]) for m in _SECTION.finditer(text)]


def has_tables(document: Mapping[str, Any], name: str) -> bool:
    """Whether a results document holds any table of module ``name``."""
    return any(t.get("module") == name for t in document.get("tables") or ())


def _changed(document: Mapping[str, Any]) -> str:
    changed = document.get("changed_during_run") or []
    return f" (changed in the checkout during the run, not measured: {', '.join(changed)})" if changed else ""


def render_section(document: Mapping[str, Any], name: str, file: str) -> str:
    """The body of section ``name`` from a results document (pure: the same document gives the same bytes)."""
    tables = [t for t in document.get("tables") or () if t.get("module") == name]
    if not tables:
        raise DocsError(f"{file} has no table of benchmark module {name!r}")
    load = document.get("load_average_before") or []
    header = (
        f"_Generated from `benchmarks/{file}` by `python -m benchmarks._docs` — run `{document.get('command')}` at "
        f"commit {document.get('commit')}{' (uncommitted changes)' if document.get('dirty') else ''}, "
        f"{document.get('date')}, load average before {' / '.join(f'{x:g}' for x in load) or 'unknown'}"
        f"{_changed(document)}. Do not edit by hand._"
    )
    parts = [header]
    for table in tables:
        parts.append(
            markdown_table(
                str(table.get("title", "")), table.get("columns") or [], table.get("rows") or [], table.get("note", "")
            )
        )
    return "\n\n".join(parts) + "\n"


def update(
    text: str,
    load: Callable[[str], Mapping[str, Any]],
    *,
    repoint: tuple[str, Mapping[str, Any]] | None = None,
    one_run: bool = False,
) -> tuple[str, list[str]]:
    """``text`` with every generated section re-rendered; ``load(file)`` reads a results file (relative path).

    With ``repoint=(file, document)``, a section whose module that document has tables for is pointed at it first —
    with ``one_run``, only if it has tables for every section of ``text`` (else none is). Returns the new text and
    the names of the sections that changed.
    """
    changed: list[str] = []
    if repoint is not None and one_run and not all(has_tables(repoint[1], s.name) for s in sections(text)):
        repoint = None

    def replace(match: re.Match[str]) -> str:
        name, file = match["name"], match["file"]
        if repoint is not None and has_tables(repoint[1], name):
            file = repoint[0]
        body = render_section(load(file), name, file)
        if body != match["body"] or file != match["file"]:
            changed.append(name)
        return f"<!-- generated:{name} from {file} -->\n{body}{END}"

    text = _SECTION.sub(replace, text)
    board = _BOARD.search(text)
    if board is not None:
        body = render_board([(section, load(section.file)) for section in sections(text)])
        if body != board["body"]:
            changed.append("goals")
        text = text[: board.start()] + f"{BOARD}\n{body}{END}" + text[board.end() :]
    return text, changed


def render_board(shown: Sequence[tuple[Section, Mapping[str, Any]]]) -> str:
    """The goal board's body: the goal table of each section's module from that section's results file, in order
    (pure). Sections of modules without goals, and repeats of a module, add nothing."""
    entries = []
    for section, document in shown:
        found = goal_table(document.get("tables") or (), section.name)
        if found is not None:
            entries.append((section.name, found, f"{section.file.removeprefix('results/')} ({document.get('commit')})"))
    rows = board(entries)
    note = (
        "Rendered by `python -m benchmarks._docs` from the results files the generated sections below name (the "
        "module's own goal table in each; targets in `benchmarks/_goals.py`). Do not edit by hand."
    )
    columns = ["benchmark", "goal", "target", "measured", "verdict", "results file (commit)"]
    return markdown_table(f"Every goal, as shipped: {tally(rows)}", columns, rows, note) + "\n"


def _loader(cache: dict[str, Mapping[str, Any]]) -> Callable[[str], Mapping[str, Any]]:
    def load(file: str) -> Mapping[str, Any]:
        if file not in cache:
            try:
                cache[file] = json.loads((BENCHMARKS / file).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise DocsError(f"cannot read benchmarks/{file}: {exc}") from None
        return cache[file]

    return load


def results_name(source: Path) -> str:
    """``source`` (a path from here, or relative to benchmarks/) as the results file's path under benchmarks/;
    `DocsError` when there is no such file or it lies outside benchmarks/."""
    found = next((path for path in (source, BENCHMARKS / source) if path.is_file()), None)
    if found is None:
        raise DocsError(f"no results file {source}: give one under benchmarks/results/, e.g. --from {_EXAMPLE}")
    resolved = found.resolve()
    if not resolved.is_relative_to(BENCHMARKS):
        raise DocsError(f"{source} is not under benchmarks/: the docs name results files there, e.g. {_EXAMPLE}")
    return resolved.relative_to(BENCHMARKS).as_posix()


_EXAMPLE: Final = "benchmarks/results/<date>-<commit>-<name>.json"


def regenerate(docs: Path, results: Path | None = None) -> list[str]:
    """Rewrite ``docs`` in place (optionally repointing sections at ``results``); the sections that changed."""
    cache: dict[str, Mapping[str, Any]] = {}
    repoint = None
    if results is not None:
        relative = results_name(results)
        repoint = (relative, _loader(cache)(relative))
    text, changed = update(
        docs.read_text(encoding="utf-8"), _loader(cache), repoint=repoint, one_run=docs.resolve() in ONE_RUN
    )
    docs.write_text(text, encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> None:
    """Regenerate (or check) the generated sections of docs/BENCHMARKS.md and docs/SCALING.md."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="source", type=Path, default=None, help="a results file under benchmarks/")
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a section is out of date")
    parser.add_argument("--docs", type=Path, default=None, help="only this document (default: every generated one)")
    args = parser.parse_args(argv)
    documents = (args.docs,) if args.docs is not None else GENERATED
    try:
        if args.check:
            stale = []
            for document in documents:
                _, changed = update(document.read_text(encoding="utf-8"), _loader({}))
                stale += [f"{document.name}: {name}" for name in changed]
            if stale:
                print(f"out of date (edited by hand?): {', '.join(stale)}; run python -m benchmarks._docs")
                raise SystemExit(1)
            print("every generated section matches its results file")
            return
        regenerated = [
            f"{document.name}: {name}" for document in documents for name in regenerate(document, args.source)
        ]
    except (DocsError, ValueError) as exc:
        raise SystemExit(str(exc)) from None
    print(f"regenerated: {', '.join(regenerated) or 'nothing changed'}", file=sys.stderr)


if __name__ == "__main__":
    main()
