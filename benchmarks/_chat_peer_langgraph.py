"""The LangGraph peer of `benchmarks.server_chats`: chats to LangGraph's Agent Server (``langgraph dev``).

The server (`benchmarks._langgraph`: in-memory state) serves a one-node graph over ``MessagesState`` whose node
asks a zero-latency fake chat model (a ``BaseChatModel`` streaming the bare peer's answer, `answer_text`, in the demo
model's 12-character pieces) and returns its message. One chat = a thread (``POST /threads``) and
``POST /threads/{thread_id}/runs/stream`` with ``stream_mode: messages-tuple``: the answer's pieces arrive as
``messages`` events as the model streams them, and the response ends when the run has finished. Time to first
token = the POST's start → the first ``messages`` event carrying text; completion = → the end of the response.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final

from benchmarks._chat_peer_bare import CHUNK, NOTE, answer_text
from benchmarks._server import frame_data, now, open_event_stream

GRAPH_ID: Final = "chat"

GRAPH_SOURCE: Final = f'''
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph

NOTE = {NOTE!r}
CHUNK = {CHUNK!r}


def answer(messages: list[BaseMessage]) -> str:
    question = str(messages[-1].content) if messages else ""
    return f"You said: \\u201c{{question}}\\u201d\\n\\n{{NOTE}}"


class FakeChat(BaseChatModel):
    """Zero latency: the answer at once, or streamed in CHUNK-character pieces."""

    @property
    def _llm_type(self) -> str:
        return "bench-fake-chat"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=answer(messages)))])

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Iterator[ChatGenerationChunk]:
        text = answer(messages)
        for start in range(0, len(text), CHUNK):
            yield ChatGenerationChunk(message=AIMessageChunk(content=text[start : start + CHUNK]))

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._stream(messages):
            yield chunk


model = FakeChat()


async def respond(state: MessagesState) -> dict[str, Any]:
    return {{"messages": [await model.ainvoke(state["messages"])]}}


builder = StateGraph(MessagesState)
builder.add_node("respond", respond)
builder.add_edge(START, "respond")
builder.add_edge("respond", END)
graph = builder.compile()
'''
"""The served graph's module (run by the peer's own interpreter, so it imports nothing of loopd's)."""


@dataclass(frozen=True)
class PeerChat:
    """One chat's timings and what it streamed (``text``: the answer's pieces joined)."""

    first_token: float
    completed: float
    text: str
    errors: int


def run_body(text: str) -> dict[str, Any]:
    """The body of ``POST /threads/{thread_id}/runs/stream`` for one chat: the user's message, tokens streamed."""
    return {
        "assistant_id": GRAPH_ID,
        "input": {"messages": [{"role": "human", "content": text}]},
        "stream_mode": ["messages-tuple"],
    }


def chunk_text(data: Any) -> str:
    """The text of one ``messages`` event's data (``[message chunk, metadata]``); "" for anything else."""
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return ""
    content = data[0].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


async def one_chat(host: str, port: int, thread_id: str, text: str, gate: asyncio.Event, timeout: float) -> PeerChat:
    """One chat on ``thread_id`` once ``gate`` opens: its time to first token, completion and the streamed text."""
    await gate.wait()
    started = now()
    first_token = float("nan")
    pieces: list[str] = []
    errors = 0
    path = f"/threads/{thread_id}/runs/stream"
    async with await open_event_stream(
        host, port, path, token="", method="POST", body=run_body(text), timeout=timeout
    ) as stream:
        async with asyncio.timeout(timeout):
            async for frame in stream.frames():
                _, kind, data = frame_data(frame)
                if kind == "error":
                    errors += 1
                elif kind == "messages" and (piece := chunk_text(data)):
                    if not pieces:
                        first_token = now() - started
                    pieces.append(piece)
    return PeerChat(first_token, now() - started, "".join(pieces), errors)


def expected_text(question: str) -> str:
    """What a chat asking ``question`` must stream: the same answer as the bare peer's."""
    return answer_text(question)
