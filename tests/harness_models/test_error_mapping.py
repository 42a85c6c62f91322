"""Foreign `openai` errors become typed harness errors; Retry-After in all its spellings; odd streams."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import openai
import pytest

from loopd.harness._errors import ModelError, ModelPermanentError, ModelRetryableError
from loopd.harness.models._openai import OpenAICompatibleModel, model_error, retry_after_seconds

from .helpers import ask, collect

# The HTTP library under the installed `openai` (httpx2 since openai 3; the errors need its Request/Response).
httpx2 = pytest.importorskip("httpx2")

REQUEST = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")


def status_error(status: int, headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST)
    return openai.APIStatusError("boom", response=response, body={"message": "provider says no"})


def test_x_should_retry_overrides_the_status_rule() -> None:
    assert isinstance(model_error(status_error(503, {"x-should-retry": "false"}), "m"), ModelPermanentError)
    assert isinstance(model_error(status_error(400, {"x-should-retry": "true"}), "m"), ModelRetryableError)


def test_the_provider_message_is_kept() -> None:
    error = model_error(status_error(400), "gpt-x")

    assert str(error) == "model gpt-x: HTTP 400: provider says no"


def test_connection_and_timeout_errors_are_retryable() -> None:
    assert isinstance(model_error(openai.APIConnectionError(request=REQUEST), "m"), ModelRetryableError)
    assert isinstance(model_error(openai.APITimeoutError(request=REQUEST), "m"), ModelRetryableError)


def test_an_in_band_stream_error_is_retryable() -> None:
    error = model_error(openai.APIError("overloaded", REQUEST, body=None), "m")

    assert isinstance(error, ModelRetryableError)


def test_other_client_errors_are_permanent() -> None:
    assert isinstance(model_error(openai.OpenAIError("no key"), "m"), ModelPermanentError)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "Wed, 01 Jan 2031 00:00:10 GMT"}, 10.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_from_headers(headers: dict[str, str], seconds: float | None) -> None:
    now = datetime(2031, 1, 1, tzinfo=UTC)

    assert retry_after_seconds(headers, now=now) == seconds


def sse(*events: str) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


def chunk(delta: dict[str, object], finish: str | None = None) -> str:
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return json.dumps(body)


async def stream_over(body: bytes, *, max_retries: int = 0) -> tuple[str, ModelError | None, int]:
    calls = 0

    def handler(request: object) -> object:
        nonlocal calls
        calls += 1
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    client = openai.AsyncOpenAI(base_url="http://provider.test/v1", api_key="k", max_retries=0, http_client=http)
    async with client:
        model = OpenAICompatibleModel("m", api_key="k", client=client, max_retries=max_retries, sleep=no_sleep)
        got = await collect(model.stream(ask("hi")))
    return got.text, got.error, calls


async def no_sleep(_: float) -> None:
    return None


async def test_a_stream_that_ends_without_finishing_is_retryable() -> None:
    text, error, calls = await stream_over(sse(chunk({"content": "half"}), "[DONE]"), max_retries=3)

    assert text == "half"
    assert isinstance(error, ModelRetryableError)
    assert "ended before the model finished" in str(error)
    assert calls == 1, "text had streamed: no silent retry"


async def test_an_in_band_error_event_is_retried_before_any_output() -> None:
    text, error, calls = await stream_over(sse(json.dumps({"error": {"message": "overloaded"}})), max_retries=2)

    assert text == ""
    assert isinstance(error, ModelRetryableError)
    assert "overloaded" in str(error)
    assert calls == 3
