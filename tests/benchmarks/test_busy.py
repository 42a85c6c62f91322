"""`benchmarks._busy`: the share of the machine's CPU that went to anything but the benchmark while a module ran —
read from ``/proc`` (a fake one for the arithmetic, the real one for what counts as the benchmark's own), printed
after each module (a caution above 10 %) and kept in the results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmarks._busy import (
    CAUTION_SHARE,
    CpuSample,
    busy_note,
    children_map,
    cpu_sample,
    descendants,
    machine_busy_ticks,
    others_share,
    stat_ticks,
)

ROOT = Path(__file__).resolve().parents[2]
HZ_TICKS = "cpu  100 5 20 900 30 1 2 7 0 0\ncpu0 50 2 10 450 15 0 1 3 0 0\nintr 1 2 3\n"


def _fake_proc(tmp_path: Path, processes: dict[int, tuple[int, int, int, int, int]]) -> Path:
    """A /proc with ``/proc/stat`` and one ``stat`` per pid: (parent, utime, stime, cutime, cstime)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(HZ_TICKS)
    (proc / "self").mkdir()  # not a pid: skipped
    for pid, (parent, utime, stime, cutime, cstime) in processes.items():
        (proc / str(pid)).mkdir()
        # a command name with spaces and parentheses: fields are read after the last ")"
        fields = ["S", parent, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, cutime, cstime, 20, 0, 1, 0, 5]
        (proc / str(pid) / "stat").write_text(f"{pid} (odd (name) x) " + " ".join(map(str, fields)) + "\n")
    return proc


def test_busy_ticks_count_user_nice_system_irq_softirq_and_steal_not_idle_or_iowait(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {})
    assert machine_busy_ticks(proc) == 100 + 5 + 20 + 1 + 2 + 7
    (proc / "stat").write_text("intr 1\n")
    with pytest.raises(ValueError, match="no cpu line"):
        machine_busy_ticks(proc)


def test_the_tree_is_every_live_process_below_the_root_with_the_children_each_reaped(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        {
            10: (1, 100, 50, 30, 20),  # the runner: 150 of its own, 50 of children it reaped
            11: (10, 40, 10, 0, 0),  # a server it started
            12: (11, 5, 5, 7, 3),  # the server's worker, with a reaped child of its own
            20: (1, 900, 900, 0, 0),  # someone else's process
        },
    )
    children = children_map(proc)
    assert sorted(descendants(10, children)) == [10, 11, 12]
    assert stat_ticks(12, reaped=False, proc=proc) == 10
    assert stat_ticks(12, reaped=True, proc=proc) == 20
    sample = cpu_sample(10, proc)
    assert sample is not None
    hz = os.sysconf("SC_CLK_TCK")
    assert sample.ours == pytest.approx((200 + 50 + 20) / hz)
    assert sample.busy == pytest.approx(135 / hz)
    assert cpu_sample(10, tmp_path / "nowhere") is None  # no /proc: nothing to say


def test_the_share_is_others_cpu_over_the_machines_capacity_bounded_to_0_1() -> None:
    before = CpuSample(at=100.0, busy=50.0, ours=10.0)
    after = CpuSample(at=110.0, busy=62.0, ours=20.0)  # 12 s busy, 10 of them ours, over 10 s x 2 CPUs
    assert others_share(before, after, cpus=2) == pytest.approx(0.1)
    assert others_share(before, CpuSample(at=110.0, busy=55.0, ours=20.0), cpus=2) == 0.0  # ticks: never below 0
    assert others_share(before, CpuSample(at=101.0, busy=90.0, ours=10.0), cpus=2) == 1.0
    assert others_share(None, after) is None
    assert others_share(after, after) is None  # no time passed


def test_the_note_states_the_share_and_cautions_only_above_the_threshold() -> None:
    quiet = busy_note("peers", 0.03)
    assert quiet == "other processes used 3% of the machine's CPU during benchmarks.peers"
    busy = busy_note("peers", CAUTION_SHARE + 0.25)
    assert busy is not None and busy.startswith("caution: other processes used 35% of the machine's CPU")
    assert "busy machine" in busy and "re-run" in busy
    assert busy_note("peers", None) is None


_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"


def test_a_childs_cpu_is_the_benchmarks_own_and_a_detached_process_is_someone_elses(tmp_path: Path) -> None:
    before = cpu_sample()
    subprocess.run([sys.executable, "-c", _BURN.format(seconds=0.4)], check=True, timeout=30)
    after = cpu_sample()
    assert before is not None and after is not None
    assert after.ours - before.ours >= 0.35  # the reaped child's CPU is counted as ours

    done = tmp_path / "done"
    script = _BURN.format(seconds=0.4) + f"open({str(done)!r}, 'w').close()\n"
    before = cpu_sample()
    # ``sh`` starts the burner in the background and exits: the burner is reparented away from this process.
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 &', script], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not done.exists():
        assert time.monotonic() < deadline, "the detached burner did not finish"
        time.sleep(0.05)
    time.sleep(0.05)
    after = cpu_sample()
    assert before is not None and after is not None
    assert after.busy - before.busy >= 0.35  # the machine was busy...
    assert after.ours - before.ours < 0.2  # ...but not with this process's tree (sh's own start-up at most)


def test_the_runner_prints_the_share_after_each_module_and_keeps_it_in_the_results_file(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--results", "--out", str(out), "reconcile_latency"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "of the machine's CPU during benchmarks.reconcile_latency" in run.stdout
    share = json.loads(out.read_text())["other_cpu_share"]["reconcile_latency"]
    assert isinstance(share, float) and 0.0 <= share <= 1.0
