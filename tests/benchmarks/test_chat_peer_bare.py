"""The bare FastAPI + SQLite floor of server_chats: loopd's route shapes, the token checked, both messages stored,
the answer streamed in the demo model's pieces; and the x_bare_rate goal computed from the same run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from benchmarks._chat_peer_bare import CHUNK, answer_text, build_app
from benchmarks._server import frame_data
from benchmarks.server_chats import PEER_NAMES, ChatRun, chat_goals
from fastapi.testclient import TestClient


def _run(per_second: float) -> ChatRun:
    return ChatRun(chats=100, ok=100, wall=100 / per_second, ttft_p50_ms=1, ttft_p95_ms=2, done_p50_ms=3, done_p95_ms=4)


def test_the_bare_server_needs_its_token_stores_both_messages_and_streams_the_answer(tmp_path: Path) -> None:
    client = TestClient(build_app(tmp_path / "bare.db", "secret-token"))
    assert client.post("/v1/conversations", json={"name": "x"}).status_code == 401
    wrong = {"Authorization": "Bearer other"}
    assert client.post("/v1/conversations", json={"name": "x"}, headers=wrong).status_code == 401
    auth = {"Authorization": "Bearer secret-token"}
    conversation = client.post("/v1/conversations", json={"name": "x"}, headers=auth).json()["id"]
    assert client.post(f"/v1/conversations/{conversation}/messages", json={"text": "hi"}).status_code == 401
    response = client.post(f"/v1/conversations/{conversation}/messages", json={"text": "hello"}, headers=auth)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = [frame_data(f.encode()) for f in response.text.split("\n\n") if f.strip()]
    assert frames[0][1] == "ack"
    answer_id = frames[0][2]["response_message_id"]
    pieces = [data["event"]["block"]["content"] for _, _, data in frames[1:-1]]
    assert "".join(pieces) == answer_text("hello") and max(len(p) for p in pieces) == CHUNK
    assert frames[-1][2] == {"message_id": answer_id, "event": {"op": "end"}, "message": {"status": "completed"}}
    with sqlite3.connect(tmp_path / "bare.db") as db:
        rows = db.execute("SELECT role, content, status FROM messages ORDER BY role DESC").fetchall()
    assert rows == [("user", "hello", "completed"), ("assistant", answer_text("hello"), "completed")]
    assert json.dumps(rows)  # plain values


def test_the_bare_ratio_is_loopds_chats_per_second_over_the_floors_at_100_chats() -> None:
    goals = chat_goals({"loopd": {100: _run(30.0)}, PEER_NAMES["bare"]: {100: _run(120.0)}})
    assert goals["x_bare_rate"] == 0.25
    assert chat_goals({"loopd": {100: _run(30.0)}})["x_bare_rate"] is None  # the floor did not run: n/a
