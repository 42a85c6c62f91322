"""Model cassettes: record real traffic (the scripted server over loopback), replay it with no network, fail on a
changed request with a readable diff, and never write a secret down."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr

from loopd._infra.clock import VirtualClock
from loopd.harness._errors import ModelPermanentError
from loopd.harness.core._values import Message
from loopd.harness.models import (
    CassetteError,
    CassetteMismatchError,
    CassetteSettings,
    FailWithStatus,
    ModelConfig,
    OpenAICompatibleModel,
    ScriptedServer,
    ServerReply,
    ServerToolCall,
    open_model,
    open_scripted_server,
)
from loopd.harness.models._cassette import Cassette, load_entries
from loopd.harness.models._protocol import ModelRequest, TextDelta
from loopd.harness.models._scripted_server import Script
from loopd.testing import cassette_model, open_cassette
from tests.support.waiting import eventually

from .helpers import LIST_DIR, RecordedSleep, ask, collect

UNREACHABLE = "http://127.0.0.1:9/v1"  # nothing listens: a replay that tried the network would fail
LIVE_KEY = "sk-live-0123456789abcdefghijklmnop"


@asynccontextmanager
async def recorded(
    path: Path, script: Script, *, mode: str = "record", api_key: str = LIVE_KEY, **options: object
) -> AsyncIterator[tuple[ScriptedServer, OpenAICompatibleModel]]:
    """A scripted server (fixed clock: stable ``created``) and a model that reaches it through a cassette."""
    server = ScriptedServer(script, clock=lambda: 0.0)
    async with (
        open_scripted_server(server) as url,
        cassette_model(open_cassette(path, mode=mode), "gpt-4o-mini", base_url=url, api_key=api_key, **options) as m,  # type: ignore[arg-type]
    ):
        yield server, m


@asynccontextmanager
async def replaying(path: Path, **options: object) -> AsyncIterator[OpenAICompatibleModel]:
    async with cassette_model(open_cassette(path, mode="replay"), "gpt-4o-mini", base_url=UNREACHABLE, **options) as m:  # type: ignore[arg-type]
        yield m


async def test_a_recorded_stream_replays_chunk_for_chunk_without_the_network(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    calls = (ServerToolCall(name="list_dir", arguments={"path": "."}, id="call_1"),)
    async with recorded(path, [ServerReply(text="Looking at the files.", tool_calls=calls, chunk_size=5)]) as (_, m):
        live = await collect(m.stream(ask("list files", tools=(LIST_DIR,))))

    async with replaying(path) as m:
        again = await collect(m.stream(ask("list files", tools=(LIST_DIR,))))

    assert live.error is None and again.error is None
    assert again.chunks == live.chunks
    assert len([c for c in again.chunks if isinstance(c, TextDelta)]) == 5
    assert again.tool_calls[0].name == "list_dir"


async def test_a_changed_request_fails_with_a_diff_of_the_canonical_request(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    async with recorded(path, [ServerReply(text="hi")]) as (_, m):
        await collect(m.stream(ask("What is the capital of France?")))

    async with replaying(path) as m:
        got = await collect(m.stream(ask("What is the capital of Spain?")))

    assert isinstance(got.error, CassetteMismatchError)
    assert isinstance(got.error, ModelPermanentError)  # the harness does not retry it
    diff = got.error.diff
    assert '-        "content": "What is the capital of France?",' in diff
    assert '+        "content": "What is the capital of Spain?",' in diff
    assert diff.startswith("--- recorded\n+++ sent\n")
    assert str(path) in str(got.error) and "LOOPD_MODEL_CASSETTE_MODE=record" in str(got.error)


async def test_replay_without_a_cassette_file_says_how_to_record_one(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match=r"no cassette at .*record it first"):
        open_cassette(tmp_path / "missing.yaml", mode="replay")


async def test_identical_requests_are_answered_in_recorded_order_each_once(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    async with recorded(path, [ServerReply(text="first"), ServerReply(text="second")]) as (_, m):
        await collect(m.stream(ask("again")))
        await collect(m.stream(ask("again")))

    async with replaying(path) as m:
        texts = [(await collect(m.stream(ask("again")))).text for _ in range(2)]
        third = await collect(m.stream(ask("again")))

    assert texts == ["first", "second"]
    assert isinstance(third.error, CassetteMismatchError)
    assert "already played" in str(third.error)


async def test_auto_replays_what_it_holds_and_records_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    async with recorded(path, [ServerReply(text="one")]) as (_, m):
        await collect(m.stream(ask("first question")))

    async with recorded(path, [ServerReply(text="two")], mode="auto") as (server, m):
        first = await collect(m.stream(ask("first question")))
        second = await collect(m.stream(ask("second question")))

    assert (first.text, second.text) == ("one", "two")
    assert [r.last_user_text for r in server.requests] == ["second question"]  # only the new one went out
    assert [e.request["json"]["messages"][0]["content"] for e in load_entries(path)] == [
        "first question",
        "second question",
    ]


async def test_recorded_failures_replay_so_retries_and_retry_after_are_reproduced(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    script = [ServerReply(fault=FailWithStatus(status=429, retry_after=2)), ServerReply(text="after the wait")]
    async with recorded(path, script, sleep=RecordedSleep(), random=lambda: 0.0) as (_, m):
        live = await collect(m.stream(ask("hi")))
    sleep = RecordedSleep()

    async with replaying(path, sleep=sleep, random=lambda: 0.0) as m:
        again = await collect(m.stream(ask("hi")))

    assert live.text == again.text == "after the wait"
    assert sleep.delays == [2.0]  # Retry-After came back from the cassette


async def test_recorded_timing_is_replayed_on_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    async with recorded(path, [ServerReply(text="abc", chunk_size=1)]) as (_, m):
        await collect(m.stream(ask("pace me")))
    # Give the recording known times: headers at 1 s, then one event per second.
    entry = load_entries(path)[0]
    document = entry.document()
    document["response"]["at"] = 1.0
    for index, event in enumerate(document["response"]["events"]):
        event["at"] = 2.0 + index
    path.write_text("---\n" + json.dumps(document))
    clock = VirtualClock()
    cassette = open_cassette(path, mode="replay", timing="recorded", clock=clock)
    seen: list[str] = []

    async with cassette_model(cassette, "gpt-4o-mini", base_url=UNREACHABLE) as m:

        async def consume() -> None:
            async for chunk in m.stream(ask("pace me")):
                if isinstance(chunk, TextDelta):
                    seen.append(chunk.text)

        async with asyncio.TaskGroup() as tasks:
            task = tasks.create_task(consume())
            await eventually(lambda: clock.sleepers, what="the replay to wait for its headers' time")
            await clock.advance(2.5)  # headers at 1 s, the role chunk at 2 s, "a" due at 3 s
            assert seen == []
            await clock.advance(1.0)
            assert seen == ["a"]
            await clock.advance(1.0)
            assert seen == ["a", "b"]
            await clock.run_until(task.done)

    assert seen == ["a", "b", "c"]


async def test_secrets_never_reach_the_cassette_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    body_key = "sk-proj-9876543210zyxwvutsrqponm"
    prompt = f"my key is {body_key}; my badge is ACME-4242; the weather is fine"
    cassette = open_cassette(path, mode="record", redact=[r"ACME-\d+"])
    server = ScriptedServer(None, api_key=LIVE_KEY, clock=lambda: 0.0)  # the demo: it echoes what it was told
    async with open_scripted_server(server) as url:
        async with cassette_model(cassette, "gpt-4o-mini", base_url=url, api_key=LIVE_KEY) as m:
            got = await collect(m.stream(ask(prompt)))
        async with cassette.http_client() as client:  # a provider taking its key in the body and the query
            response = await client.post(
                f"{url}/chat/completions?api_key={LIVE_KEY}",
                json={"model": "demo", "messages": [{"role": "user", "content": "hello"}], "api_key": body_key},
                headers={"authorization": f"Bearer {LIVE_KEY}", "x-api-key": LIVE_KEY},
            )
            assert response.status_code == 200

    assert body_key in got.text  # the live reply echoed it: the file must not
    written = path.read_text()
    for secret in (LIVE_KEY, body_key, "ACME-4242", "Bearer"):
        assert secret not in written
    assert "[REDACTED]" in written and "the weather is fine" in written
    assert "authorization" not in written.lower()

    async with replaying(path) as m:  # the same request, secret and all, still matches its redacted record
        again = await collect(m.stream(ask(prompt)))
    assert again.error is None and "[REDACTED]" in again.text


async def test_a_stream_the_client_closed_early_is_kept_as_truncated(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    # A reply that trickles (a zero-latency one is written whole at once: nothing would be left to cut off).
    async with recorded(path, [ServerReply(text="x" * 200, chunk_size=10, chunk_delay=0.005)]) as (server, m):
        stream = m.stream(ask("long"))
        async for chunk in stream:
            if isinstance(chunk, TextDelta):
                break
        await stream.aclose()  # type: ignore[attr-defined]
        await server.wait_until(lambda s: s.disconnected + s.completed == 1)

    (entry,) = load_entries(path)
    assert entry.response.truncated
    assert entry.response.events is not None and 1 <= len(entry.response.events) < 22


async def test_settings_come_from_the_environment(tmp_path: Path) -> None:
    env = {
        "LOOPD_MODEL_CASSETTE": str(tmp_path / "c.yaml"),
        "LOOPD_MODEL_CASSETTE_MODE": "auto",
        "LOOPD_MODEL_CASSETTE_TIMING": "recorded",
        "LOOPD_MODEL_CASSETTE_REDACT": '["ACME-\\\\d+", "internal-[a-z]+"]',
    }
    settings = CassetteSettings.from_env(env)

    assert settings == CassetteSettings(
        path=tmp_path / "c.yaml", mode="auto", timing="recorded", redact=(r"ACME-\d+", "internal-[a-z]+")
    )
    assert CassetteSettings.from_env(settings.env()) == settings
    assert CassetteSettings.from_env({}) is None
    assert CassetteSettings.from_env({"LOOPD_MODEL_CASSETTE": "x.yaml"}).mode == "replay"  # type: ignore[union-attr]
    with pytest.raises(CassetteError, match="LOOPD_MODEL_CASSETTE_MODE='rewind': use one of replay, record, auto"):
        CassetteSettings.from_env({"LOOPD_MODEL_CASSETTE": "x.yaml", "LOOPD_MODEL_CASSETTE_MODE": "rewind"})
    with pytest.raises(CassetteError, match="not a regular expression"):
        CassetteSettings.from_env({"LOOPD_MODEL_CASSETTE": "x.yaml", "LOOPD_MODEL_CASSETTE_REDACT": "(unclosed"})


async def test_a_malformed_cassette_names_the_file_and_document(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("---\nrequest: {method: POST, path: /v1/x}\nresponse: {status: 200}\n---\nrequest: 3\n")

    with pytest.raises(CassetteError, match=r"c\.yaml, document 2: a document needs a 'request' mapping"):
        Cassette(CassetteSettings(path=path))


async def test_a_recording_is_private_to_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    async with recorded(path, [ServerReply(text="hi")]) as (_, m):
        await collect(m.stream(ask("hi")))

    assert path.stat().st_mode & 0o077 == 0


async def test_any_httpx2_client_can_replay_through_a_cassette(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    server = ScriptedServer([ServerReply(text="plain")], clock=lambda: 0.0)
    async with open_scripted_server(server) as url, open_cassette(path, mode="record").http_client() as client:
        live = await client.post(f"{url}/chat/completions", json={"model": "m", "messages": []})
    cassette = open_cassette(path, mode="replay")

    async with cassette.http_client() as client:
        again = await client.post(f"{UNREACHABLE}/chat/completions", json={"messages": [], "model": "m"})

    assert again.status_code == live.status_code == 200
    assert again.json() == live.json()
    assert cassette.statistics().played == 1
    with pytest.raises(CassetteMismatchError):
        async with cassette.http_client() as client:
            await client.get(f"{UNREACHABLE}/models")


def test_the_canonical_request_has_sorted_keys_and_no_volatile_fields(tmp_path: Path) -> None:
    cassette = open_cassette(tmp_path / "c.yaml", mode="record")
    body = json.dumps(
        {"stream": True, "model": "m", "user": "someone-123", "messages": [{"role": "user", "content": "x"}]}
    )

    exchange = cassette.canonical("post", "/v1/chat/completions", b"", body.encode(), ())

    assert exchange.request == {
        "method": "POST",
        "path": "/v1/chat/completions",
        "json": {"messages": [{"content": "x", "role": "user"}], "model": "m", "stream": True},
    }
    assert "user" not in exchange.request["json"]  # volatile: dropped


async def test_a_configured_cassette_serves_open_model_and_a_replay_needs_no_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    server = ScriptedServer([ServerReply(text="configured")], api_key=LIVE_KEY, clock=lambda: 0.0)
    async with open_scripted_server(server) as url:
        recording = ModelConfig.from_env(
            {
                "LOOPD_MODEL": "gpt-4o-mini",
                "OPENAI_BASE_URL": url,
                "OPENAI_API_KEY": LIVE_KEY,
                "LOOPD_MODEL_CASSETTE": str(path),
                "LOOPD_MODEL_CASSETTE_MODE": "record",
            }
        )
        async with open_model(recording) as model:
            live = await collect(model.stream(ask("hi")))
    replaying_config = ModelConfig.from_env({"LOOPD_MODEL": "gpt-4o-mini", "LOOPD_MODEL_CASSETTE": str(path)})

    assert replaying_config.missing_keys() == ()  # no OPENAI_API_KEY, no base URL: fine for a replay
    async with open_model(replaying_config) as model:
        again = await collect(model.stream(ask("hi")))
    assert live.text == again.text == "configured"
    assert LIVE_KEY not in path.read_text()


async def test_the_anthropic_adapter_records_and_replays_through_the_same_cassette(tmp_path: Path) -> None:
    from loopd.harness.models import AnthropicReply, AnthropicScriptedServer, open_anthropic_server

    path = tmp_path / "c.yaml"
    key = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz"
    request = ModelRequest(model="", messages=(Message(role="user", content="hi"),), max_output_tokens=100)
    server = AnthropicScriptedServer([AnthropicReply(text="Hello from the Messages API", chunk_size=5)], api_key=key)
    async with open_anthropic_server(server) as url:
        recording = ModelConfig(
            model="claude-sonnet-4-5",
            anthropic_base_url=url,
            anthropic_api_key=SecretStr(key),
            cassette=CassetteSettings(path=path, mode="record"),
        )
        async with open_model(recording) as model:
            live = await collect(model.stream(request))
    replaying_config = ModelConfig(model="claude-sonnet-4-5", cassette=CassetteSettings(path=path))

    async with open_model(replaying_config) as model:
        again = await collect(model.stream(request))

    assert live.text == "Hello from the Messages API" and again.chunks == live.chunks
    assert key not in path.read_text()


def test_loopd_testing_is_a_small_documented_face() -> None:
    import loopd.testing as testing

    assert sorted(testing.__all__) == sorted(
        [
            "REPLAY_API_KEY",
            "Cassette",
            "CassetteError",
            "CassetteMismatchError",
            "CassetteMode",
            "CassetteSettings",
            "CassetteStatistics",
            "CassetteTiming",
            "cassette_model",
            "open_cassette",
        ]
    )
    for name in ("Cassette", "CassetteError", "CassetteMismatchError", "CassetteSettings", "cassette_model"):
        assert getattr(testing, name).__doc__, name
