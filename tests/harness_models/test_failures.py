"""Provider failures become typed errors; retries are bounded, jittered and only before the first chunk."""

from __future__ import annotations

import pytest

from loopd._infra.backoff import Backoff
from loopd.harness._errors import ModelPermanentError, ModelRetryableError
from loopd.harness.models._protocol import TextDelta
from loopd.harness.models._scripted_server import DropAfter, FailWithStatus, ServerReply, ServerToolCall

from .conftest import Serve
from .helpers import ask, collect


async def test_a_disconnect_before_any_output_is_retried_and_recovers(serve: Serve) -> None:
    # Chunk 1 is the role-only chunk: the adapter has yielded nothing when the connection drops.
    served = await serve([ServerReply(text="lost", fault=DropAfter(chunks=1)), ServerReply(text="recovered")])

    got = await collect(served.model.stream(ask("hi")))

    assert got.error is None
    assert got.text == "recovered"
    assert len(served.sleep.delays) == 1
    stats = await served.server.wait_until(lambda s: s.completed == 1)
    assert (stats.requests, stats.dropped) == (2, 1)


async def test_a_disconnect_after_output_surfaces_as_retryable_without_retry(serve: Serve) -> None:
    served = await serve(
        [ServerReply(text="partial answer", chunk_size=4, fault=DropAfter(chunks=3)), ServerReply(text="never")]
    )

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelRetryableError)
    assert "dropped" in str(got.error)
    assert got.text == "partial "
    assert served.sleep.delays == []
    assert served.server.remaining == 1, "the caller decides whether to retry once text has streamed"


async def test_retries_are_bounded(serve: Serve) -> None:
    failure = ServerReply(fault=FailWithStatus(status=503, message="overloaded"))
    served = await serve([failure, failure, failure, ServerReply(text="too late")], max_retries=2)

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelRetryableError)
    assert got.error.status_code == 503
    assert "overloaded" in str(got.error)
    assert len(served.sleep.delays) == 2
    assert served.server.statistics().requests == 3
    assert served.server.remaining == 1


async def test_backoff_grows_exponentially_with_full_jitter(serve: Serve) -> None:
    failure = ServerReply(fault=FailWithStatus(status=500))
    served = await serve(
        [failure] * 4 + [ServerReply(text="ok")],
        max_retries=4,
        backoff=Backoff(base=1.0, factor=2.0, max_delay=5.0),
        random=lambda: 0.5,
    )

    got = await collect(served.model.stream(ask("hi")))

    assert got.text == "ok"
    assert served.sleep.delays == [0.5, 1.0, 2.0, 2.5]  # half of 1, 2, 4, min(8, 5)


async def test_rate_limit_retry_after_is_honoured(serve: Serve) -> None:
    served = await serve(
        [ServerReply(fault=FailWithStatus(status=429, retry_after=7)), ServerReply(text="ok")],
        random=lambda: 0.0,
    )

    got = await collect(served.model.stream(ask("hi")))

    assert got.text == "ok"
    assert served.sleep.delays == [7.0]


async def test_a_retry_after_beyond_the_limit_is_raised_not_waited(serve: Serve) -> None:
    served = await serve(
        [ServerReply(fault=FailWithStatus(status=429, retry_after=30)), ServerReply(text="ok")],
        max_retry_after=5,
    )

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelRetryableError)
    assert got.error.status_code == 429
    assert got.error.retry_after == 30
    assert served.sleep.delays == []


async def test_a_bad_request_is_permanent_and_not_retried(serve: Serve) -> None:
    served = await serve(
        [ServerReply(fault=FailWithStatus(status=400, message="context too long")), ServerReply(text="ok")]
    )

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelPermanentError)
    assert got.error.status_code == 400
    assert "context too long" in str(got.error)
    assert served.sleep.delays == []
    assert served.server.remaining == 1


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(401, False), (403, False), (404, False), (422, False), (408, True), (409, True), (500, True), (502, True)],
)
async def test_status_codes_map_to_typed_errors(serve: Serve, status: int, retryable: bool) -> None:
    served = await serve([ServerReply(fault=FailWithStatus(status=status))], max_retries=0)

    got = await collect(served.model.stream(ask("hi")))

    assert got.error is not None
    assert got.error.retryable is retryable
    assert isinstance(got.error, ModelRetryableError if retryable else ModelPermanentError)
    assert got.error.status_code == status
    assert isinstance(got.error.__cause__, Exception), "the provider error is kept as the cause"


async def test_a_wrong_api_key_is_permanent(serve: Serve) -> None:
    served = await serve([ServerReply(text="ok")], api_key="the-right-key")

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelPermanentError)
    assert got.error.status_code == 401
    assert served.sleep.delays == []


async def test_a_silent_provider_times_out_as_retryable(serve: Serve) -> None:
    served = await serve([ServerReply(text="slow", delay=5.0)], timeout=0.2, max_retries=0)

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelRetryableError)
    assert "timed out" in str(got.error)
    await served.server.wait_until(lambda s: s.disconnected == 1)


async def test_a_stall_between_chunks_times_out(serve: Serve) -> None:
    served = await serve([ServerReply(text="abcdef", chunk_size=2, chunk_delay=5.0)], timeout=0.2, max_retries=0)

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelRetryableError)
    assert got.text == "", "the role chunk came, then silence"


async def test_an_exhausted_script_is_a_permanent_error(serve: Serve) -> None:
    served = await serve([])

    got = await collect(served.model.stream(ask("hi")))

    assert isinstance(got.error, ModelPermanentError)
    assert "no reply left" in str(got.error)


async def test_malformed_tool_arguments_fail_when_assembled(serve: Serve) -> None:
    served = await serve([ServerReply(tool_calls=(ServerToolCall(name="read_file", arguments='{"path": '),))])

    got = await collect(served.model.stream(ask("hi")))

    assert got.error is None
    with pytest.raises(ModelPermanentError, match="malformed JSON"):
        _ = got.tool_calls


async def test_text_before_a_failure_is_delivered_in_order(serve: Serve) -> None:
    served = await serve([ServerReply(text="abcdefgh", chunk_size=2, fault=DropAfter(chunks=3))])

    got = await collect(served.model.stream(ask("hi")))

    assert [c.text for c in got.chunks if isinstance(c, TextDelta)] == ["ab", "cd"]
    assert isinstance(got.error, ModelRetryableError)
