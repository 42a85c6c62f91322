"""A foreign CLI does not outlive a hard-crashed harness: `loopd run --engine` is SIGKILLed mid-turn (no cleanup of
its own runs) and the CLI it started ends too (Linux parent-death signal)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.harness.foreign._engine import parent_death_signal
from tests.cli_run.conftest import LOOPD, child_env
from tests.support.waiting import wait_until

FAKE_CODEX = Path(__file__).resolve().parent / "fake_codex.py"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_cli_dies_with_a_sigkilled_harness(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    command = shlex.join([sys.executable, str(FAKE_CODEX)])
    args = ["run", "--workspace", str(workspace), "--data-dir", str(tmp_path / "data")]
    args += ["--engine", "codex", "--engine-command", command, "hang"]
    log = (tmp_path / "loopd.log").open("wb")
    harness = subprocess.Popen([str(LOOPD), *args], env=child_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        pid_file = workspace / "hang.pid"
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), what="the CLI to start its turn")
        cli = int(pid_file.read_text())
        assert _alive(cli)
        harness.send_signal(signal.SIGKILL)  # a hard crash: nothing of loopd's own shutdown runs
        harness.wait(30)
        wait_until(lambda: not _alive(cli), what="the CLI to end with its parent")
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait(30)
        log.close()


def test_the_preexec_hook_exists_only_on_linux() -> None:
    hook = parent_death_signal()
    assert (hook is not None) == sys.platform.startswith("linux")
    assert os.getpid() > 0
