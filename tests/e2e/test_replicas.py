"""Two `loopd server` replicas on one PostgreSQL, one killed with SIGKILL mid-answer.

Chats are asked on both replicas; every conversation is streamed (SSE, from cursor 0) from both replicas while the
answers are produced. Once an answer is half shown, the replica driving it (found from its lease in PostgreSQL) is
killed with SIGKILL. The survivor takes the call over when the lease expires (``timeouts.lease_ttl`` = 4 s) and resumes
it from the harness journal in PostgreSQL. Then:

- every answer completes, once: the exact text the model gave (no repeated part), one ledger lane per Task;
- every stream read from the survivor is gapless and duplicate-free (its cursors run 1, 2, 3, … to the response's
  ``end``), and folding its events gives exactly the stored message, though part of it was written by the killed
  replica and the rest by the survivor.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from loopd.agentue import fold
from loopd.harness.models import IncomingRequest, ScriptedServer, ServerReply
from tests.support.model_thread import scripted_model_thread
from tests.support.postgres import postgres_dsn, postgres_server
from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for, wait_for_server_file
from .router_support import Asked, answer_text

__all__ = ["postgres_dsn", "postgres_server"]

pytestmark = pytest.mark.postgres

CHATS = 4
WORDS = 30  # one chunk per word, 0.1 s apart: an answer streams for about 3 s


def expected_answer(question: str) -> str:
    return " ".join(f"{question}-{index}" for index in range(WORDS))


def _reply(request: IncomingRequest) -> ServerReply:
    question = request.last_user_text.strip().split()[-1]
    text = expected_answer(question)
    return ServerReply(text=text, chunk_size=len(question) + 4, chunk_delay=0.1)


CONFIG = """\
kubernetes: {{api: embedded}}
timeouts: {{lease_ttl: 4}}
harnesses:
  - key: steady
    kind: builtin
    title: Steady
    model: {{name: gpt-4o-mini, base_url: "{base_url}"}}
    tools: [read_file]
"""


def _start(data_dir: Path, tmp_path: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        return subprocess.Popen(
            [LOOPD, "server", "--data-dir", str(data_dir), "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env_for(data_dir), **env},
        )


def _served(process: subprocess.Popen[bytes], data_dir: Path, log: Path) -> UpProcess:
    info = wait_for_server_file(process, data_dir, log)
    return UpProcess(data_dir, process, info["url"], Path(info["token_file"]).read_text().strip(), log)


@pytest.fixture
def replicas(tmp_path: Path, postgres_dsn: str) -> Iterator[tuple[UpProcess, UpProcess, str]]:
    """Replicas A and B (own data directories, one PostgreSQL, the scripted model); stopped by pid afterwards."""
    model = ScriptedServer(_reply)
    with scripted_model_thread(model, name="replicas-model") as base_url:
        config = tmp_path / "replicas.yaml"
        config.write_text(CONFIG.format(base_url=base_url))
        env = {"LOOPD_DATABASE_URL": postgres_dsn, "LOOPD_CONFIG": str(config)}
        started = [_start(tmp_path / name, tmp_path, f"replica-{name}", env) for name in ("a", "b")]
        try:
            a, b = (_served(p, tmp_path / n, tmp_path / f"replica-{n}.log") for p, n in zip(started, "ab", strict=True))
            yield a, b, postgres_dsn
        finally:
            for process in started:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in started:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=30)


@dataclass
class Reader:
    """One SSE stream of a conversation from one replica, from cursor 0 until the response's ``end``."""

    server: UpProcess
    conversation_id: str
    frames: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    response_id: str | None = None
    ended: bool = False
    error: str = ""
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"sse-{self.conversation_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.server.token}", "Last-Event-ID": "0"}
        path = f"{self.server.url}/v1/conversations/{self.conversation_id}/stream"
        try:
            with httpx.stream("GET", path, headers=headers, timeout=httpx.Timeout(10.0, read=45.0)) as stream:
                cursor: int | None = None
                for line in stream.iter_lines():
                    if line.startswith("id:"):
                        cursor = int(line[3:].strip())
                    elif line.startswith("data:") and cursor is not None:
                        data = json.loads(line[5:])
                        self.frames.append((cursor, data))
                        cursor = None
                        if data.get("event", {}).get("op") == "end" and data.get("message_id") == self.response_id:
                            self.ended = True
                            return
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def _ask(client: httpx.Client, conversation_id: str, question: str) -> Asked:
    asked = client.post(
        f"/v1/conversations/{conversation_id}/messages",
        json={"target": {"kind": "harness", "key": "steady"}, "text": f"please answer {question}"},
    )
    assert asked.status_code == 201, asked.text
    body = asked.json()
    return Asked(conversation_id, body["task_id"], body["response"]["id"])


