"""`make run` → `loopd up`, then `loopd chat`: a durable, resumable, audited answer from the built-in harness."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.support.availability import missing
from tests.support.kubectl import Kubectl, find_kubectl
from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for, start_up

NOTE = "remember the milk"


def _wait(predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    return wait_until(predicate, timeout=timeout, what=what)


def _ask(client: httpx.Client, text: str) -> tuple[str, dict[str, Any]]:
    conversation = client.post("/v1/conversations", json={"name": "e2e"}).json()
    asked = client.post(
        f"/v1/conversations/{conversation['id']}/messages",
        json={"target": {"kind": "harness", "key": "assistant"}, "text": text},
    )
    assert asked.status_code == 201, asked.text
    return conversation["id"], asked.json()


def _response(client: httpx.Client, conversation_id: str, response_id: str) -> dict[str, Any]:
    snapshot = client.get(f"/v1/conversations/{conversation_id}/snapshot").json()
    return next(m for m in snapshot["messages"] if m["id"] == response_id)


def _pending_gate(message: dict[str, Any]) -> dict[str, Any] | None:
    for block in message["content"]["blocks"]:
        if str(block.get("id", "")).startswith("gate/") and block.get("status") == "pending":
            return dict(block)
    return None


def _answer_gate(client: httpx.Client, gate: dict[str, Any], answer: str) -> None:
    gate_id = gate["id"].removeprefix("gate/")
    response = client.post(f"/v1/harness/calls/{gate['call_id']}/gates/{gate_id}", json={"answer": answer})
    assert response.status_code < 300, response.text


def _answer_ops(client: httpx.Client, conversation_id: str, response_id: str) -> list[tuple[str, str]]:
    """``(op, text)`` of the stored events of the response's answer block, read from the conversation stream."""
    ops: list[tuple[str, str]] = []
    headers = {"Accept": "text/event-stream", "Last-Event-ID": "0"}
    with client.stream("GET", f"/v1/conversations/{conversation_id}/stream", headers=headers, timeout=30) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            data = json.loads(line.removeprefix("data:"))
            if data.get("message_id") != response_id:
                continue
            event = data["event"]
            if event.get("op") == "end":
                return ops
            block = event.get("block") or {}
            if block.get("id") == "answer":
                ops.append((event["op"], str(block.get("content"))))
    return ops


def _prepare_workspace(data_dir: Path) -> None:
    workspace = data_dir.parent / f"{data_dir.name}-workspaces" / "assistant"  # next to the data dir, not in it
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text(NOTE + "\n")


def test_loopd_chat_streams_an_answer_and_exits_0(up: UpProcess) -> None:
    done = subprocess.run(
        [LOOPD, "chat", "--to", "harness:assistant", "hello"],
        env=env_for(up.data_dir),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert "hello" in done.stdout.decode()
    assert "conversation" in done.stderr.decode()


def test_the_task_is_visible_to_kubectl_during_the_chat_and_gone_after(up: UpProcess, tmp_path: Path) -> None:
    binary = find_kubectl()
    if binary is None:
        missing("kubectl is not installed")
        return
    _prepare_workspace(up.data_dir)
    kubeconfig = tmp_path / "kubeconfig"
    rendered = subprocess.run(
        [LOOPD, "kubeconfig", "--data-dir", str(up.data_dir)], env=env_for(up.data_dir), capture_output=True, timeout=30
    )
    assert rendered.returncode == 0, rendered.stderr.decode()
    kubeconfig.write_bytes(rendered.stdout)
    kubectl = Kubectl(binary, kubeconfig, tmp_path / "home")

    with up.client() as client:
        conversation_id, asked = _ask(client, "read notes.txt")
        gate = _wait(lambda: _pending_gate(_response(client, conversation_id, asked["response"]["id"])), what="a gate")
        names = asyncio.run(kubectl.ok("get", "tasks", "-o", "name"))
        assert f"task.loopd.dev/{asked['task_id']}" in names or asked["task_id"] in names
        _answer_gate(client, gate, "approve")
        final = _wait(
            lambda: (m := _response(client, conversation_id, asked["response"]["id"]))["status"] == "completed" and m,
            what="the answer",
        )
    assert any(NOTE in str(block) for block in final["content"]["blocks"])
    _wait(
        lambda: asked["task_id"] not in asyncio.run(kubectl.ok("get", "tasks", "-o", "name")),
        timeout=15,
        what="the Task to be deleted",
    )


def test_kill_9_mid_call_then_restart_completes_the_answer_with_one_execution(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    _prepare_workspace(data_dir)
    first = start_up(data_dir, tmp_path, "first")
    try:
        with first.client() as client:
            conversation_id, asked = _ask(client, "read notes.txt")
            gate = _wait(
                lambda: _pending_gate(_response(client, conversation_id, asked["response"]["id"])), what="a gate"
            )
    finally:
        first.kill()  # SIGKILL: no cleanup at all
    second = start_up(data_dir, tmp_path, "second")
    try:
        with second.client() as client:
            # The call resumes from its journal: the same gate is still open and can be answered.
            again = _wait(
                lambda: _pending_gate(_response(client, conversation_id, asked["response"]["id"])),
                what="the gate after the restart",
            )
            assert again["id"] == gate["id"]
            _answer_gate(client, again, "approve")
            final = _wait(
                lambda: (
                    (m := _response(client, conversation_id, asked["response"]["id"]))["status"] == "completed" and m
                ),
                what="the answer after the restart",
            )
            assert any(NOTE in str(block) for block in final["content"]["blocks"])
            # The answer's stored events: one set, then appends only (no text repeated after the resume).
            ops = _answer_ops(client, conversation_id, asked["response"]["id"])
            assert ops and ops[0][0] == "set" and all(op == "append" for op, _ in ops[1:]), ops
            answer = next(b for b in final["content"]["blocks"] if b["id"] == "answer")
            assert "".join(text for _, text in ops) == answer["content"]
            # The ledger, through the API: one lane (one execution) for the call; the attempt cut short by the
            # crash is closed by the resumed drive as interrupted, its usage marked (unknown: cut at a gate).
            trail = client.get("/v1/ledger", params={"task_id": asked["task_id"]}).json()
            assert len(trail["lanes"]) == 1, trail["lanes"]
            requested = [
                e for e in trail["events"] if e["event_type"] == "attempt.requested" and "mode" in e["payload"]
            ]
            assert [e["payload"]["mode"] for e in requested] == ["start", "resume"]
            assert trail["unresolved_attempts"] == [], "after the run nothing is in doubt"
            cut_short = [e for e in trail["events"] if e["subject_id"] == requested[0]["subject_id"]][-1]
            assert cut_short["event_type"] == "attempt.failed" and cut_short["payload"]["reason"] == "interrupted"
            assert cut_short["payload"]["usage_estimated"] is True
            assert trail["usage"]["usage_estimated"] is True and trail["usage"]["estimated_attempts"] == 1
    finally:
        second.kill()
    with sqlite3.connect(f"file:{data_dir / 'loopd.db'}?mode=ro", uri=True) as db:
        calls = db.execute("SELECT id, effect_key, phase FROM harness_calls").fetchall()
    assert len(calls) == 1 and calls[0][1] == "respond" and calls[0][2] == "succeeded", calls
    with sqlite3.connect(f"file:{data_dir / 'harness' / 'journal.db'}?mode=ro", uri=True) as journal:
        (sessions,) = journal.execute("SELECT count(*) FROM journal_sessions").fetchone()
    assert sessions == 1, "exactly one harness execution for the effect key"
