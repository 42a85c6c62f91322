"""`loopd run` says when a model attempt failed and another follows: a retry of the same provider (here) and a step
to the next model of a fallback chain (tests/cli_run/test_fallback_chain.py, the real process)."""

from __future__ import annotations

from loopd.harness.models import FailWithStatus, ScriptedServer, ServerReply, open_scripted_server
from tests.cli_run.conftest import Dirs, plain, run_captured


async def test_a_retried_model_attempt_is_one_line(dirs: Dirs) -> None:
    server = ScriptedServer(
        [ServerReply(fault=FailWithStatus(status=503, message="overloaded", retry_after=0)), ServerReply(text="Hi.")]
    )
    async with open_scripted_server(server) as url:
        result = await run_captured(dirs, model="scripted", base_url=url, prompt="hello")
    assert result.code == 0, result.stderr
    assert "Hi." in result.stdout
    shown = plain(result.stderr)
    assert "↻ scripted (openai) attempt 1 failed (503" in shown and "overloaded" in shown, shown
    assert "retrying" in shown
    assert server.statistics().requests == 2
