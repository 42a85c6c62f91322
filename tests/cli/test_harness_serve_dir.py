"""`loopd harness serve` owns its data directory: a second server on it stops at once with one line (and leaves
the first one's sessions alone), and the directory and its files are private (0700 / 0600)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
from pathlib import Path

import httpx

from tests.cli.conftest import LOOPD, child_env, loopd


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_second_server_on_the_same_data_dir_is_refused_in_one_line(tmp_path: Path) -> None:
    data, workspace = tmp_path / "data", tmp_path / "ws"
    workspace.mkdir()
    env = child_env(tmp_path / "home")
    args = ["harness", "serve", "--port", "0", "--workspace", str(workspace), "--data-dir", str(data)]
    previous = os.umask(0o022)  # the usual umask: without care the directory would be 0755 and files 0644
    try:
        first = await asyncio.create_subprocess_exec(
            str(LOOPD), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    finally:
        os.umask(previous)
    assert first.stdout is not None and first.stderr is not None
    try:
        banner = ""
        async with asyncio.timeout(20):
            while "Ctrl-C" not in banner:
                line = (await first.stdout.readline()).decode()
                assert line, "the server exited during startup: " + (await first.stderr.read()).decode()
                banner += line
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+)", banner)
        assert match, banner
        url = match.group(1)
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            created = await client.post("/v1/sessions", json={})
            assert created.status_code == 201, created.text
            session_id = created.json()["id"]

            second = await asyncio.to_thread(loopd, args, env=env)
            line = second.one_line_error(1)
            assert f"{data} is in use by another loopd harness serve (pid {first.pid})" in line
            assert "--data-dir" in line

            sent = await client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "still yours"})
            assert sent.status_code == 202, sent.text  # the first server's session was not taken over
            state = await client.get(f"/v1/sessions/{session_id}")
            assert state.status_code == 200 and state.json()["status"] != "faulted", state.text

        assert _mode(data) == 0o700
        for name in ("journal.db", "serve-idempotency.db"):
            assert _mode(data / name) == 0o600, name
        for path in data.iterdir():
            assert _mode(path) & 0o077 == 0, path
    finally:
        if first.returncode is None:
            first.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(20):
                    await first.wait()
            except TimeoutError:
                first.kill()
                await first.wait()
    assert first.returncode == 0
