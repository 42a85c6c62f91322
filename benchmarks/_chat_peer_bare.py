"""The floor of `benchmarks.server_chats`: a bare FastAPI + SQLite chat server, in its own process.

It serves the two routes the chat benchmark uses, shaped like loopd's so the same client measures both:

* ``POST /v1/conversations`` → ``{"id"}`` (one row);
* ``POST /v1/conversations/{id}/messages`` with ``Accept: text/event-stream``: stores the user's message and an
  empty answer (one transaction), streams an ``ack`` frame and then the answer's text in the demo model's chunks
  (12 characters) as ``append`` frames of the ``answer`` block, stores the finished answer (one more transaction)
  and ends with an ``end`` frame whose message is ``completed``.

No Task, no engine, no harness, no ledger, no bus: what any chat server must do at least. SQLite in WAL mode with
``synchronous=NORMAL`` (loopd's default durability: a commit survives a process crash, not a power loss), its
statements run on the event loop's thread (each a few microseconds). A bearer token is checked like loopd's. Like
`loopd up`, it runs on the event loop loopd's commands run on (`loopd._infra.eventloop.run`: uvloop) behind uvicorn
with httptools.

python -m benchmarks._chat_peer_bare --dir DIR --ready FILE   (writes ``{"port", "token", "pid"}`` to FILE)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from benchmarks._children import spawn
from benchmarks._server import START_TIMEOUT, ServerProcess, _stop
from loopd._infra.eventloop import run

CHUNK: Final = 12
"""Characters per streamed piece: the demo model's chunk size."""
NOTE: Final = (
    "I am a bare chat server's stand-in answer: as long as loopd's demo note, so both stream about the same "
    "number of pieces. It names no model and calls no tool; it stores the question and this answer in SQLite "
    "and streams the answer to the one client that asked, which is all a minimal chat server has to do here."
)
SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, name TEXT NOT NULL, created REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS messages (id TEXT PRIMARY KEY, conversation_id TEXT NOT NULL"
    " REFERENCES conversations (id), role TEXT NOT NULL, content TEXT NOT NULL, status TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id)",
)


def answer_text(question: str) -> str:
    """The answer streamed for ``question``: the demo model's echo, then `NOTE`."""
    return f"You said: “{question}”\n\n{NOTE}"


def _frame(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def build_app(db_path: Path, token: str) -> FastAPI:
    """The bare server over the SQLite file ``db_path``; requests need ``Authorization: Bearer <token>``."""
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for statement in SCHEMA:
        conn.execute(statement)
    app = FastAPI()

    def authorize(request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {token}":
            raise HTTPException(status_code=401, detail="a bearer token is required")

    def write(*statements: tuple[str, tuple[Any, ...]]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                conn.execute(sql, params)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @app.post("/v1/conversations")
    async def create_conversation(request: Request) -> dict[str, str]:
        authorize(request)
        body = await request.json()
        conversation_id = str(uuid.uuid4())
        sql = "INSERT INTO conversations (id, name, created) VALUES (?, ?, ?)"
        write((sql, (conversation_id, str(body.get("name") or ""), asyncio.get_running_loop().time())))
        return {"id": conversation_id}

    @app.post("/v1/conversations/{conversation_id}/messages")
    async def post_message(conversation_id: str, request: Request) -> StreamingResponse:
        authorize(request)
        body = await request.json()
        question = str(body.get("text") or "")
        if conn.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
            raise HTTPException(status_code=404, detail="no such conversation")
        input_id, response_id = str(uuid.uuid4()), str(uuid.uuid4())
        insert = "INSERT INTO messages (id, conversation_id, role, content, status) VALUES (?, ?, ?, ?, ?)"
        write(
            (insert, (input_id, conversation_id, "user", question, "completed")),
            (insert, (response_id, conversation_id, "assistant", "", "streaming")),
        )
        text = answer_text(question)

        async def stream() -> AsyncIterator[bytes]:
            yield _frame({"response_message_id": response_id, "input_message_id": input_id}, "ack")
            for start in range(0, len(text), CHUNK):
                piece = {
                    "op": "append",
                    "block": {"id": "answer", "type": "text", "content": text[start : start + CHUNK]},
                }
                yield _frame({"message_id": response_id, "event": piece})
                await asyncio.sleep(0)  # a token source yields between pieces
            write(("UPDATE messages SET content = ?, status = 'completed' WHERE id = ?", (text, response_id)))
            yield _frame({"message_id": response_id, "event": {"op": "end"}, "message": {"status": "completed"}})

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


async def serve(directory: Path, ready: Path) -> None:
    """Serve on a free loopback port until terminated; ``ready`` gets the port, the token and the pid."""
    token = secrets.token_urlsafe(24)
    app = build_app(directory / "bare.db", token)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # it failed to start: raise why
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    ready.write_text(json.dumps({"port": port, "token": token, "pid": os.getpid()}))
    await task


@contextlib.contextmanager
def running_bare_server(directory: Path) -> Iterator[ServerProcess]:
    """The bare server in a child process (data in ``directory``), stopped by its pid on exit."""
    ready = directory / "bare-ready.json"
    log = (directory / "bare.log").open("wb")
    command = [sys.executable, "-m", "benchmarks._chat_peer_bare", "--dir", str(directory), "--ready", str(ready)]
    child = spawn(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.exists():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the bare server did not start:\n{(directory / 'bare.log').read_text()[-3000:]}")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        url = f"http://127.0.0.1:{info['port']}"
        yield ServerProcess(url, "127.0.0.1", int(info["port"]), str(info["token"]), child.pid, directory)
    finally:
        _stop(child)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    args = parser.parse_args()
    run(serve(args.dir, args.ready))  # loopd's own loop (uvloop): the same loop as the server it is compared with


if __name__ == "__main__":
    main()
