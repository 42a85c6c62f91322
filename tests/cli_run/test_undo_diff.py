"""`loopd run`'s /diff and /undo: what the last turn changed in the workspace, and putting it back."""

from __future__ import annotations

import io
import os
from pathlib import Path

from rich.console import Console

from loopd.cli._run import RunOptions, run_harness
from loopd.cli._run_input import LineInput
from loopd.harness.models import IncomingRequest, ServerReply, ServerToolCall, open_scripted_server
from tests.cli_run.conftest import Dirs


def _script(request: IncomingRequest) -> ServerReply:
    last = request.last_message or {}
    if last.get("role") == "tool":
        return ServerReply(text="Done.")
    text = request.last_user_text
    args = {"path": "notes.txt", "content": f"{text}\n"}
    return ServerReply(tool_calls=(ServerToolCall(name="write_file", arguments=args, id=f"w-{len(text)}"),))


async def _run(dirs: Dirs, url: str, stdin: bytes, policy: Path, **extra: str) -> tuple[int, str, str]:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, stdin)
    os.close(write_fd)
    err, out = io.StringIO(), io.StringIO()
    options = RunOptions(
        workspace=dirs.workspace, data_dir=dirs.data_dir, model="scripted", base_url=url, policy=policy, **extra
    )
    try:
        code = await run_harness(
            options, console=Console(file=err, width=200), out=out, terminal=LineInput(read_fd, interactive=False)
        )
    finally:
        os.close(read_fd)
    return code, out.getvalue(), err.getvalue()


async def test_diff_shows_the_last_turn_and_undo_puts_the_workspace_back(dirs: Dirs, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("kinds:\n  fs.write: allow\n")
    lines = b"first version\nsecond version\n/diff\n/undo\n/undo\n/undo\n"
    async with open_scripted_server(_script) as url:
        code, out, err = await _run(dirs, url, lines, policy)
    assert code == 0, err
    assert "-first version\n+second version" in out  # /diff: the last turn's change, as a unified diff
    assert "back to before the last turn" in err
    assert "nothing to undo" in err  # the third /undo: there is no snapshot before the first turn's start
    assert (dirs.workspace / "notes.txt").read_text() == "remember the milk\n"  # two undos: before both turns


async def test_snapshots_off_says_so_and_a_bad_value_exits_2(dirs: Dirs, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("kinds:\n  fs.write: allow\n")
    async with open_scripted_server(_script) as url:
        code, _out, err = await _run(dirs, url, b"a change\n/undo\n", policy, snapshots="off")
        assert code == 0, err
        assert "snapshots are off" in err
        assert (dirs.workspace / "notes.txt").read_text() == "a change\n"
        code, _out, err = await _run(dirs, url, b"", policy, snapshots="sometimes")
    assert code == 2 and "--snapshots 'sometimes'" in err
