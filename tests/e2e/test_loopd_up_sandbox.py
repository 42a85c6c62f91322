"""`loopd up` runs the assistant's bash in bubblewrap: an approved command cannot read the admin token or the key.

The model is a scripted OpenAI-compatible server (in a thread of this process) that asks for one bash command
trying the escapes of issue 10 item 3; the test approves the gate and reads what the tool returned to the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopd.harness.models import ScriptedServer, ServerReply, open_scripted_server
from loopd.harness.models._scripted_server import IncomingRequest, ServerToolCall
from tests.harness_tools.sandboxes import bubblewrap

from .conftest import LOOPD, UpProcess, env_for, wait_for_server_file
from .test_loopd_up import _answer_gate, _ask, _pending_gate, _response, _wait

API_KEY = f"sk-e2e-{secrets.token_hex(8)}"


@contextlib.contextmanager
def scripted_model(command: str, seen: list[str]) -> Iterator[str]:
    """A model that asks for ``command`` in bash, then answers "done"; tool results land in ``seen``."""

    def rule(request: IncomingRequest) -> ServerReply:
        last = request.last_message or {}
        if last.get("role") == "tool":
            seen.append(json.dumps(last.get("content")))
            return ServerReply(text="done")
        return ServerReply(tool_calls=(ServerToolCall(name="bash", arguments={"command": command}),))

    with scripted_model_rule(rule) as base_url:
        yield base_url


@contextlib.contextmanager
def scripted_model_rule(rule: Callable[[IncomingRequest], ServerReply]) -> Iterator[str]:
    """An OpenAI-compatible scripted model answering by ``rule``, served from a thread; yields its base URL."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        box["stop"], box["loop"] = stop, asyncio.get_running_loop()
        async with open_scripted_server(ScriptedServer(rule, api_key=API_KEY)) as base_url:
            box["url"] = base_url
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="scripted-model", daemon=True)
    thread.start()
    try:
        if not ready.wait(15):
            raise AssertionError("the scripted model did not start")
        yield str(box["url"])
    finally:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(15)


def start(data_dir: Path, tmp_path: Path, base_url: str) -> UpProcess:
    env = env_for(data_dir)
    env.update(
        {"LOOPD_MODEL": "gpt-4o-mini", "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": API_KEY, "LOOPD_SANDBOX": "auto"}
    )
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [LOOPD, "up", "--data-dir", str(data_dir), "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    info = wait_for_server_file(process, data_dir, log)
    return UpProcess(data_dir, process, info["url"], Path(info["token_file"]).read_text().strip(), log)


def test_bash_under_loopd_up_cannot_read_the_token_the_data_dir_or_the_servers_environment(tmp_path: Path) -> None:
    bubblewrap()  # skip here, fail under CI=true, when it cannot run
    data_dir = tmp_path / "data"
    command = (
        "pwd; cat ../../data/resources-api/token ../../resources-api/token; "
        f"cat {data_dir}/resources-api/token; cat /proc/*/environ | tr '\\0' '\\n' | grep -c OPENAI_API_KEY; "
        "cat /proc/$PPID/environ | tr '\\0' '\\n'; echo end"
    )
    seen: list[str] = []
    with scripted_model(command, seen) as base_url:
        up = start(data_dir, tmp_path, base_url)
        try:
            with up.client() as client:
                conversation_id, asked = _ask(client, "run the command")
                response_id = asked["response"]["id"]
                gate = _wait(lambda: _pending_gate(_response(client, conversation_id, response_id)), what="a gate")
                _answer_gate(client, gate, "approve")
                _wait(lambda: _response(client, conversation_id, response_id)["status"] == "completed", what="done")
        finally:
            up.kill(signal.SIGTERM)
    workspace = tmp_path / "data-workspaces" / "assistant"  # next to the data directory, not inside it
    assert len(seen) == 1
    output = seen[0]
    assert str(workspace) in output and "end" in output  # the command did run, in that workspace
    assert up.token not in output
    assert API_KEY not in output
    assert "sandbox: bubblewrap" in up.log.read_text()


@pytest.mark.parametrize("inside", ["workspaces", "."])
def test_loopd_up_refuses_workspaces_inside_the_data_directory(tmp_path: Path, inside: str) -> None:
    data_dir = tmp_path / "data"
    done = subprocess.run(
        [LOOPD, "up", "--data-dir", str(data_dir), "--port", "0", "--workspaces", str(data_dir / inside)],
        env=env_for(data_dir),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr.decode()
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "inside the data directory" in lines[0], lines


def test_workspaces_default_next_to_the_data_directory_and_an_old_workspace_moves_there(tmp_path: Path) -> None:
    from loopd.server._composition import _move_old_workspace, default_workspaces, workspaces_root

    data_dir = tmp_path / "data"
    assert default_workspaces(data_dir) == tmp_path / "data-workspaces"
    assert workspaces_root(data_dir, None) == tmp_path / "data-workspaces"
    old = data_dir / "workspaces" / "assistant"
    old.mkdir(parents=True)
    (old / "notes.txt").write_text("kept\n")
    new = workspaces_root(data_dir, None) / "assistant"
    _move_old_workspace(data_dir, new)
    assert (new / "notes.txt").read_text() == "kept\n"
    assert not (data_dir / "workspaces").exists()
