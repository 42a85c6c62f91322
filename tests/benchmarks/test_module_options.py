"""`python -m benchmarks MODULE --its-own-options`: options the runner does not know go to the one named module
(``server_streams --subscribers 1000,5000``, the issue-18 acceptance command); with several modules, or a module
whose ``main`` takes no options, they are refused before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.__main__ import _takes_argv

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True, timeout=50
    )


def test_a_modules_own_options_need_exactly_one_module_that_takes_them() -> None:
    assert _takes_argv("server_streams")
    assert not _takes_argv("no_such_module")
    refused = _run("peers", "server_streams", "--subscribers", "5")
    assert refused.returncode == 2
    assert "unrecognized arguments: --subscribers 5" in refused.stderr
    assert "exactly one module" in refused.stderr
    assert "==" not in refused.stdout  # nothing ran


def test_a_single_modules_options_reach_its_parser() -> None:
    # The module's own parser sees the option: a bad value is its error, not the runner's "unrecognized".
    bad = _run("server_streams", "--rate", "not-a-number")
    assert bad.returncode == 2
    assert "--rate: 'not-a-number' is not a number" in bad.stderr
    assert "unrecognized arguments" not in bad.stderr


def test_a_named_results_file_needs_the_modules_it_holds(tmp_path: Path) -> None:
    out = tmp_path / "tracing.json"
    refused = _run("--results", "--out", str(out))
    assert refused.returncode == 2
    assert "--out names the results file of the modules you list" in refused.stderr
    assert "==" not in refused.stdout and not out.exists()  # nothing ran


def test_help_after_one_module_shows_that_modules_options_under_the_command_run() -> None:
    shown = _run("server_streams", "--help")
    assert shown.returncode == 0
    assert shown.stdout.startswith("usage: python -m benchmarks server_streams ")
    assert "--subscribers" in shown.stdout
    runner = _run("--help")
    assert runner.returncode == 0
    assert runner.stdout.startswith("usage: python -m benchmarks ")
    assert "--compare" in runner.stdout and "run only these benchmark modules" in runner.stdout


def test_a_modules_errors_name_the_command_that_was_run() -> None:
    bad = _run("server_chats", "--chats", "x")
    assert bad.returncode == 2
    assert "python -m benchmarks server_chats: error: argument --chats" in bad.stderr
    assert "__main__.py" not in bad.stderr
