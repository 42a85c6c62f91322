"""`make bench-check`: the quick benchmarks against the last committed results of the same machine class.

python -m benchmarks._check [--baseline FILE] [--current FILE] [--tolerances FILE] [module ...]

Without ``--current`` it first runs ``python -m benchmarks --quick --results --out FILE`` (the modules given, or
`DEFAULT_MODULES`); the new file is left in benchmarks/results/ (``…-quick.json``) so it can be committed as the next
baseline. The baseline is the newest *committed* results file (``git ls-files benchmarks/results``) of the same
machine class (`machine_class`: CPUs, architecture, Python major.minor, processor model) and of the same kind (quick
or full: their tables differ in size), and of about the same pace: two VMs sold under one processor name ran plain
Python ×4 apart, so a file records `machine_pace` (ms for a fixed piece of Python, before its run) and only a
baseline within ``PACE_TOLERANCE`` of the current run's pace is taken (a file without one only when no file with
one matches). Every figure present in both and matched by a rule of
benchmarks/tolerances.toml is judged: worse by more than the rule's percent → REGRESSED. Prints figure / baseline /
now / change / verdict; exits 1 on any regression, 2 when there is nothing to compare against. Not part of
``make test``.

`judge` and `machine_class` are pure and tested (tests/benchmarks/test_check.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks._busy import CAUTION_SHARE, busy_modules
from benchmarks._children import run_main, run_to_end
from benchmarks._results import Change, compare

__all__ = ["PACE_TOLERANCE", "Judged", "Rule", "judge", "load_rules", "machine_class", "pace_of", "pick_baseline"]

PACE_TOLERANCE = 0.25
"""How far a baseline's pace may be from the current run's (as a fraction of the current one) to be compared."""

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TOLERANCES = ROOT / "benchmarks" / "tolerances.toml"
DEFAULT_MODULES = ("harness_core", "long_conversation", "peers", "server_chats", "server_streams")


@dataclass(frozen=True)
class Rule:
    """Figures of ``module`` whose column matches ``column`` (and row, ``row``) may get worse (in direction ``better``)
    by ``percent``; ``better = "ignore"``: figures it matches are not judged (a peer's own figures, a coarse one)."""

    module: str
    column: str
    better: Literal["lower", "higher", "ignore"]
    percent: float
    row: str = "*"

    def matches(self, change: Change) -> bool:
        """Whether this rule decides ``change``."""
        return (
            fnmatch.fnmatchcase(change.module, self.module)
            and fnmatch.fnmatchcase(change.column, self.column)
            and fnmatch.fnmatchcase(change.row, self.row)
        )


@dataclass(frozen=True)
class Judged:
    """One figure with its verdict: ``ok``, ``improved`` or ``REGRESSED``."""

    change: Change
    rule: Rule
    verdict: str

    @property
    def figure(self) -> str:
        """Where the figure is: module · row · column."""
        return f"{self.change.module} · {self.change.row} · {self.change.column}"


class ToleranceError(ValueError):
    """benchmarks/tolerances.toml is malformed."""


def load_rules(text: str) -> tuple[Rule, ...]:
    """The rules of a tolerances file, in order."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToleranceError(f"tolerances: {exc}") from None
    rules: list[Rule] = []
    for index, entry in enumerate(data.get("figure") or ()):
        better, percent = entry.get("better"), entry.get("percent", 0 if entry.get("better") == "ignore" else None)
        if better not in ("lower", "higher", "ignore") or not isinstance(percent, (int, float)) or percent < 0:
            raise ToleranceError(
                f"tolerances: figure #{index + 1} needs better = lower|higher and percent >= 0, or better = ignore"
            )
        module, column, row = (str(entry.get(key, "*")) for key in ("module", "column", "row"))
        rules.append(Rule(module, column, better, float(percent), row))
    return tuple(rules)


def judge(changes: Iterable[Change], rules: Sequence[Rule]) -> list[Judged]:
    """The verdict of every change some rule matches (the first match decides); the others are left out."""
    judged: list[Judged] = []
    for change in changes:
        rule = next((r for r in rules if r.matches(change)), None)
        if rule is None or rule.better == "ignore":
            continue
        if change.before == 0:
            worse = change.after > 0 if rule.better == "lower" else change.after < 0
            verdict = "REGRESSED" if worse else "ok"
        else:
            percent = (change.after - change.before) / abs(change.before) * 100.0
            worse_by = percent if rule.better == "lower" else -percent
            verdict = "REGRESSED" if worse_by > rule.percent else "improved" if worse_by < -rule.percent else "ok"
        judged.append(Judged(change, rule, verdict))
    return judged


def machine_class(document: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(CPUs, architecture, Python major.minor, processor model) of a results file: recorded, or read from its
    environment table (files written before the processor model was recorded name it there)."""
    environment = document.get("environment") or {}
    cpu = str(environment.get("CPU", "?"))
    recorded = document.get("machine_class")
    if isinstance(recorded, Mapping):
        cpu = str(recorded.get("cpu", cpu))
        return (str(recorded.get("cpus")), str(recorded.get("arch")), str(recorded.get("python")), cpu)
    cpus = str(environment.get("CPUs (os.cpu_count)", "?"))
    found = re.search(r"\b(x86_64|aarch64|arm64|i686|ppc64le|s390x)\b", str(environment.get("OS", "")))
    version = re.search(r"(\d+\.\d+)", str(environment.get("Python", "")))
    return (cpus, found.group(1) if found else "?", version.group(1) if version else "?", cpu)


def _pace_text(document: Mapping[str, Any]) -> str:
    pace = pace_of(document)
    return "" if pace is None else f" at about its pace ({pace:g} ms ± {PACE_TOLERANCE:.0%})"


def is_quick(document: Mapping[str, Any]) -> bool:
    """Whether a results file comes from a ``--quick`` run."""
    return bool(document.get("quick", "--quick" in str(document.get("command", "")).split()))


def pace_of(document: Mapping[str, Any]) -> float | None:
    """The `machine_pace` a results file recorded before its run (ms; None for a file from before it was)."""
    pace = document.get("pace_ms")
    return float(pace) if isinstance(pace, int | float) and not isinstance(pace, bool) and pace > 0 else None


def pick_baseline(
    candidates: Iterable[tuple[str, Mapping[str, Any]]],
    current: Mapping[str, Any],
    *,
    pace_tolerance: float | None = PACE_TOLERANCE,
) -> tuple[str, Mapping[str, Any]] | None:
    """The newest candidate (by its ``date``) of ``current``'s machine class and kind, with a figure in common, and
    of about its pace (within ``pace_tolerance``); one that recorded no pace only when none that did matches. A
    current run without a pace, or ``pace_tolerance=None`` (a baseline named by hand), takes the newest of its
    class and kind."""
    wanted = (machine_class(current), is_quick(current))
    usable = [
        (name, doc)
        for name, doc in candidates
        if (machine_class(doc), is_quick(doc)) == wanted and compare(doc, current) and doc.get("date")
    ]
    pace = pace_of(current)
    if pace is not None and pace_tolerance is not None:
        paces = [(item, pace_of(item[1])) for item in usable]
        limit = pace_tolerance * pace
        matching = [item for item, theirs in paces if theirs is not None and abs(theirs - pace) <= limit]
        usable = matching or [item for item, theirs in paces if theirs is None]
    return max(usable, key=lambda item: str(item[1].get("date")), default=None)


def committed_results() -> list[tuple[str, Mapping[str, Any]]]:
    """Every results file git tracks, parsed (unreadable ones skipped)."""
    listed = subprocess.run(
        ["git", "ls-files", "benchmarks/results/*.json"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    out: list[tuple[str, Mapping[str, Any]]] = []
    for name in listed.stdout.split():
        try:
            out.append((name, json.loads((ROOT / name).read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return out


def _run_quick(modules: Sequence[str], out: Path) -> None:
    command = [sys.executable, "-m", "benchmarks", "--quick", "--results", "--out", str(out), *modules]
    status = run_to_end(command, cwd=ROOT)
    if status != 0 or not out.exists():
        raise SystemExit(f"the quick run failed ({' '.join(command[1:])} exited {status})")


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or read) the current figures, pick the baseline, print the verdicts; exit 1 on a regression."""
    from benchmarks._common import print_table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help=f"benchmark modules (default {' '.join(DEFAULT_MODULES)})")
    parser.add_argument("--current", type=Path, default=None, help="a results file to check instead of running")
    parser.add_argument("--baseline", type=Path, default=None, help="compare against this file instead")
    parser.add_argument("--tolerances", type=Path, default=TOLERANCES)
    args = parser.parse_args(argv)
    try:
        rules = load_rules(args.tolerances.read_text(encoding="utf-8"))
    except (OSError, ToleranceError) as exc:
        raise SystemExit(f"cannot read the tolerances ({args.tolerances}): {exc}") from None
    current_path = args.current
    if current_path is None:
        from benchmarks.__main__ import results_path, tree_state

        current_path = results_path(tree_state(), quick=True)
        _run_quick(args.modules or DEFAULT_MODULES, current_path)
    try:
        current = json.loads(current_path.read_text(encoding="utf-8"))
        candidates = (
            [(str(args.baseline), json.loads(args.baseline.read_text(encoding="utf-8")))]
            if args.baseline
            else committed_results()
        )
    except (OSError, ValueError) as exc:
        raise SystemExit(f"cannot read a results file: {exc}") from None
    picked = pick_baseline(candidates, current, pace_tolerance=None if args.baseline else PACE_TOLERANCE)
    if picked is None:
        print(
            f"no committed {'quick ' if is_quick(current) else ''}results file of machine class "
            f"{'/'.join(machine_class(current))}{_pace_text(current)} shares a figure with {current_path}: "
            "commit it as the baseline "
            f"(git add {current_path.relative_to(ROOT) if current_path.is_relative_to(ROOT) else current_path})",
            file=sys.stderr,
        )
        raise SystemExit(2)
    name, baseline = picked
    judged = judge(compare(baseline, current), rules)
    rows = [
        (
            j.figure,
            f"{j.change.before:,.3f}",
            f"{j.change.after:,.3f}",
            "n/a" if j.change.percent is None else f"{j.change.percent:+.1f} %",
            f"{j.verdict} ({j.rule.better} is better, ±{j.rule.percent:g} %)",
        )
        for j in judged
    ]
    print_table(
        f"bench-check: {current_path.name} against {Path(name).name}",
        ["figure", "baseline", "now", "change", "verdict"],
        rows,
        note=f"machine class {'/'.join(machine_class(current))}; pace (ms of plain Python, lower is faster): "
        f"baseline {pace_of(baseline) or 'not recorded'}, now {pace_of(current) or 'not recorded'}; "
        "load average before: baseline "
        f"{baseline.get('load_average_before')}, now {current.get('load_average_before')} (a busy machine "
        "explains a regression; re-run on a quiet one before believing it). Tolerances: benchmarks/tolerances.toml.",
    )
    regressed = [j for j in judged if j.verdict == "REGRESSED"]
    busy = busy_modules(current.get("other_cpu_share"))
    if busy:
        named = ", ".join(f"{module} ({share:.0%})" for module, share in busy)
        print(
            f"caution: other processes took more than {CAUTION_SHARE:.0%} of the machine's CPU while these ran: "
            f"{named}; their figures may have moved with the machine, not the code (re-run on a quiet one)"
        )
    print(f"{len(judged)} figures judged, {len(regressed)} regressed")
    if regressed:
        raise SystemExit(1)


if __name__ == "__main__":
    run_main(main)