def _message(client: httpx.Client, asked: Asked) -> dict[str, Any]:
    page = client.get(f"/v1/conversations/{asked.conversation_id}/messages", params={"limit": 200})
    assert page.status_code == 200, page.text
    return next(m for m in page.json()["data"] if m["id"] == asked.response_id)


def _holder_pid(dsn: str, message_id: str) -> int | None:
    """The pid of the replica holding the lease on the call that writes ``message_id`` (replica ids are
    ``host:pid:suffix``)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT l.holder FROM harness_calls c JOIN leases l ON l.resource = 'harness-call/' || c.id "
            "WHERE c.message_id = %s AND l.holder <> '' AND c.phase IN ('starting', 'running')",
            (message_id,),
        ).fetchone()
    return int(str(row[0]).split(":")[1]) if row else None


def test_a_replica_killed_mid_answer_loses_no_answer_and_no_stream_event(
    replicas: tuple[UpProcess, UpProcess, str],
) -> None:
    a, b, dsn = replicas
    servers = {a.process.pid: a, b.process.pid: b}
    with a.client() as on_a, b.client() as on_b:
        clients = [on_a, on_b]
        readers: list[Reader] = []
        asked: list[Asked] = []
        for index in range(CHATS):
            client = clients[index % 2]  # chats spread over both replicas
            conversation = client.post("/v1/conversations", json={"name": f"replicas {index}"})
            assert conversation.status_code == 201, conversation.text
            cid = conversation.json()["id"]
            pair = [Reader(a, cid), Reader(b, cid)]  # the same conversation streamed from both replicas
            for reader in pair:
                reader.start()
            question = f"q{index}"
            asked.append(_ask(client, cid, question))
            for reader in pair:
                reader.response_id = asked[-1].response_id
            readers.extend(pair)

        def half_shown() -> tuple[int, Asked] | None:
            for one in asked:
                message = _message(on_a, one)
                if message["status"] == "streaming" and answer_text(message):
                    pid = _holder_pid(dsn, one.response_id)
                    if pid in servers:
                        return pid, one
            return None

        pid, cut = wait_until(half_shown, timeout=30, interval=0.05, what="an answer half shown")
        victim = servers[pid]
        victim.kill(signal.SIGKILL)
        survivor = b if victim is a else a
        client = on_b if victim is a else on_a

        def ended(one: Asked) -> dict[str, Any] | None:
            message = _message(client, one)
            return message if message["status"] not in ("pending", "streaming") else None

        finals = [
            wait_until(functools.partial(ended, one), timeout=40, interval=0.1, what=f"the answer to {one.task_id}")
            for one in asked
        ]
        logs = "\n".join(server.log.read_text(errors="replace")[-3000:] for server in (a, b))
        for index, (one, final) in enumerate(zip(asked, finals, strict=True)):
            assert final["status"] == "completed", (final, logs)
            assert answer_text(final) == expected_answer(f"q{index}"), (final, logs)  # whole, nothing repeated
            trail = client.get("/v1/ledger", params={"task_id": one.task_id})
            assert trail.status_code == 200, trail.text
            assert len(trail.json()["lanes"]) == 1, trail.json()  # one execution for the Task's effect key
            assert trail.json()["unresolved_attempts"] == [], trail.json()
            if one is cut:  # started on the victim, resumed on the survivor: the cut attempt closed as interrupted
                events = trail.json()["events"]
                requested = [e for e in events if e["event_type"] == "attempt.requested" and "mode" in e["payload"]]
                modes = [e["payload"]["mode"] for e in requested]  # more resumes if a renewal came late under load
                assert modes[0] == "start" and modes[1:] and set(modes[1:]) == {"resume"}, events
                closed = [e for e in events if e["subject_id"] == requested[0]["subject_id"]][-1]
                assert closed["event_type"] == "attempt.failed" and closed["payload"]["reason"] == "interrupted"

        for reader in readers:
            if reader.server is survivor:
                assert reader.thread is not None
                reader.thread.join(timeout=30)
                assert reader.ended, (reader.error, reader.frames[-3:])
        for reader, final in zip([r for r in readers if r.server is survivor], finals, strict=True):
            cursors = [cursor for cursor, _ in reader.frames]
            assert cursors == list(range(1, len(cursors) + 1)), cursors  # no gap, no duplicate, in commit order
            events = [data["event"] for _, data in reader.frames if data["message_id"] == final["id"]]
            assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
            folded = fold(events).model
            assert folded is not None and folded.to_json() == final["content"]
