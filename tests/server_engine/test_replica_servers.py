"""Two whole loop-servers (`open_loop_server`) on one PostgreSQL in one process: a conversation streamed from
replica B follows, live and complete, an answer that replica A's engine produces — with every poll of B (its
streams' feeds, its engine's scans) and of both responders pushed beyond the test, so only the notifier's
LISTEN/NOTIFY can carry A's commits to B's reader.

Replica B answers nothing here (its responder is inert), so A drives the call however Tasks are shared.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest

import loopd.server._composition as composition
from loopd.agentue import fold
from loopd.harness.models import IncomingRequest, ModelConfig, ScriptedServer, ServerReply, open_scripted_server
from loopd.resources.reconcile import Request, Result
from loopd.server._composition import UpSettings, open_loop_server
from loopd.server.chat import ConversationReader
from loopd.server.engine import HarnessEngine
from loopd.server.responder import HarnessResponder

NEVER = 600.0  # a poll that never comes within a test
ANSWER = " ".join(f"word{index}" for index in range(40))

pytestmark = pytest.mark.postgres


class _PatientReader(ConversationReader):
    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **{**options, "poll_interval": NEVER})


class _PatientEngine(HarnessEngine):
    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **{**options, "poll_interval": NEVER})


class _Responders:
    """The first server's responder answers (its polls never come); the second's answers nothing."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, **options: Any) -> HarnessResponder:
        self.made += 1
        if self.made == 1:
            return HarnessResponder(**{**options, "poll": NEVER, "capacity_retry": NEVER})
        return _Inert(**options)


class _Inert(HarnessResponder):
    async def reconcile(self, request: Request) -> Result:
        return Result()


def _reply(_request: IncomingRequest) -> ServerReply:
    return ServerReply(text=ANSWER, chunk_size=6, chunk_delay=0.02)


async def _follow(client: httpx.AsyncClient, conversation_id: str, response_id: list[str]) -> list[tuple[int, Any]]:
    """The conversation's frames ``(cursor, data)`` from cursor 0 until the response's ``end``."""
    frames: list[tuple[int, Any]] = []
    headers = {"Accept": "text/event-stream", "Last-Event-ID": "0"}
    async with client.stream("GET", f"/v1/conversations/{conversation_id}/stream", headers=headers) as response:
        assert response.status_code == 200
        cursor: int | None = None
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                cursor = int(line[3:].strip())
            elif line.startswith("data:") and cursor is not None:
                data = json.loads(line[5:])
                frames.append((cursor, data))
                if data["event"].get("op") == "end" and response_id and data["message_id"] == response_id[0]:
                    return frames
    return frames


async def test_a_stream_on_replica_b_follows_an_answer_replica_a_produces(tmp_path: Path, postgres_dsn: str) -> None:
    async with open_scripted_server(ScriptedServer(_reply)) as base_url:
        model = ModelConfig(model="gpt-4o-mini", base_url=base_url)
        a_settings = UpSettings(data_dir=tmp_path / "a", port=0, database_url=postgres_dsn, model=model)
        b_settings = UpSettings(data_dir=tmp_path / "b", port=0, database_url=postgres_dsn, model=model)
        with (
            mock.patch.object(composition, "ConversationReader", _PatientReader),
            mock.patch.object(composition, "HarnessEngine", _PatientEngine),
            mock.patch.object(composition, "HarnessResponder", _Responders()),
        ):
            async with open_loop_server(a_settings) as a, open_loop_server(b_settings) as b:
                on_a = httpx.AsyncClient(base_url=a.url, headers=_auth(a.token_file), timeout=15)
                on_b = httpx.AsyncClient(base_url=b.url, headers=_auth(b.token_file), timeout=15)
                async with on_a, on_b, asyncio.timeout(45):
                    conversation = (await on_a.post("/v1/conversations", json={"name": "replicas"})).json()["id"]
                    response_id: list[str] = []
                    follower = asyncio.ensure_future(_follow(on_b, conversation, response_id))
                    body = {"target": {"kind": "harness", "key": "assistant"}, "text": "hello"}
                    asked = await on_a.post(f"/v1/conversations/{conversation}/messages", json=body)
                    assert asked.status_code == 201, asked.text
                    response_id.append(asked.json()["response"]["id"])
                    frames = await follower
                    page = await on_b.get(f"/v1/conversations/{conversation}/messages")
                    stored = next(m for m in page.json()["data"] if m["id"] == response_id[0])
                    drives = (a.engine.statistics().claims, b.engine.statistics().claims)
    assert drives == (1, 0)  # A drove the call; B only streamed it
    assert stored["status"] == "completed"
    assert [cursor for cursor, _ in frames] == list(range(1, len(frames) + 1))  # no gap, no duplicate
    events = [data["event"] for _, data in frames if data["message_id"] == response_id[0]]
    folded = fold(events).model
    assert folded is not None and folded.to_json() == stored["content"]
    assert ANSWER in json.dumps(stored["content"])


def _auth(token_file: Path) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_file.read_text().strip()}"}
