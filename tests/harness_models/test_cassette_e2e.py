"""The OpenAI-compatible path end to end from committed cassettes (tests/data/cassettes), and the check that keeps
them true: each scenario is recorded again against the scripted server and must equal its committed cassette.

The replay tests need no server and no network (the base URL points at a closed port). When the adapter or the
scripted server changes what goes over the wire on purpose, record them again with
``LOOPD_REWRITE_CASSETTES=1 .venv/bin/pytest tests/harness_models/test_cassette_e2e.py`` and review the diff.
"""

from __future__ import annotations

import difflib
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopd.harness._errors import ModelPermanentError
from loopd.harness.core._values import Message, ToolCall, Usage
from loopd.harness.models import (
    FailWithStatus,
    OpenAICompatibleModel,
    PriceTable,
    ScriptedServer,
    ServerReply,
    ServerToolCall,
    open_scripted_server,
)
from loopd.harness.models._protocol import ModelRequest, TextDelta
from loopd.harness.models._scripted_server import Script
from loopd.testing import cassette_model, open_cassette

from .helpers import LIST_DIR, READ_FILE, Collected, RecordedSleep, ask, collect

CASSETTES = Path(__file__).resolve().parents[1] / "data" / "cassettes"
REWRITE_ENV = "LOOPD_REWRITE_CASSETTES"
UNREACHABLE = "http://127.0.0.1:9/v1"


@dataclass(frozen=True)
class Scenario:
    """A conversation with the OpenAI-compatible adapter: what the server is scripted to say, what the test asks,
    what it must get. ``drive`` returns what ``check`` inspects."""

    name: str
    script: Script
    drive: Callable[[OpenAICompatibleModel, RecordedSleep], Awaitable[Any]]
    check: Callable[[Any], None]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def cassette(self) -> Path:
        return CASSETTES / f"openai_{self.name}.yaml"


async def _one(model: OpenAICompatibleModel, request: ModelRequest) -> Collected:
    return await collect(model.stream(request))


def _check_text(got: Collected) -> None:
    assert got.error is None
    assert got.text == "Hello from the scripted server!"
    assert len([c for c in got.chunks if isinstance(c, TextDelta)]) == 8
    assert got.usage.calls == 1 and got.usage.input_tokens > 0


def _check_tool_calls(got: Collected) -> None:
    assert got.text == "Looking."
    assert got.tool_calls == (
        ToolCall(id="call_a", name="read_file", arguments={"path": "docs/ARCHITECTURE.md"}),
        ToolCall(id="call_b", name="list_dir", arguments={"path": ".", "depth": 2, "hidden": False}),
    )


async def _tool_round_trip(model: OpenAICompatibleModel, _: RecordedSleep) -> tuple[Collected, Collected]:
    request = ask("please list files", tools=(LIST_DIR, READ_FILE))
    first = await collect(model.stream(request))
    (call,) = first.tool_calls
    follow_up = ModelRequest(
        model="",
        tools=request.tools,
        messages=(
            *request.messages,
            Message(role="assistant", content=first.text, tool_calls=(call,)),
            Message(role="tool", content="README.md\nsrc/", tool_call_id=call.id, name="list_dir"),
        ),
    )
    return first, await collect(model.stream(follow_up))


def _check_tool_round_trip(got: tuple[Collected, Collected]) -> None:
    first, second = got
    assert [c.name for c in first.tool_calls] == ["list_dir"]
    assert second.tool_calls == () and "README.md\nsrc/" in second.text


async def _after_retry(model: OpenAICompatibleModel, sleep: RecordedSleep) -> tuple[Collected, list[float]]:
    return await collect(model.stream(ask("hi"))), sleep.delays


def _check_after_retry(got: tuple[Collected, list[float]]) -> None:
    collected, delays = got
    assert collected.text == "ok after the wait"
    assert delays == [1.0]  # the provider's Retry-After, honoured


