"""`loopd run --model a,b` end to end: the real process, the OpenAI-compatible primary answers 429, the Anthropic
secondary (the scripted Messages API server) takes the call."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from loopd.harness.models import (
    AnthropicScriptedServer,
    FailWithStatus,
    ScriptedServer,
    ServerReply,
    open_anthropic_server,
    open_scripted_server,
)
from tests.cli_run.conftest import LOOPD, TIMEOUT, Dirs, child_env, run_captured


@contextlib.contextmanager
def both_servers(primary: ScriptedServer, secondary: AnthropicScriptedServer) -> Iterator[tuple[str, str]]:
    """Both scripted providers on loopback, served from one thread (its own event loop) while a process runs."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        box["stop"], box["loop"] = stop, asyncio.get_running_loop()
        async with open_scripted_server(primary) as openai_url, open_anthropic_server(secondary) as anthropic_url:
            box["urls"] = (openai_url, anthropic_url)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="providers", daemon=True)
    thread.start()
    try:
        assert ready.wait(15), "the scripted providers did not start"
        yield box["urls"]
    finally:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(15)


def test_loopd_run_falls_back_to_the_next_provider_of_the_chain(dirs: Dirs) -> None:
    primary = ScriptedServer([ServerReply(fault=FailWithStatus(status=429, retry_after=60, message="quota"))])
    secondary = AnthropicScriptedServer([ServerReply(text="Claude answered instead.")], api_key="sk-ant-test")
    with both_servers(primary, secondary) as (openai_url, anthropic_url):
        env = {k: v for k, v in child_env().items() if not k.startswith("ANTHROPIC_")}
        env.update(
            OPENAI_BASE_URL=openai_url,
            OPENAI_API_KEY="sk-openai-test",
            ANTHROPIC_BASE_URL=anthropic_url,
            ANTHROPIC_API_KEY="sk-ant-test",
        )
        done = subprocess.run(
            [str(LOOPD), *dirs.args("--model", "gpt-4o-mini,anthropic:claude-haiku-4-5", "say hello")],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "Claude answered instead." in done.stdout
    shown = done.stdout + done.stderr  # one line says the primary failed and the next model took over
    assert "↪ gpt-4o-mini (openai) failed (429" in shown and "falling back to the next model" in shown, shown
    assert primary.statistics().requests == 1 and secondary.statistics().requests == 1
    assert primary.requests[0].model == "gpt-4o-mini" and secondary.requests[0].model == "claude-haiku-4-5"
    assert "sk-ant-test" not in done.stdout + done.stderr
    assert os.environ.get("ANTHROPIC_API_KEY") != "sk-ant-test"  # the key went to the child only


async def test_a_chain_needing_a_missing_key_or_a_malformed_one_exits_2(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")
    result = await run_captured(dirs, model="gpt-4o-mini,claude-haiku-4-5", prompt="hello")
    assert result.code == 2
    assert "needs ANTHROPIC_API_KEY" in result.stderr and "Traceback" not in result.stderr
    result = await run_captured(dirs, model="mistral:large", prompt="hello")
    assert result.code == 2 and "unknown provider 'mistral'" in result.stderr
