"""The AgentUE SSE binding 1.0: one event per message, an optional cursor, no event name (the generic framing is
the floor's: tests/infra/test_sse.py)."""

from __future__ import annotations

import pytest

from loopd._infra.sse import iter_sse, sse_comment
from loopd.agentue import (
    SSE_HEADERS,
    AgentUEValidationError,
    AppendEvent,
    EndEvent,
    decode_sse_event,
    encode_sse_event,
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


def test_a_cursor_that_cannot_be_framed_is_an_agentue_error() -> None:
    for cursor in ("a\nb", "a\0b"):
        with pytest.raises(AgentUEValidationError, match=r"sse\.id"):
            encode_sse_event(EndEvent(seq=1), cursor=cursor)


def test_events_are_read_from_a_whole_body() -> None:
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
