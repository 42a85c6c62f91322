"""`loopd run` records its model traffic to a cassette and replays it with the provider unreachable: recorded in this
process (`run_harness`), replayed by the real `loopd` process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loopd.harness.models import CassetteSettings
from tests.cli_run.conftest import LOOPD, TIMEOUT, Dirs, RunningServer, child_env, run_captured

UNREACHABLE = "http://127.0.0.1:9/v1"
PROMPT = "please list files"


async def test_a_recorded_run_replays_without_the_provider(
    dirs: Dirs, scripted_server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nunattended: approve\nkinds: {fs.read: allow}\n")
    cassette = tmp_path / "run.yaml"
    for name, value in CassetteSettings(path=cassette, mode="record").env().items():
        monkeypatch.setenv(name, value)

    recorded = await run_captured(dirs, model="scripted", base_url=scripted_server.url, policy=policy, prompt=PROMPT)
    asked = scripted_server.server.statistics().requests
    replayed = subprocess.run(
        [str(LOOPD), *dirs.args("--model", "scripted", "--base-url", UNREACHABLE, "--policy", str(policy), PROMPT)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=child_env() | CassetteSettings(path=cassette).env(),
        timeout=TIMEOUT,
        check=False,
    )

    assert recorded.code == 0, recorded.stderr
    assert replayed.returncode == 0, replayed.stderr
    assert asked == 2  # the tool call, then the answer after the tool's result
    assert "notes.txt" in recorded.stdout and replayed.stdout == recorded.stdout
    assert scripted_server.server.statistics().requests == asked  # the replay asked nobody
    assert cassette.read_text().count("\nrequest:") == 2
