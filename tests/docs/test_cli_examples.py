"""Every command the docs, the help texts and the web page show exists, and the documented sessions run as written.

See `tests/docs/_doctest.py` for how blocks are marked and run.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from loopd.cli._app import app
from loopd.harness.models import open_scripted_server
from tests.docs._doctest import (
    Block,
    InvocationError,
    check_invocation,
    every_command,
    logical_lines,
    loopd_in_prose,
    loopd_invocations,
    shell_blocks,
)
from tests.e2e.conftest import env_for, start_up
from tests.support.availability import missing

BIN = Path(sys.executable).parent
BLOCKS = shell_blocks()
SESSIONS = sorted({b.session for b in BLOCKS if b.session is not None})
DEFAULT_PORTS = {"up": 8420, "harness": 8765}
"""The ports the docs show for `loopd up` and `loopd harness serve`; the run rewrites them to free ports."""
SESSION_TIMEOUT = 120.0


def test_every_shell_block_says_how_it_is_tested() -> None:
    unmarked = [b.where for b in BLOCKS if b.session is None and not b.parse_only]
    assert not unmarked, (
        "shell blocks without a '<!-- cli-doctest: session=NAME -->' or '<!-- cli-doctest: parse-only: why -->' "
        f"line above them: {unmarked}"
    )


def test_invocation_checker_catches_what_does_not_exist() -> None:
    check_invocation(["chat", "--help"])
    with pytest.raises(InvocationError, match="No such option"):
        check_invocation(["chat", "--no-such-flag", "hi"])
    with pytest.raises(InvocationError):
        check_invocation(["no-such-command"])
    assert loopd_invocations("x=1 loopd run --workspace /tmp/a 'hi' > out.md 2>&1\n") == [
        ["run", "--workspace", "/tmp/a", "hi"]
    ]
    assert loopd_invocations('echo "$(loopd kubeconfig)"\n') == [["kubeconfig"]]
    assert loopd_in_prose("<pre>loopd chat --target x\n</pre> and `loopd up --port 1`") == [
        ["up", "--port", "1"],
        ["chat", "--target", "x"],
    ]


def _doc_invocations() -> Iterator[tuple[str, list[str]]]:
    for block in BLOCKS:
        for args in loopd_invocations(block.text):
            yield block.where, args


@pytest.mark.parametrize(("where", "args"), list(_doc_invocations()), ids=lambda v: str(v))
def test_loopd_commands_in_the_docs_exist(where: str, args: list[str]) -> None:
    check_invocation(args)


def test_loopd_commands_in_help_texts_exist() -> None:
    runner = CliRunner()
    for path, _command in every_command():
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        for args in loopd_in_prose(result.output):
            check_invocation(args)


@pytest.mark.slow
def test_commands_on_the_web_page_exist_and_run(tmp_path: Path) -> None:
    up = start_up(tmp_path / "data", tmp_path)
    try:
        page = httpx.get(up.url + "/", timeout=15.0).text
        commands = loopd_in_prose(page)
        assert commands, "the page shows no loopd command"
        for args in commands:
            check_invocation(args)
            run = subprocess.run(
                [str(BIN / "loopd"), *args],
                env=env_for(up.data_dir),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert run.returncode == 0, f"loopd {args}: {run.stdout}{run.stderr}"
    finally:
        up.kill(signal.SIGTERM)


# -- running the documented sessions --------------------------------------------------------------------------

_PRELUDE = r"""
set -eo pipefail
__pids="$(mktemp)"
__cleanup() { for p in $(cat "$__pids"); do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap __cleanup EXIT
# A stream the docs follow with `curl -N` never ends by itself: it is followed for a few seconds.
curl() {
  local rc=0 follow=0 a
  for a in "$@"; do [ "$a" = "-N" ] && follow=1; done
  if [ $follow = 1 ]; then command curl --max-time 4 "$@" || rc=$?; [ $rc = 28 ] && rc=0
  else command curl --max-time 60 "$@" || rc=$?; fi
  return $rc
}
__wait_ready() {
  local i
  for i in $(seq 1 600); do command curl -sf --max-time 1 "$1/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "no server answered at $1" >&2; return 1
}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_line(line: str, ports: dict[str, int]) -> str | None:
    """The background start for a logical line that starts a server, or None."""
    stripped = line.strip()
    if re.match(r"make run(\s|$)", stripped):
        stripped = "loopd up"
    words = stripped.split("#", 1)[0].split()
    if words[:2] == ["loopd", "up"]:
        kind = "up"
    elif words[:3] == ["loopd", "harness", "serve"]:
        kind = "harness"
    else:
        return None
    command = " ".join(words)
    if "--port" not in words:
        command += f" --port {ports[kind]}"
    log = f"$HOME/{kind}.log"
    return f'{command} >"{log}" 2>&1 & echo $! >>"$__pids"; __wait_ready http://127.0.0.1:{ports[kind]}'


def build_script(blocks: list[Block], ports: dict[str, int]) -> str:
    parts = [_PRELUDE]
    for block in blocks:
        parts.append(f"# --- {block.where}")
        text = block.text
        for kind, default in DEFAULT_PORTS.items():
            text = text.replace(f"127.0.0.1:{default}", f"127.0.0.1:{ports[kind]}")
        for line in logical_lines(text) if "<<" not in text else text.splitlines():
            started = _server_line(line, ports)
            parts.append(started if started is not None else line)
    return "\n".join(parts) + "\n"


def _session_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "OPENAI_"))}
    env.update({"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "200"})
    env.pop("XDG_DATA_HOME", None)
    return env


@pytest.mark.slow
@pytest.mark.timeout(SESSION_TIMEOUT + 30)
@pytest.mark.parametrize("session", SESSIONS)
async def test_documented_session_runs(session: str, tmp_path: Path) -> None:
    blocks = [b for b in BLOCKS if b.session == session]
    script_text = "\n".join(b.text for b in blocks)
    for program in ("curl", "kubectl"):
        if re.search(rf"(^|[\s;|&(]){program}\s", script_text) and shutil.which(program) is None:
            missing(f"{program} is not installed")
    home = tmp_path / "home"
    home.mkdir()
    ports = {kind: _free_port() for kind in DEFAULT_PORTS}
    script = build_script(blocks, ports)
    (tmp_path / "session.sh").write_text(script)
    (home / ".venv").symlink_to(BIN.parent)  # the docs' `.venv/bin/loopd`, as seen from a checkout
    env = _session_env(home)
    async with open_scripted_server() as model_url:
        if "LOOPD_MODEL=" in script_text:
            # A block that configures a real model reaches this OpenAI-compatible stand-in instead of a provider.
            env["OPENAI_BASE_URL"] = model_url
        result = await _run_bash(tmp_path / "session.sh", env, cwd=home)
    logs = "".join(f"\n--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in sorted(home.glob("*.log")))
    assert result.returncode == 0, (
        f"session {session!r} failed (exit {result.returncode})\n--- script\n{script}\n--- output\n"
        f"{result.stdout[-6000:]}{logs}"
    )


async def _run_bash(script: Path, env: dict[str, str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    process = await asyncio.create_subprocess_exec(
        "bash",
        str(script),
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(SESSION_TIMEOUT):
            out, _ = await process.communicate()
    except TimeoutError:
        os.killpg(process.pid, 9)
        out, _ = await process.communicate()
        return subprocess.CompletedProcess(["bash", str(script)], 124, out.decode(errors="replace") + "\n[timed out]")
    return subprocess.CompletedProcess(["bash", str(script)], process.returncode or 0, out.decode(errors="replace"))
