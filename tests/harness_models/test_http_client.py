"""The adapters' default HTTP client (`loopd.harness.models._http`): aiohttp under ``httpx2``'s API, with a bound on
getting a response's head and connection errors told apart from timeouts — against raw servers on loopback that
misbehave the way real ones do."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Literal

import httpx2
import pytest

from loopd.harness._errors import ModelRetryableError
from loopd.harness.models._anthropic import AnthropicModel
from loopd.harness.models._http import _Guarded, default_http_client, head_deadline
from loopd.harness.models._openai import OpenAICompatibleModel
from loopd.resources import load_or_create_credentials

from .helpers import Collected, ask, collect

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

SSE_REPLY = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":"hello"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


@asynccontextmanager
async def raw_server(handle: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """A TCP server on loopback (over TLS with ``tls``) running ``handle`` per connection; its port."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 5.0)


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """A whole request (head and Content-Length body); its request line."""
    head = await read_head(reader)
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    await asyncio.wait_for(reader.readexactly(length), 5.0)
    return lines[0]


def model(port: int, *, timeout: float) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(
        "gpt-4o-mini", base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", timeout=timeout, max_retries=0
    )


async def ask_once(adapter: OpenAICompatibleModel | AnthropicModel, text: str = "hi") -> Collected:
    """One call's outcome; the adapter is closed after it."""
    try:
        return await collect(adapter.stream(ask(text)))
    finally:
        await adapter.aclose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_head_deadline_is_the_sum_of_the_request_timeouts() -> None:
    assert head_deadline({"connect": 1.0, "pool": 2.0, "write": 3.0, "read": 4}) == 10.0
    assert head_deadline({"connect": 1.0, "pool": 2.0, "write": None, "read": 4.0}) is None
    assert head_deadline({"connect": 1.0}) is None
    assert head_deadline(None) is None


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_the_default_client_guards_its_transport_and_each_proxys(
    monkeypatch: pytest.MonkeyPatch, sdk: Literal["openai", "anthropic"]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = default_http_client(5.0, sdk)
    try:
        assert isinstance(client, httpx2.AsyncClient) and type(client).__mro__[2].__module__.startswith(sdk)
        assert isinstance(client._transport, _Guarded)
        mounted = [transport for transport in client._mounts.values() if transport is not None]
        assert mounted and all(isinstance(transport, _Guarded) for transport in mounted)
    finally:
        await client.aclose()


async def test_a_streamed_reply_comes_through_an_http_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(SSE_REPLY))
        writer.write(SSE_REPLY)
        await writer.drain()
        writer.close()

    async with raw_server(proxy) as proxy_port:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        adapter = model(free_port(), timeout=5.0)  # nothing listens there: only the proxy can answer
        try:
            got = await collect(adapter.stream(ask("hi")))
        finally:
            await adapter.aclose()

    assert got.error is None
    assert got.text == "hello"
    assert seen and seen[0].startswith(b"POST http://127.0.0.1:") and seen[0].endswith(b"/v1/chat/completions HTTP/1.1")


# aiohttp warns that a body over 1 MiB is written in one go; it must be larger than the socket buffers here.
@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
async def test_a_server_that_never_takes_the_body_times_out() -> None:
    release = asyncio.Event()

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 10.0)
        writer.close()

    async with raw_server(never_reads) as port:
        adapter = model(port, timeout=0.2)
        started = time.monotonic()
        try:
            async with asyncio.timeout(10.0):  # without the guard: stuck writing 8 MB nobody reads
                got = await collect(adapter.stream(ask("x" * 8_000_000)))
        finally:
            release.set()
            await adapter.aclose()

    assert isinstance(got.error, ModelRetryableError)
    assert "timed out" in str(got.error)
    assert time.monotonic() - started < 5.0  # connect + pool + write + read: 0.8 s


async def test_a_server_that_hangs_up_before_answering_is_a_dropped_connection() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.close()

    async with raw_server(hangs_up) as port:
        got = await ask_once(model(port, timeout=5.0))

    assert isinstance(got.error, ModelRetryableError)
    assert "connection failed or dropped" in str(got.error)
    assert "RemoteProtocolError" in str(got.error)


async def test_a_refused_connection_is_a_connection_error_not_a_timeout() -> None:
    got = await ask_once(model(free_port(), timeout=5.0))

    assert isinstance(got.error, ModelRetryableError)
    assert "connection failed or dropped (ConnectError" in str(got.error)


async def test_the_anthropic_adapter_reads_through_the_guarded_client_too() -> None:
    adapter = AnthropicModel(
        "claude-test", api_key="sk-test", base_url=f"http://127.0.0.1:{free_port()}", max_retries=0
    )
    try:
        assert isinstance(adapter._client._client._transport, _Guarded)
        got = await collect(adapter.stream(ask("hi")))
    finally:
        await adapter.aclose()

    assert isinstance(got.error, ModelRetryableError)
    assert "timed out" not in str(got.error)


async def test_a_connection_reset_mid_stream_is_a_dropped_connection() -> None:
    async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        first = SSE_REPLY.split(b"\n\n", 1)[0] + b"\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(first), first))
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = RST
        writer.transport.abort()

    async with raw_server(resets) as port:
        got = await ask_once(model(port, timeout=5.0))

    assert isinstance(got.error, ModelRetryableError)
    assert got.text == "hello"
    assert "timed out" not in str(got.error)


async def test_the_guard_leaves_other_transports_errors_alone() -> None:
    def fail(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectTimeout("a real connect timeout", request=request)

    guarded = _Guarded(httpx2.MockTransport(fail))
    async with httpx2.AsyncClient(transport=guarded, timeout=1.0) as client:
        with pytest.raises(httpx2.ConnectTimeout, match="a real connect timeout"):
            await client.get("http://127.0.0.1:1/")


async def test_a_server_with_a_private_ca_is_trusted_through_ssl_cert_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = load_or_create_credentials(tmp_path)  # a private CA and a certificate for 127.0.0.1 it signed
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(credentials.server_cert_file, credentials.server_key_file)

    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            await read_request(reader)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
            head += b"content-length: %d\r\n\r\n"
            writer.write(head % len(SSE_REPLY) + SSE_REPLY)
            await writer.drain()
        writer.close()

    async with raw_server(answers, context) as port:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        untrusted = OpenAICompatibleModel(
            "gpt-4o-mini", base_url=f"https://127.0.0.1:{port}/v1", api_key="sk-test", timeout=5.0, max_retries=0
        )
        try:
            refused = await collect(untrusted.stream(ask("hi")))
        finally:
            await untrusted.aclose()
        monkeypatch.setenv("SSL_CERT_FILE", str(credentials.ca_cert_file))
        trusted = OpenAICompatibleModel(
            "gpt-4o-mini", base_url=f"https://127.0.0.1:{port}/v1", api_key="sk-test", timeout=5.0, max_retries=0
        )
        try:
            got = [await collect(trusted.stream(ask("hi"))) for _ in range(2)]  # each on its own connection
        finally:
            await trusted.aclose()

    assert isinstance(refused.error, ModelRetryableError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.error) and "timed out" not in str(refused.error)
    assert [(g.error, g.text) for g in got] == [(None, "hello")] * 2
