"""`loopd run`'s /mode, /model and /loop, and the context shown on a turn's done line."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

from rich.console import Console

from loopd.cli._run import RunOptions, run_harness
from loopd.cli._run_input import LineInput
from loopd.harness.models import IncomingRequest, ServerReply, ServerToolCall, open_scripted_server
from tests.cli_run.conftest import Dirs


class _Script:
    """Writes notes.txt when asked to "write", answers otherwise; remembers every request."""

    def __init__(self) -> None:
        self.requests: list[IncomingRequest] = []

    def __call__(self, request: IncomingRequest) -> ServerReply:
        self.requests.append(request)
        last = request.last_message or {}
        if last.get("role") == "tool":
            return ServerReply(text=f"tool said: {last.get('content')}")
        text = request.last_user_text
        if text.startswith("write"):
            args = {"path": "notes.txt", "content": f"{text}\n"}
            return ServerReply(tool_calls=(ServerToolCall(name="write_file", arguments=args, id=f"w-{len(text)}"),))
        return ServerReply(text="ok")


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
            options, console=Console(file=err, width=300), out=out, terminal=LineInput(read_fd, interactive=False)
        )
    finally:
        os.close(read_fd)
    return code, out.getvalue(), err.getvalue()


async def test_plan_mode_withholds_writes_and_the_settings_survive_a_resume(dirs: Dirs, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("kinds:\n  fs.write: allow\n")
    script = _Script()
    first = b"/mode\n/mode plan\nwrite in plan\n/model other-model\n/loop\n/loop nope\n/mode fly\nhello\n"
    async with open_scripted_server(script) as url:
        code, out, err = await _run(dirs, url, first, policy)
        assert code == 0, err
        assert "mode build · modes: build, plan" in err
        assert "mode plan from its next step" in err
        # The write was not offered in plan mode; the model's call of it was denied without running.
        plan_request = next(r for r in script.requests if r.last_user_text == "write in plan")
        assert "write_file" not in plan_request.tool_names and "read_file" in plan_request.tool_names
        assert "not available in mode 'plan'" in out
        assert (dirs.workspace / "notes.txt").read_text() == "remember the milk\n"
        assert "active loop: main · loops: main" in err
        assert "has no loop 'nope'" in err and "has no mode 'fly'" in err
        assert script.requests[-1].model == "other-model"  # /model applies to the next call
        assert re.search(r"✓ done · 1 step · .* · context [\d,]+ tokens", err)
        session_id = re.findall(r"session (\S+) · ", err)[-1]

        # Resumed: still in plan mode with the other model; /mode build lets the write through.
        again = b"/mode\nwrite while planning\n/mode build\nwrite for real\n"
        code, out, err = await _run(dirs, url, again, policy, resume=session_id)
    assert code == 0, err
    assert "mode plan · modes: build, plan" in err
    assert (dirs.workspace / "notes.txt").read_text() == "write for real\n"
    assert all(r.model == "other-model" for r in script.requests[-4:])


def test_the_status_line_shows_the_context_and_pressure_warns() -> None:
    from loopd.cli._run_view import RunView, describe_context
    from loopd.harness.core.events import ContextMeasured, ContextPressure

    measured = ContextMeasured(loop="main", turn_id="t", step=1, tokens=8500, window=10000, at=0.0)
    assert describe_context(measured) == "context 8,500/10,000 tokens (85%)"
    assert describe_context(measured.model_copy(update={"window": None})) == "context 8,500 tokens"
    err = io.StringIO()
    view = RunView(console=Console(file=err, width=200), out=io.StringIO())
    view.context_pressure(ContextPressure(loop="main", turn_id="t", tokens=8500, limit=10000, ratio=0.85))
    assert "context 85% full (8,500 of 10,000 tokens)" in err.getvalue()
