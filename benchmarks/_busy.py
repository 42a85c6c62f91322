"""How busy the machine was with work that is not the benchmark's: other processes, and the hypervisor (steal).

Every figure a benchmark prints is a time, a rate or a ratio of two runs on the same machine, so anything else that
takes CPU meanwhile moves it — and on a 2-CPU machine a compiler, a test run or a noisy neighbour on the host moves
it by more than a goal's margin. `python -m benchmarks` samples the machine before and after each module and prints
the share of the machine's CPU capacity (every CPU, over the module's wall time) that went to anything outside
its own process tree; above `CAUTION_SHARE` it says that the module's figures and verdicts come from a busy machine.
The shares go into the results file (``other_cpu_share``, per module).

What counts as the benchmark's own CPU: the runner's process and every process below it that is alive at a sample
(servers, peers, load generators), each with the CPU of the children it has already reaped. A process below it
that ends and is reaped by an intermediate process still alive at the next sample is counted as its parent's; one
reparented to init before it ends is not counted at all (it then shows as "other"). Linux only (``/proc``); elsewhere
there is nothing to sample and nothing is printed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CAUTION_SHARE: Final = 0.10
"""Above this share of the machine's CPU taken by others during a module, its figures are flagged as unreliable."""
PROC: Final = Path("/proc")


@dataclass(frozen=True, slots=True)
class CpuSample:
    """The machine's busy CPU time and this process tree's, at one moment (seconds)."""

    at: float
    """`time.monotonic` when sampled."""
    busy: float
    """CPU seconds the machine has spent busy since boot, every CPU summed, steal included (``/proc/stat``)."""
    ours: float
    """CPU seconds of the sampling process's tree: itself and its live descendants, with their reaped children."""


def children_map(proc: Path = PROC) -> dict[int, list[int]]:
    """Every live process's children, by parent pid (read from ``/proc/<pid>/stat``; a process that ends meanwhile
    is skipped)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    """``pid`` and every process below it in ``children`` (`children_map`)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def stat_ticks(pid: int, *, reaped: bool, proc: Path = PROC) -> int:
    """Clock ticks of user + system CPU of process ``pid`` (with ``reaped``: plus those of the children it has
    reaped, ``cutime`` + ``cstime``)."""
    text = (proc / str(pid) / "stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the whole line)
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks


def machine_busy_ticks(proc: Path = PROC) -> int:
    """Clock ticks every CPU has spent busy since boot: user, nice, system, irq, softirq and steal of ``/proc/stat``'s
    ``cpu`` line (guest time is already part of user); idle and iowait are not busy."""
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            user, nice, system, _idle, _iowait, irq, softirq, steal = (values + [0] * 8)[:8]
            return user + nice + system + irq + softirq + steal
    raise ValueError("/proc/stat has no cpu line")


def cpu_sample(pid: int | None = None, proc: Path = PROC) -> CpuSample | None:
    """The machine's and ``pid``'s tree's CPU now (default: this process); None where ``/proc`` cannot say."""
    root = os.getpid() if pid is None else pid
    hz = os.sysconf("SC_CLK_TCK")
    try:
        busy = machine_busy_ticks(proc)
        ours = 0
        for member in descendants(root, children_map(proc)):
            try:
                ours += stat_ticks(member, reaped=True, proc=proc)
            except (OSError, ValueError, IndexError):
                continue  # it ended meanwhile
    except (OSError, ValueError):
        return None
    return CpuSample(time.monotonic(), busy / hz, ours / hz)


def others_share(before: CpuSample | None, after: CpuSample | None, cpus: int | None = None) -> float | None:
    """The share (0–1) of the machine's CPU capacity between two samples that went to anything but the sampled tree;
    None when either sample is missing or no time passed. Clock ticks make short spans coarse (±1 tick per CPU)."""
    if before is None or after is None:
        return None
    wall = after.at - before.at
    count = cpus or os.cpu_count() or 1
    if wall <= 0:
        return None
    others = (after.busy - before.busy) - (after.ours - before.ours)
    return min(1.0, max(0.0, others / (wall * count)))


def busy_modules(shares: object) -> list[tuple[str, float]]:
    """The modules of a results file's ``other_cpu_share`` (a mapping; anything else: none) that ran while others
    took more than `CAUTION_SHARE` of the machine, with their shares."""
    if not isinstance(shares, dict):
        return []
    return [
        (str(module), float(share))
        for module, share in shares.items()
        if isinstance(share, int | float) and not isinstance(share, bool) and share > CAUTION_SHARE
    ]


def busy_note(module: str, share: float | None) -> str | None:
    """The line printed after a module: how much of the machine others took, and a caution above `CAUTION_SHARE`."""
    if share is None:
        return None
    line = f"other processes used {share:.0%} of the machine's CPU during benchmarks.{module}"
    if share <= CAUTION_SHARE:
        return line
    return (
        f"caution: {line} (more than {CAUTION_SHARE:.0%}): its figures and goal verdicts come from a busy machine; "
        "re-run it on a quiet one before judging them"
    )
