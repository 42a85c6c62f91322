"""The conversation-title run's model requests: loop-server names each new conversation with a model call of its
own (a background run), which tests counting a responder's model requests leave out."""

from __future__ import annotations

from loopd.harness.models import IncomingRequest, ServerReply
from loopd.server.chat._titles import TITLE_PROMPT

TITLE_REPLY = '{"title": "A conversation", "summary": "What it is about."}'


def is_title_request(request: IncomingRequest) -> bool:
    """Whether ``request`` is the title run's (its system prompt is the title prompt)."""
    return any(m.get("role") == "system" and m.get("content") == TITLE_PROMPT for m in request.messages[:1])


def title_reply() -> ServerReply:
    """A well-formed answer to a title request."""
    return ServerReply(text=TITLE_REPLY)
