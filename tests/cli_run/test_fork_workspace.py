"""`loopd run --fork` and the workspace: kept as it is (with a note), restored into a new directory
(``--fork-workspace DIR``, the real process), or in place only when asked (``--restore-workspace``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cli_run.conftest import Dirs, plain, run_captured, run_plain, session_id_in

MILK = "remember the milk\n"


def test_a_fork_restores_the_snapshot_into_its_own_directory(dirs: Dirs, tmp_path: Path) -> None:
    first = run_plain(dirs.args("hello"))
    assert first.returncode == 0, first.stderr
    original = session_id_in(first.stderr)
    (dirs.workspace / "notes.txt").write_text("changed since\n")  # after the original's last snapshot
    own = tmp_path / "fork-ws"
    forked = run_plain(dirs.args("--fork", original, "--fork-workspace", str(own), "and then?"))
    assert forked.returncode == 0, forked.stderr
    err = plain(forked.stderr)
    assert (own / "notes.txt").read_text() == MILK  # as it was at the fork point
    assert own.stat().st_mode & 0o777 == 0o700  # created private: it holds copies of the original's files
    assert (dirs.workspace / "notes.txt").read_text() == "changed since\n"  # the original's workspace untouched
    assert f"the workspace {own} is as it was at the fork point" in err
    assert f"--workspace {own}" in err  # the resume hint names the fork's own directory
    assert "You said: “and then?”" in forked.stdout


async def test_restore_in_place_only_when_asked_and_bad_combinations(dirs: Dirs, tmp_path: Path) -> None:
    first = await run_captured(dirs, prompt="hello")
    assert first.code == 0, first.stderr
    original = session_id_in(first.stderr)
    (dirs.workspace / "notes.txt").write_text("changed since\n")

    kept = await run_captured(dirs, fork=original, prompt="again")
    assert kept.code == 0, kept.stderr
    assert (dirs.workspace / "notes.txt").read_text() == "changed since\n"  # never overwritten unasked
    assert "--fork-workspace DIR restores that snapshot" in plain(kept.stderr)

    restored = await run_captured(dirs, fork=original, restore_workspace=True, prompt="again")
    assert restored.code == 0, restored.stderr
    assert (dirs.workspace / "notes.txt").read_text() == MILK

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    cases = {
        "not empty": {"fork": original, "fork_workspace": busy},
        "needs --fork": {"restore_workspace": True},
        "exclude each other": {"fork": original, "fork_workspace": tmp_path / "x", "restore_workspace": True},
        "needs workspace snapshots": {"fork": original, "restore_workspace": True, "snapshots": "off"},
    }
    for message, changes in cases.items():
        result = await run_captured(dirs, prompt="hi", **changes)
        assert result.code == 2, (message, result.stderr)
        assert message in plain(result.stderr), (message, result.stderr)
    assert (busy / "mine.txt").read_text() == "keep me" and not (tmp_path / "x").exists()

    # A session without snapshots (before: --snapshots off) cannot be forked from one: one line, exit 2.
    bare = await run_captured(dirs, prompt="hi", snapshots="off")
    bare_id = session_id_in(bare.stderr)
    refused = await run_captured(dirs, fork=f"{bare_id}@1", fork_workspace=tmp_path / "y", prompt="hi")
    assert refused.code == 2 and "no workspace snapshot at or before seq 1" in plain(refused.stderr)


def test_resuming_a_fork_elsewhere_warns(dirs: Dirs, tmp_path: Path) -> None:
    first = asyncio.run(run_captured(dirs, prompt="hello"))
    original = session_id_in(first.stderr)
    own = tmp_path / "fork-ws"
    forked = asyncio.run(run_captured(dirs, fork=original, fork_workspace=own, prompt="then"))
    assert forked.code == 0, forked.stderr
    fork = session_id_in(forked.stderr)
    resumed = asyncio.run(run_captured(dirs, resume=fork, prompt="more"))
    assert resumed.code == 0, resumed.stderr
    assert f"this session's workspace is {own.resolve()}" in plain(resumed.stderr)
