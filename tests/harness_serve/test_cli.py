"""`loopd harness serve` as a user runs it: the demo model, a real turn over HTTP, Ctrl-C shuts down cleanly."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import sys
from pathlib import Path

from typer.testing import CliRunner

from loopd.cli import app

from .conftest import client_for
from .sse import read_frames

CLI = [sys.executable, "-c", "from loopd.cli import main; main()", "harness", "serve"]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "OPENAI_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


async def test_serve_with_the_demo_model_until_ctrl_c(tmp_path: Path) -> None:
    workspace, data = tmp_path / "ws", tmp_path / "data"
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "--port",
        "0",
        "--workspace",
        str(workspace),
        "--data-dir",
        str(data),
        env=clean_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        banner: list[str] = []
        async with asyncio.timeout(45):  # a hang only: starting a process is slow on a loaded machine
            while not any("Ctrl-C" in line for line in banner):
                line = (await process.stdout.readline()).decode()
                assert line, "the server exited during startup: " + (await process.stderr.read()).decode()
                banner.append(line)
        text = "".join(banner)
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+)", text)
        assert match, text
        assert "model: demo" in text and "LOOPD_MODEL" in text  # how to configure a real model
        url = match.group(1)

        async with client_for(url) as client:
            created = await client.post("/v1/sessions", json={})
            assert created.status_code == 201, created.text
            session_id = created.json()["id"]
            reply, final = "", ""
            async with (
                asyncio.timeout(30),
                client.stream("GET", f"/v1/sessions/{session_id}/events", params={"from_seq": 1}) as response,
            ):
                sent = await client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "hello from the test"})
                assert sent.status_code == 202
                async for frame in read_frames(response):
                    if frame.event == "token_delta":
                        reply += frame.payload["event"]["text"]
                    if frame.event == "turn_done":
                        final = frame.payload["event"]["text"]
                        break
            assert reply == final  # the streamed tokens add up to the stored answer
            assert "hello from the test" in reply

            # Ctrl-C while a client is still watching: the stream ends and the server stops gracefully.
            async with asyncio.timeout(30), client.stream("GET", f"/v1/sessions/{session_id}/events") as watching:
                process.send_signal(signal.SIGINT)
                async for _frame in read_frames(watching):
                    pass
        async with asyncio.timeout(30):
            out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        assert "loopd harness stopped." in out.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    with sqlite3.connect(data / "journal.db") as db:
        kinds = [row[0] for row in db.execute("SELECT kind FROM journal_records ORDER BY seq")]
    assert kinds[-1] == "session_stopped"  # sessions were shut down before the journal closed
    assert kinds.count("turn_done") == 1
    with sqlite3.connect(data / "serve-model-calls.db") as db:  # the model calls outlive the server
        bodies = [row[0] for row in db.execute("SELECT body FROM model_calls WHERE session_id = ?", (session_id,))]
    assert len(bodies) == 1 and "hello from the test" in bodies[0]


def test_a_public_bind_without_a_token_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["harness", "serve", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path / "data")], env={}
    )
    assert result.exit_code == 2
    assert "without a token" in result.output
    assert "serving" not in result.output
    assert not (tmp_path / "data").exists()


def test_a_token_from_the_environment_allows_a_public_bind_check() -> None:
    result = CliRunner().invoke(
        app,
        ["harness", "serve", "--host", "0.0.0.0", "--policy", "/nonexistent/policy.yaml"],
        env={"LOOPD_HARNESS_TOKEN": "from-the-env"},
    )
    assert result.exit_code == 2
    assert "without a token" not in result.output  # the bind check passed; the bad policy file stopped it
    assert "policy" in result.output


def test_session_workspaces_flags_are_checked_before_anything_is_created(tmp_path: Path) -> None:
    data = tmp_path / "data"
    base = ["harness", "serve", "--port", "0", "--data-dir", str(data), "--session-workspaces"]
    bad = CliRunner().invoke(app, [*base, "--snapshots", "always"], env={})
    assert bad.exit_code == 2 and "--snapshots 'always'" in bad.output
    inside = CliRunner().invoke(app, [*base, "--workspace", str(data / "ws")], env={})
    assert inside.exit_code == 2 and "inside a data directory" in inside.output
    assert not data.exists()
