"""SSE framing (binding 1.0): rendering, parsing, incremental splitting."""

from __future__ import annotations

import pytest

from loopd.agentue import (
    SSE_HEADERS,
    AgentUEValidationError,
    AppendEvent,
    EndEvent,
    SseMessage,
    decode_sse_event,
    encode_sse_event,
    iter_sse,
    parse_sse,
    render_sse,
    split_sse,
    sse_comment,
)


def test_headers_are_the_bindings() -> None:
    assert dict(SSE_HEADERS) == {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def test_an_event_is_one_data_line_with_an_optional_cursor_and_no_event_name() -> None:
    event = AppendEvent.to(3, "answer", "content", "héllo\nwörld")
    frame = encode_sse_event(event, cursor="1740000000000-2")
    assert frame == (
        'id: 1740000000000-2\ndata: {"op":"append","seq":3,"mask":"block.content",'
        '"block":{"id":"answer","content":"héllo\\nwörld"}}\n\n'
    )
    assert "event:" not in frame
    decoded = decode_sse_event(frame)
    assert decoded.event == event and decoded.cursor == "1740000000000-2"
    assert encode_sse_event({"op": "end", "seq": 4}) == 'data: {"op":"end","seq":4}\n\n'


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
        with pytest.raises(AgentUEValidationError):
            render_sse(message)


def test_multi_line_data_is_split_and_joined_with_lf() -> None:
    frame = render_sse(SseMessage(data="one\ntwo\r\nthree"))
    assert frame == "data: one\ndata: two\ndata: three\n\n"
    assert parse_sse(frame).data == "one\ntwo\nthree"


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
    body = "\ufeff" + sse_comment("ping") + encode_sse_event(EndEvent(seq=2), cursor="c") + "data: cut"
    messages = iter_sse(body)
    assert [m.comments for m in messages] == [("ping",), ()]
    assert decode_sse_event(messages[1]).event == EndEvent(seq=2)


def test_decoding_a_message_without_data_or_with_bad_json_fails_clearly() -> None:
    with pytest.raises(AgentUEValidationError, match="no data"):
        decode_sse_event(": ping\n\n")
    with pytest.raises(AgentUEValidationError, match="invalid JSON"):
        decode_sse_event("data: {nope\n\n")
    with pytest.raises(AgentUEValidationError, match="invalid JSON"):
        decode_sse_event('data: {"op":"end","seq":NaN}\n\n')
    with pytest.raises(AgentUEValidationError, match=r"event\.op"):
        decode_sse_event('data: {"op":"nope","seq":1}\n\n')
