"""`loopd up --database postgresql://…`: server state and the harness journal in PostgreSQL, same behaviour."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loopd.server._composition import UpSettings, open_loop_server
from tests.support.postgres import postgres_dsn, postgres_server
from tests.support.waiting import eventually

__all__ = ["postgres_dsn", "postgres_server"]

pytestmark = pytest.mark.postgres


async def test_a_chat_is_answered_with_state_in_postgresql(tmp_path: Path, postgres_dsn: str) -> None:
    settings = UpSettings(data_dir=tmp_path / "data", port=0, database_url=postgres_dsn)
    async with open_loop_server(settings) as server:
        token = server.token_file.read_text().strip()
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15
        ) as client:
            conversation = (await client.post("/v1/conversations", json={"name": "pg"})).json()
            asked = await client.post(
                f"/v1/conversations/{conversation['id']}/messages",
                json={"target": {"kind": "harness", "key": "assistant"}, "text": "hello from postgres"},
            )
            assert asked.status_code == 201, asked.text
            response_id = asked.json()["response"]["id"]

            async def completed() -> dict[str, object] | None:
                snapshot = (await client.get(f"/v1/conversations/{conversation['id']}/snapshot")).json()
                found: dict[str, object] = next(m for m in snapshot["messages"] if m["id"] == response_id)
                return found if found["status"] == "completed" else None

            message = await eventually(completed, timeout=30, what="the response to complete")
            assert "hello from postgres" in str(message["content"])
            trail = (await client.get("/v1/ledger", params={"task_id": asked.json()["task_id"]})).json()
            assert len(trail["lanes"]) == 1
    # The harness journal lives in PostgreSQL too (any replica can resume a call from it).
    import psycopg

    with psycopg.connect(postgres_dsn, connect_timeout=10) as conn:
        (sessions,) = conn.execute("SELECT count(*) FROM loopd_journal.journal_sessions").fetchone() or (0,)
    assert sessions == 1
