"""`loopd chat`: how it finds the token (and says how to pass one), and what it says when the responder it asks is
not connected (the question is kept; the CLI says it waits)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from loopd.cli._chat import ChatClient, ChatFailure, Endpoint, describe_absence, find_server
from tests.cli.conftest import child_env, loopd
from tests.server_http.support import Rig, ask, new_conversation, task_object


def _record_server(data_dir: Path, url: str, token: str) -> None:
    """What a running `loopd up` leaves in its data directory for `loopd chat`."""
    token_file = data_dir / "resources-api" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(token + "\n")
    (data_dir / "server.json").write_text(json.dumps({"url": url, "token_file": str(token_file)}))


# --- the token -----------------------------------------------------------------------------------------------


def test_a_server_without_a_token_says_how_to_pass_one(tmp_path: Path) -> None:
    with pytest.raises(ChatFailure) as caught:
        find_server("http://127.0.0.1:9", None, env={"LOOPD_DATA_DIR": str(tmp_path)})
    assert caught.value.code == 2
    message = str(caught.value)
    assert "no token for http://127.0.0.1:9" in message
    assert "--token" in message and "LOOPD_TOKEN" in message and "--data-dir" in message


def test_the_token_comes_from_the_flag_the_environment_or_the_data_dir(tmp_path: Path) -> None:
    env = {"LOOPD_DATA_DIR": str(tmp_path)}
    assert find_server("http://h:1/", None, env=env, token="flag") == Endpoint("http://h:1", "flag")
    assert find_server("http://h:1", None, env={**env, "LOOPD_TOKEN": "envtok"}) == Endpoint("http://h:1", "envtok")
    _record_server(tmp_path, "http://127.0.0.1:8420", "local-token")
    assert find_server(None, None, env=env) == Endpoint("http://127.0.0.1:8420", "local-token")
    assert find_server("http://127.0.0.1:8420/", None, env=env) == Endpoint("http://127.0.0.1:8420", "local-token")


def test_the_local_token_is_not_sent_to_another_server_unless_data_dir_says_so(tmp_path: Path) -> None:
    _record_server(tmp_path, "http://127.0.0.1:8420", "local-token")
    env = {"LOOPD_DATA_DIR": str(tmp_path)}
    with pytest.raises(ChatFailure, match="no token for http://elsewhere:8420"):
        find_server("http://elsewhere:8420", None, env=env)
    assert find_server("http://elsewhere:8420", tmp_path, env=env).token == "local-token"  # explicit --data-dir


def test_the_token_flag_and_the_hint_from_the_command_line(tmp_path: Path) -> None:
    result = loopd(["chat", "hello", "--server", "http://127.0.0.1:9"], env=child_env(tmp_path / "home"))
    line = result.one_line_error(2)
    assert "--token" in line and "LOOPD_TOKEN" in line and "--data-dir" in line
    help_text = loopd(["chat", "--help"], env=child_env(tmp_path / "home")).stdout
    assert "--token" in help_text and "--to" in help_text


# --- a responder that is not connected -----------------------------------------------------------------------


async def test_an_expired_operator_is_reported_with_when_it_was_last_seen(rig: Rig) -> None:
    router = rig.client(actor="operator:router")
    assert (await router.put("/v1/operators/router", json={"lease_seconds": 30})).status_code == 200
    await rig.clock.advance(95)  # the lease ran out 65 s ago

    status = (await rig.client().get("/v1/actors/operator/router")).json()
    assert status["connected"] is False and status["last_seen"] is not None
    target = {"kind": "operator", "key": "router"}
    line = describe_absence(target, status, now=datetime.fromisoformat(status["last_seen"]).replace(tzinfo=UTC))
    assert line is not None
    assert line.startswith("operator:router is not connected (last seen ")
    assert line.endswith(", 0s ago); the question waits for it")

    client = ChatClient(Endpoint("http://unused", "t"), Console(), http=rig.client())
    said = await client.absence(target)
    assert said is not None and said.startswith("operator:router is not connected (last seen ")

    # The question is kept: stored, with its Task, for the operator to pick up when it comes back.
    conversation = await new_conversation(rig.client())
    asked = await ask(rig.client(), conversation, "are you there?", target="operator:router")
    assert await task_object(rig, asked["task_id"]) is not None


async def test_never_seen_and_connected_responders(rig: Rig) -> None:
    client = ChatClient(Endpoint("http://unused", "t"), Console(), http=rig.client())
    never = await client.absence({"kind": "operator", "key": "ghost"})
    assert never == "operator:ghost is not connected (never seen); the question waits for it"
    assert await client.absence({"kind": "harness", "key": "assistant"}) is None  # built in: always there
    await rig.client(actor="operator:live").put("/v1/operators/live", json={"lease_seconds": 30})
    assert await client.absence({"kind": "operator", "key": "live"}) is None
    bad = await rig.client().get("/v1/actors/robot/x")
    assert bad.status_code in (400, 404) and "error" in bad.json()
