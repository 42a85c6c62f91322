"""The floor's SSE framing (``loopd._infra.sse``): the one encoder and the one parser, by the event-stream rules."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd._infra.sse import (
    SSE_PING,
    SseFormatError,
    SseMessage,
    iter_sse,
    parse_sse,
    read_sse,
    render_sse,
    split_sse,
    sse_comment,
    sse_message,
)

SETTINGS = settings(max_examples=150, deadline=None)
one_line = st.text(st.characters(exclude_characters="\r\n"), max_size=12)


def test_parse_follows_the_event_stream_rules() -> None:
    message = parse_sse(": keep-alive\r\nevent: x\r\nid:no-space\ndata:a\ndata:  b\ndata\nretry: 1500\nfoo: bar\n")
    assert message == SseMessage(data="a\n b\n", id="no-space", event="x", retry=1500, comments=("keep-alive",))
    assert parse_sse("id: a\0b\ndata: x").id is None  # an id with NUL is ignored
    assert parse_sse("retry: 1e3\ndata: x").retry is None
    assert parse_sse(": only a comment").data is None


def test_render_refuses_what_cannot_be_framed() -> None:
    for message in (
        SseMessage(data="x", id="a\nb"),
        SseMessage(data="x", id="a\0b"),
        SseMessage(data="x", event="a\rb"),
        SseMessage(comments=("two\nlines",)),
        SseMessage(data="x", retry=-1),
        SseMessage(),
    ):
        with pytest.raises(SseFormatError):
            render_sse(message)


def test_multi_line_data_is_split_and_joined_with_lf() -> None:
    frame = render_sse(SseMessage(data="one\ntwo\r\nthree"))
    assert frame == "data: one\ndata: two\ndata: three\n\n"
    assert parse_sse(frame).data == "one\ntwo\nthree"


@pytest.mark.parametrize(
    "text",
    [
        '{"text":"a\u2028b\u2029c\x85d\x0be\x1cf"}',  # separators str.splitlines knows but SSE does not
        "first\nsecond\r\nthird",
        "",
    ],
)
def test_an_sse_message_carries_its_text_intact(text: str) -> None:
    raw = sse_message(text, event="item", id=7)
    assert raw.startswith(b"id: 7\nevent: item\ndata: ")  # the servers' frames: id, event name, data
    (message,) = iter_sse(raw.decode())
    assert (message.id, message.event, message.data) == ("7", "item", text.replace("\r\n", "\n"))


def test_the_heartbeat_is_a_comment_without_data() -> None:
    (ping,) = iter_sse(SSE_PING.decode())
    assert ping == SseMessage(comments=("ping",))
    assert sse_comment("ping").encode() == SSE_PING


def test_split_keeps_the_unfinished_rest_across_chunks() -> None:
    stream = ': ping\n\nid: 1\r\ndata: {"op":"end","seq":1}\r\n\r\n\n\ndata: partial'
    frames, rest = split_sse(stream)
    assert frames == [": ping", 'id: 1\ndata: {"op":"end","seq":1}']
    assert rest == "data: partial"
    # A CR at the end of a chunk may be the first half of CRLF: it is held back.
    frames, rest = split_sse("data: x\r")
    assert frames == [] and rest == "data: x\r"
    frames, rest = split_sse(rest + "\n\r\n")
    assert frames == ["data: x"] and rest == ""


def test_iter_sse_reads_a_whole_body_and_drops_a_cut_off_message() -> None:
    body = "\ufeff" + sse_comment("ping") + render_sse(SseMessage(data="x", id="c")) + "data: cut"
    assert iter_sse(body) == [SseMessage(comments=("ping",)), SseMessage(data="x", id="c")]


@SETTINGS
@given(
    data=st.none() | st.text(st.characters(exclude_characters="\r"), max_size=30),
    id_=st.none() | st.text(st.characters(exclude_characters="\r\n\x00"), max_size=8),
    event=st.none() | one_line,
    retry=st.none() | st.integers(0, 10**6),
    comments=st.lists(one_line, max_size=2).map(tuple),
)
def test_messages_round_trip(
    data: str | None, id_: str | None, event: str | None, retry: int | None, comments: tuple[str, ...]
) -> None:
    message = SseMessage(data=data, id=id_, event=event, retry=retry, comments=comments)
    if message == SseMessage():
        return
    assert parse_sse(render_sse(message)) == message


async def _chunks(*parts: str) -> AsyncIterator[str]:
    for part in parts:
        yield part


async def _read(*parts: str) -> list[SseMessage]:
    return [message async for message in read_sse(_chunks(*parts))]


@SETTINGS
@given(
    messages=st.lists(
        st.builds(
            SseMessage,
            data=st.text(st.characters(exclude_characters="\r"), max_size=12),
            id=st.none() | st.text(st.characters(exclude_characters="\r\n\x00"), max_size=6),
            event=st.none() | one_line,
        ),
        max_size=5,
    ),
    crlf=st.booleans(),
    data=st.data(),
)
async def test_read_sse_yields_the_same_messages_however_the_stream_is_cut(
    messages: list[SseMessage], crlf: bool, data: st.DataObject
) -> None:
    body = "\ufeff" + "".join(render_sse(m) for m in messages)
    if crlf:
        body = body.replace("\n", "\r\n")
    cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(body))), max_size=8), label="cuts"))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert await _read(*parts) == messages


async def test_read_sse_drops_a_message_cut_off_by_the_end_of_the_stream() -> None:
    assert await _read(": ping\n\nid: 1\ndata: {}\n\n", "data: cut") == [
        SseMessage(comments=("ping",)),
        SseMessage(data="{}", id="1"),
    ]
