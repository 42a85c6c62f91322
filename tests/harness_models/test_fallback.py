"""Fallback chains: the real `openai` client against the OpenAI scripted server failing, then the real `anthropic`
client against the Anthropic scripted server answering; chains built from configuration."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from pydantic import ValidationError

from loopd._infra.clock import VirtualClock
from loopd.harness._errors import ModelPermanentError, ModelRetryableError
from loopd.harness.models import (
    AttemptFailed,
    FallbackModel,
    ModelChunk,
    ModelConfig,
    ModelTarget,
    ReplyInfo,
    build_model,
)
from loopd.harness.models._anthropic import AnthropicModel
from loopd.harness.models._anthropic_server import AnthropicScriptedServer, open_anthropic_server
from loopd.harness.models._scripted_server import (
    DropAfter,
    FailWithStatus,
    ScriptedServer,
    ServerReply,
    open_scripted_server,
)
from tests.support.waiting import eventually

from .helpers import ask, collect


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def chain(
    stack: AsyncExitStack, openai_script: Any, anthropic_script: Any, *, clock: VirtualClock, **env: str
) -> tuple[ScriptedServer, AnthropicScriptedServer, FallbackModel]:
    primary = ScriptedServer(openai_script)
    secondary = AnthropicScriptedServer(anthropic_script)
    openai_url = await stack.enter_async_context(open_scripted_server(primary))
    anthropic_url = await stack.enter_async_context(open_anthropic_server(secondary))
    config = ModelConfig.from_env(
        {
            "LOOPD_MODEL": "gpt-4o-mini,anthropic:claude-haiku-4-5",
            "OPENAI_BASE_URL": openai_url,
            "OPENAI_API_KEY": "sk-openai",
            "ANTHROPIC_BASE_URL": anthropic_url,
            "ANTHROPIC_API_KEY": "sk-ant",
            **env,
        },
        timeout=5.0,
    )
    model = build_model(config, clock=clock)
    stack.push_async_callback(model.aclose)
    assert isinstance(model, FallbackModel)
    return primary, secondary, model


async def test_a_429_then_the_secondary_answers_and_the_failed_attempt_is_reported(stack: AsyncExitStack) -> None:
    clock = VirtualClock()
    primary, secondary, model = await chain(
        stack,
        [ServerReply(fault=FailWithStatus(status=429, retry_after=30, message="slow down"))],
        [ServerReply(text="Claude here."), ServerReply(text="Claude again.")],
        clock=clock,
    )
    got = await collect(model.stream(ask("hi")))
    assert got.error is None and got.text == "Claude here."
    failed = [c for c in got.chunks if isinstance(c, AttemptFailed)]
    assert len(failed) == 1 and got.chunks[0] is failed[0]
    attempt = failed[0]
    assert (attempt.attempt, attempt.provider, attempt.model, attempt.next) == (0, "openai", "gpt-4o-mini", "fallback")
    assert attempt.status_code == 429 and attempt.retry_after == 30 and "slow down" in attempt.message
    assert [i.provider for i in got.chunks if isinstance(i, ReplyInfo)] == ["anthropic"]
    assert primary.requests[0].model == "gpt-4o-mini" and secondary.requests[0].model == "claude-haiku-4-5"
    assert got.usage.calls == 1 and got.usage.input_tokens > 0

    # Retry-After is honoured: within its 30 s the primary is not asked again
    await clock.advance(10)
    again = await collect(model.stream(ask("and now?")))
    assert again.text == "Claude again." and not [c for c in again.chunks if isinstance(c, AttemptFailed)]
    assert primary.statistics().requests == 1


async def test_503s_on_both_wait_a_round_then_the_primary_recovers(stack: AsyncExitStack) -> None:
    clock = VirtualClock()
    primary, secondary, model = await chain(
        stack,
        [ServerReply(fault=FailWithStatus(status=503)), ServerReply(text="OpenAI is back.")],
        [ServerReply(fault=FailWithStatus(status=503, retry_after=2))],
        clock=clock,
    )
    stream = model.stream(ask("hi"))
    chunks: list[ModelChunk] = []

    async def drain() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    task = asyncio.create_task(drain())
    # both providers answer over real HTTP; the round's backoff is the one sleep on the virtual clock
    await eventually(lambda: clock.sleepers == 1, what="the chain sleeping its round's backoff")
    deadline = clock.next_deadline
    assert deadline is not None and deadline > 0
    await clock.advance(deadline)
    await asyncio.wait_for(task, timeout=30)
    failed = [c for c in chunks if isinstance(c, AttemptFailed)]
    assert [(f.attempt, f.provider, f.next) for f in failed] == [(0, "openai", "fallback"), (1, "anthropic", "retry")]
    assert "".join(c.text for c in chunks if c.kind == "text") == "OpenAI is back."
    assert primary.statistics().requests == 2 and secondary.statistics().requests == 1


async def test_a_permanent_error_is_raised_without_falling_back(stack: AsyncExitStack) -> None:
    _, secondary, model = await chain(
        stack,
        [ServerReply(fault=FailWithStatus(status=401, message="bad key"))],
        [ServerReply(text="never")],
        clock=VirtualClock(),
    )
    got = await collect(model.stream(ask("hi")))
    assert isinstance(got.error, ModelPermanentError) and got.error.status_code == 401
    assert secondary.statistics().requests == 0


async def test_a_full_rate_limit_queue_moves_the_call_on(stack: AsyncExitStack) -> None:
    clock = VirtualClock()
    _, _, model = await chain(
        stack,
        [ServerReply(text="first")],
        [ServerReply(text="from Claude")],
        clock=clock,
        LOOPD_RATE_LIMITS="openai:rpm=1",
        LOOPD_RATE_QUEUE="0",
    )
    first = await collect(model.stream(ask("one")))
    second = await collect(model.stream(ask("two")))
    assert (first.text, second.text) == ("first", "from Claude")
    failed = [c for c in second.chunks if isinstance(c, AttemptFailed)]
    assert [f.error_type for f in failed] == ["RateLimitQueueFull"]


def test_chains_parse_and_bad_ones_are_refused() -> None:
    config = ModelConfig.from_env({"LOOPD_MODEL": "anthropic:claude-sonnet-4-5, gpt-4o-mini ,claude-haiku-4-5"})
    assert config.chain() == (
        ModelTarget(provider="anthropic", model="claude-sonnet-4-5"),
        ModelTarget(provider="openai", model="gpt-4o-mini"),
        ModelTarget(provider="anthropic", model="claude-haiku-4-5"),
    )
    assert config.missing_keys() == ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    assert ModelConfig.from_env({}).chain() == ()
    for bad in ("gpt-4o,", "mistral:large", "openai:", "demo,gpt-4o"):
        with pytest.raises(ValidationError):
            ModelConfig.from_env({"LOOPD_MODEL": bad})


def test_a_single_model_is_its_adapter_and_a_prefixed_one_a_chain_of_one() -> None:
    env = {"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}
    plain = build_model(ModelConfig.from_env(env, model="claude-haiku-4-5"))
    assert isinstance(plain, AnthropicModel) and plain.name == "claude-haiku-4-5"
    prefixed = build_model(ModelConfig.from_env(env, model="anthropic:claude-haiku-4-5"))
    assert isinstance(prefixed, FallbackModel) and prefixed.entries[0].model.name == "claude-haiku-4-5"
    with pytest.raises(ModelPermanentError, match="ANTHROPIC_API_KEY"):
        build_model(ModelConfig.from_env({}, model="claude-haiku-4-5"))


def test_the_api_keys_never_show_in_the_configuration_repr() -> None:
    config = ModelConfig.from_env({"ANTHROPIC_API_KEY": "sk-ant-secret", "LOOPD_MODEL": "claude-haiku-4-5"})
    assert "sk-ant-secret" not in repr(config) and "sk-ant-secret" not in config.model_dump_json()


async def test_an_error_after_output_is_raised_not_handed_over(stack: AsyncExitStack) -> None:
    _, secondary, model = await chain(
        stack,
        [ServerReply(text="a partial answer", chunk_size=3, fault=DropAfter(chunks=4))],
        [ServerReply(text="never")],
        clock=VirtualClock(),
    )
    got = await collect(model.stream(ask("hi")))
    assert got.text and isinstance(got.error, ModelRetryableError)
    assert secondary.statistics().requests == 0


async def test_a_switched_model_goes_to_the_chains_adapter_for_its_provider(stack: AsyncExitStack) -> None:
    primary, secondary, model = await chain(
        stack, [ServerReply(text="never")], [ServerReply(text="Sonnet here.")], clock=VirtualClock()
    )
    request = ask("hi").model_copy(update={"model": "claude-sonnet-4-5"})  # e.g. after `/model claude-sonnet-4-5`
    got = await collect(model.stream(request))
    assert got.text == "Sonnet here." and secondary.requests[0].model == "claude-sonnet-4-5"
    assert primary.statistics().requests == 0
    for unknown in ("mistral:large", "gpt-4o,"):
        bad = await collect(model.stream(ask("hi").model_copy(update={"model": unknown})))
        assert isinstance(bad.error, ModelPermanentError)


async def test_a_model_of_a_provider_missing_from_the_chain_is_refused_before_any_call() -> None:
    model = build_model(ModelConfig.from_env({"OPENAI_API_KEY": "k"}, model="openai:gpt-4o-mini"))
    assert isinstance(model, FallbackModel)
    got = await collect(model.stream(ask("hi").model_copy(update={"model": "claude-haiku-4-5"})))
    await model.aclose()
    assert isinstance(got.error, ModelPermanentError) and "no anthropic provider" in str(got.error)