def _check_refused(got: Collected) -> None:
    assert isinstance(got.error, ModelPermanentError)
    assert got.error.status_code == 400 and "scripted refusal" in str(got.error)


def _check_priced(got: Collected) -> None:
    # gpt-4o-mini: 20 uncached × 0.15 + 100 cached × 0.075 + 30 out × 0.60, per million
    assert got.usage.cost_usd == pytest.approx(28.5e-6)


SCENARIOS = (
    Scenario(
        "text_stream",
        [ServerReply(text="Hello from the scripted server!", chunk_size=4)],
        lambda m, _: _one(m, ask("hi")),
        _check_text,
    ),
    Scenario(
        "tool_calls",
        [
            ServerReply(
                text="Looking.",
                chunk_size=3,
                tool_calls=(
                    ServerToolCall(name="read_file", arguments={"path": "docs/ARCHITECTURE.md"}, id="call_a"),
                    ServerToolCall(name="list_dir", arguments={"path": ".", "depth": 2, "hidden": False}, id="call_b"),
                ),
            )
        ],
        lambda m, _: _one(m, ask("read it", tools=(READ_FILE, LIST_DIR))),
        _check_tool_calls,
    ),
    Scenario("tool_round_trip", None, _tool_round_trip, _check_tool_round_trip),
    Scenario(
        "retry_after",
        [ServerReply(fault=FailWithStatus(status=429, retry_after=1)), ServerReply(text="ok after the wait")],
        _after_retry,
        _check_after_retry,
        options={"random": lambda: 0.0},
    ),
    Scenario(
        "refused",
        [ServerReply(fault=FailWithStatus(status=400, message="scripted refusal"))],
        lambda m, _: _one(m, ask("do something forbidden")),
        _check_refused,
    ),
    Scenario(
        "usage_priced",
        [ServerReply(text="ok", usage=Usage(input_tokens=120, output_tokens=30, cached_tokens=100))],
        lambda m, _: _one(m, ask("hi")),
        _check_priced,
        options={"prices": PriceTable.default()},
    ),
)


def _options(scenario: Scenario, sleep: RecordedSleep) -> dict[str, Any]:
    return {"sleep": sleep, "max_retries": 2, **scenario.options}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_the_openai_path_replays_from_its_cassette(scenario: Scenario) -> None:
    cassette = open_cassette(scenario.cassette, mode="replay")
    sleep = RecordedSleep()

    async with cassette_model(cassette, "gpt-4o-mini", base_url=UNREACHABLE, **_options(scenario, sleep)) as model:
        scenario.check(await scenario.drive(model, sleep))

    assert cassette.statistics().unplayed == 0


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_the_cassette_is_what_the_scripted_server_records_now(scenario: Scenario, tmp_path: Path) -> None:
    path = tmp_path / scenario.cassette.name
    server = ScriptedServer(scenario.script, clock=lambda: 1_767_225_600.0)  # a fixed `created`
    async with open_scripted_server(server) as url:
        cassette, sleep = open_cassette(path, mode="record"), RecordedSleep()
        async with cassette_model(
            cassette, "gpt-4o-mini", base_url=url, api_key="sk-test", **_options(scenario, sleep)
        ) as m:
            scenario.check(await scenario.drive(m, sleep))

    if os.environ.get(REWRITE_ENV):
        scenario.cassette.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, scenario.cassette)
    assert scenario.cassette.exists(), f"no {scenario.cassette}: record it with {REWRITE_ENV}=1"
    committed, fresh = _untimed(scenario.cassette), _untimed(path)
    if committed != fresh:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True), "committed", "now"))
        pytest.fail(
            f"{scenario.cassette.name} no longer matches what is sent and received; if that is intended, "
            f"record it again with {REWRITE_ENV}=1 and review:\n{diff}"
        )


def _untimed(path: Path) -> str:
    """A cassette's documents without their timings (the only part that differs between two recordings)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "at"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    documents = [strip(d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return yaml.safe_dump_all(documents, sort_keys=False, allow_unicode=True, width=2**31 - 1)
