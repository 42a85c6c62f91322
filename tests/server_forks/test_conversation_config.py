"""How a built-in harness carries a conversation, from `loopd up`'s configuration: ``continue_conversations``
(default true: a later question goes on from the last answer's session; false: each question starts a new session
with the conversation's messages as text) and ``compact_at_tokens`` (where its sessions start compacting)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.harness.standard import HarnessSettings
from loopd.server._composition import RunningServer, UpSettings, open_loop_server
from loopd.server.config import BuiltinHarness, ConfigError, parse_config

from .test_harness_fork import _ask


def test_the_configuration_takes_both_and_refuses_bad_values(tmp_path: Path) -> None:
    text = "harnesses:\n  - key: assistant\n    kind: builtin\n"
    (plain,) = parse_config(text, base_dir=tmp_path, env={}).harnesses or ()
    assert isinstance(plain, BuiltinHarness)
    assert plain.continue_conversations is True and plain.compact_at_tokens is None
    assert HarnessSettings.compact_at_tokens == 100_000  # what None means
    set_ = text + "    continue_conversations: false\n    compact_at_tokens: 24000\n"
    (chosen,) = parse_config(set_, base_dir=tmp_path, env={}).harnesses or ()
    assert isinstance(chosen, BuiltinHarness)
    assert chosen.continue_conversations is False and chosen.compact_at_tokens == 24000
    for bad in ("    compact_at_tokens: 10\n", "    continue_conversations: maybe\n"):
        with pytest.raises(ConfigError):
            parse_config(text + bad, base_dir=tmp_path, env={})


@pytest.fixture(params=[True, False], ids=["continuing", "not-continuing"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunningServer]:
    text = (
        "harnesses:\n  - key: assistant\n    kind: builtin\n    compact_at_tokens: 24000\n"
        f"    continue_conversations: {str(request.param).lower()}\n"
    )
    config = parse_config(text, base_dir=tmp_path, env={})
    settings = UpSettings(data_dir=tmp_path / "data", port=0, harnesses=config.harnesses)
    async with open_loop_server(settings) as running:
        yield running


async def test_a_harness_continues_conversations_unless_configured_not_to(
    server: RunningServer, request: pytest.FixtureRequest
) -> None:
    continuing = "not-continuing" not in request.node.name
    adapter = server.engine._adapters["assistant"]  # what the configuration built
    assert [loop.compact_at_tokens for loop in adapter._rig.loops] == [24000]
    token = server.token_file.read_text().strip()
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15) as user:
        cid = (await user.post("/v1/conversations", json={"name": "fruit"})).json()["id"]
        first: dict[str, Any] = await _ask(user, cid, "apples?")
        second: dict[str, Any] = await _ask(user, cid, "pears?")
    first_call = await server.engine.call_for_message(first["response"]["id"])
    second_call = await server.engine.call_for_message(second["response"]["id"])
    assert first_call is not None and second_call is not None
    if continuing:
        assert second_call.params["fork"]["session"] == first_call.execution_ref
        assert second_call.params["history"] == []
    else:
        assert "fork" not in second_call.params
        assert second_call.params["history"][0]["text"] == "apples?"
