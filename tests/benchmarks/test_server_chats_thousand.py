"""The lost-chats round of server_chats: a chat counts only when its stream ended completed and the answer read
back is completed, is the streamed text and echoes that chat's own question — checked on a real `loopd up`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from benchmarks._server import StreamRefused, running_server
from benchmarks.server_chats import Chat, _lost_chat, answer_kept, question, run_thousand, stored_answer


def _messages(status: str, answer: str) -> list[dict[str, Any]]:
    user = {"purpose": "input", "status": "completed", "content": {"blocks": [{"id": "text", "content": "q"}]}}
    blocks = [{"id": "answer", "type": "text", "content": answer}, {"id": "result", "content": answer}]
    return [user, {"purpose": "response", "status": status, "content": {"blocks": blocks}}]


def test_a_chat_is_kept_only_with_its_own_complete_answer_stored() -> None:
    text = f"You said: “{question(3)}”\n\nmore"
    streamed = Chat(0.1, 0.2, True, text)
    assert stored_answer(_messages("completed", text)) == ("completed", text)
    assert answer_kept(streamed, 3, stored_answer(_messages("completed", text)))
    assert not answer_kept(streamed, 4, stored_answer(_messages("completed", text)))  # another chat's answer
    assert not answer_kept(streamed, 3, stored_answer(_messages("streaming", text)))  # not finished in storage
    assert not answer_kept(streamed, 3, stored_answer(_messages("completed", text[:-2])))  # cut short
    assert not answer_kept(Chat(0.1, 0.2, False, text), 3, stored_answer(_messages("completed", text)))
    assert not answer_kept(streamed, 3, stored_answer(_messages("completed", text)[:1]))  # no answer stored
    assert not answer_kept(streamed, 3, None)  # could not be read back


def test_a_lost_chat_says_why() -> None:
    refused = StreamRefused("POST /v1/conversations/c/messages: HTTP/1.1 503 Service Unavailable b'{}'")
    assert _lost_chat(0.0, refused).error == "refused with HTTP 503"
    assert _lost_chat(0.0, TimeoutError()).error == "TimeoutError"
    assert not _lost_chat(0.0, TimeoutError()).ok


def test_a_small_round_on_a_real_server_loses_nothing(tmp_path: Path) -> None:
    with running_server(tmp_path) as server:
        kept = asyncio.run(run_thousand(server, 4))
    assert (kept.run.chats, kept.streamed, kept.stored, kept.lost, kept.reasons) == (4, 4, 4, 0, ())
    assert kept.run.ok == 4 and kept.run.ttft_p95_ms == kept.run.ttft_p95_ms  # a number, not NaN
