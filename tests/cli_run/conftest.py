"""Drive the real `loopd` console script: through a pseudo-terminal (pexpect) or as a plain subprocess."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest
from rich.console import Console

from loopd.cli._run import RunOptions, run_harness
from loopd.cli._run_input import LineInput
from loopd.harness import SqliteJournal
from loopd.harness.models import (
    FailWithStatus,
    IncomingRequest,
    ScriptedServer,
    ServerReply,
    demo_reply,
    open_scripted_server,
)
from tests.support.waiting import wait_until

LOOPD = Path(sys.executable).parent / "loopd"
TIMEOUT = 30.0
"""Seconds one expected output (or a plain run) may take: bounds a hang only, so it is generous for a loaded machine."""
SLOW_CHUNKS = 1500
SLOW_TEXT = "slow " * SLOW_CHUNKS  # chunks of 5 characters 0.05 s apart: 75 s, longer than a test may run: only an
# interrupt ends it
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
_SESSION_LINE = re.compile(r"session (\S+) · resume with: loopd run --resume (\S+)")


def plain(text: str) -> str:
    """Terminal output without escape sequences and carriage returns."""
    return _ANSI.sub("", text)


def session_id_in(text: str) -> str:
    match = _SESSION_LINE.search(plain(text))
    assert match is not None, f"no session line in:\n{plain(text)}"
    assert match.group(1) == match.group(2)
    return match.group(1)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LOOPD_"))}
    env.update({"LOOPD_MODEL": "demo", "TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"})
    return env


@dataclass
class Dirs:
    workspace: Path
    data_dir: Path

    def args(self, *extra: str) -> list[str]:
        return ["run", "--workspace", str(self.workspace), "--data-dir", str(self.data_dir), *extra]

    @property
    def rules_file(self) -> Path:
        return self.workspace / ".loopd" / "gate-rules.json"


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("remember the milk\n")
    return Dirs(workspace=workspace, data_dir=tmp_path / "data")


class Terminal:
    """A `loopd` process on a pseudo-terminal, with its whole output kept for assertions."""

    def __init__(self, args: Sequence[str]) -> None:
        self.log = io.StringIO()
        self.child = pexpect.spawn(
            str(LOOPD),
            list(args),
            env=child_env(),
            encoding="utf-8",
            dimensions=(50, 200),
            timeout=TIMEOUT,
        )
        self.child.logfile_read = self.log

    def expect(self, text: str) -> None:
        self.child.expect_exact(text)

    def send_line(self, text: str) -> None:
        self.child.sendline(text)

    def send(self, text: str) -> None:
        self.child.send(text)

    def wait_exit(self) -> int:
        self.child.expect(pexpect.EOF)
        self.child.close()
        assert self.child.exitstatus is not None, f"killed by signal {self.child.signalstatus}"
        return int(self.child.exitstatus)

    @property
    def output(self) -> str:
        return plain(self.log.getvalue())

    def kill(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def terminal() -> Iterator[type[Terminal]]:
    spawned: list[Terminal] = []

    class Tracked(Terminal):
        def __init__(self, args: Sequence[str]) -> None:
            super().__init__(args)
            spawned.append(self)

    yield Tracked
    for t in spawned:
        t.kill()


def run_plain(args: Sequence[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`loopd` without a terminal: stdin is /dev/null (or ``stdin``), stdout and stderr captured apart."""
    return subprocess.run(
        [str(LOOPD), *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=TIMEOUT,
        check=False,
    )


@dataclass(frozen=True)
class Captured:
    code: int
    stdout: str
    stderr: str


async def run_captured(dirs: Dirs, **changes: Any) -> Captured:
    """`run_harness` in this process (stdin: /dev/null, so no question is ever asked), output captured."""
    options = dataclasses.replace(RunOptions(workspace=dirs.workspace, data_dir=dirs.data_dir, model="demo"), **changes)
    err, out = io.StringIO(), io.StringIO()
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        code = await run_harness(
            options, console=Console(file=err, width=200), out=out, terminal=LineInput(fd, interactive=False)
        )
    finally:
        os.close(fd)
    return Captured(code, out.getvalue(), err.getvalue())


def journal_last_seq(data_dir: Path, session_id: str) -> int:
    async def read() -> int:
        journal = await SqliteJournal.open(data_dir / "journal.db")
        try:
            info = await journal.session(session_id)
            assert info is not None
            return info.last_seq
        finally:
            await journal.aclose()

    return asyncio.run(read())


def _script(request: IncomingRequest) -> ServerReply:
    last = request.last_message or {}
    said = request.last_user_text
    if last.get("role") == "user" and "slow" in said:
        return ServerReply(text=SLOW_TEXT, chunk_size=5, chunk_delay=0.05)
    if last.get("role") == "user" and "fail" in said:
        return ServerReply(fault=FailWithStatus(status=400, message="scripted refusal"))
    return demo_reply(request)


@dataclass
class RunningServer:
    url: str
    server: ScriptedServer

    def disconnects(self) -> int:
        """Streams the client closed before their end, once the server's thread has seen at least one."""
        wait_until(lambda: self.server.statistics().disconnected, what="the server to see the stream closed")
        return self.server.statistics().disconnected


@pytest.fixture
def scripted_server() -> Iterator[RunningServer]:
    """A scripted OpenAI-compatible server in a thread: slow on "slow", a 400 on "fail", the demo otherwise."""
    server = ScriptedServer(_script)
    ready = threading.Event()
    found: dict[str, object] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with open_scripted_server(server) as url:
            found.update(url=url, loop=asyncio.get_running_loop(), stop=stop)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="scripted-server", daemon=True)
    thread.start()
    assert ready.wait(10), "the scripted server did not start"
    try:
        yield RunningServer(url=str(found["url"]), server=server)
    finally:
        loop = found["loop"]
        stop = found["stop"]
        assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop, asyncio.Event)
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
