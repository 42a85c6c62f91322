"""The LangGraph Agent Server peer of server_chats and its launcher (`benchmarks._langgraph`): the command line stays
on loopback with no browser, the peer's virtualenv is installed only when its pins change, the CLI is found in the
documented order, the served graph streams the bare peer's answer, message events are read from CRLF-framed SSE,
and the two LangGraph ratios are computed from the same run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from benchmarks._chat_peer_bare import CHUNK, NOTE, answer_text
from benchmarks._chat_peer_langgraph import GRAPH_ID, GRAPH_SOURCE, chunk_text, expected_text, run_body
from benchmarks._goals import goals_of
from benchmarks._langgraph import LANGGRAPH_ENV, REQUIREMENTS, dev_command_line, ensure_venv, langgraph_command
from benchmarks._server import EventStream, frame_data
from benchmarks.server_chats import PEER_NAMES, ChatRun, ThousandRun, chat_goals

from benchmarks import _langgraph


def _run(per_second: float, ttft_p95_ms: float, chats: int = 100, ok: int | None = None) -> ChatRun:
    return ChatRun(
        chats=chats,
        ok=chats if ok is None else ok,
        wall=chats / per_second,
        ttft_p50_ms=ttft_p95_ms / 2,
        ttft_p95_ms=ttft_p95_ms,
        done_p50_ms=ttft_p95_ms,
        done_p95_ms=ttft_p95_ms,
    )


def test_the_dev_server_listens_on_loopback_without_a_browser_reloader_or_tunnel() -> None:
    line = dev_command_line(Path("/venv/bin/langgraph"), 4321)
    assert line[:2] == ["/venv/bin/langgraph", "dev"]
    assert {"--no-browser", "--no-reload"} <= set(line)
    assert line[line.index("--host") + 1] == "127.0.0.1" and line[line.index("--port") + 1] == "4321"
    assert "--tunnel" not in line and "--n-jobs-per-worker" not in line  # its default unless asked
    assert dev_command_line(Path("lg"), 1, jobs=100)[-2:] == ["--n-jobs-per-worker", "100"]


def test_the_peer_venv_is_reinstalled_only_when_its_pins_change(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "langgraph").write_text("")
    (venv / _langgraph._STAMP).write_text(_langgraph._requirements_digest() + "\n")
    # Up to date: nothing runs (an interpreter that does not exist is never called).
    assert ensure_venv(venv, python="/no/such/python") == venv / "bin" / "langgraph"
    (venv / _langgraph._STAMP).write_text("other pins\n")
    with pytest.raises(FileNotFoundError):  # stale: it sets about creating the venv with that interpreter
        ensure_venv(venv, python="/no/such/python")
    assert all("==" in pin for pin in REQUIREMENTS)  # pinned: the figures name the versions measured


def test_the_cli_is_the_named_one_else_the_peer_venvs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(LANGGRAPH_ENV, raising=False)
    assert _langgraph.venv_dir() == tmp_path / "cache" / "loopd" / "bench-langgraph"
    installed = _langgraph.venv_dir() / "bin" / "langgraph"
    installed.parent.mkdir(parents=True)
    installed.write_text("")
    assert langgraph_command() == installed
    named = tmp_path / "mine" / "langgraph"
    named.parent.mkdir()
    named.write_text("")
    monkeypatch.setenv(LANGGRAPH_ENV, str(named))
    assert langgraph_command() == named
    monkeypatch.setenv(LANGGRAPH_ENV, str(tmp_path / "missing"))
    assert langgraph_command() is None  # a wrong name is not silently replaced by another install


def test_the_graph_streams_the_bare_peers_answer_in_the_same_pieces() -> None:
    compile(GRAPH_SOURCE, "graph.py", "exec")  # the peer's interpreter imports it: it must at least parse
    assert repr(NOTE) in GRAPH_SOURCE and f"CHUNK = {CHUNK!r}" in GRAPH_SOURCE
    # The graph's answer() is the bare peer's formula (run here without langchain: only that function).
    start = GRAPH_SOURCE.index("def answer(")
    scope: dict[str, object] = {"NOTE": NOTE, "BaseMessage": object}
    exec(GRAPH_SOURCE[start : GRAPH_SOURCE.index("\nclass ", start)], scope)

    class Message:
        content = "hello number 7"

    assert scope["answer"]([Message()]) == answer_text("hello number 7") == expected_text("hello number 7")  # type: ignore[operator]
    body = run_body("hi")
    assert body["assistant_id"] == GRAPH_ID and body["stream_mode"] == ["messages-tuple"]


async def test_message_events_are_read_from_crlf_framed_sse_split_anywhere() -> None:
    chunk = {"content": "You said: “h", "type": "AIMessageChunk"}
    wire = (
        b'event: metadata\r\ndata: {"run_id":"r"}\r\n\r\n'
        + b"event: messages\r\ndata: "
        + json.dumps([chunk, {"langgraph_node": "respond"}]).encode()
        + b"\r\n\r\n"
    )
    reader = asyncio.StreamReader()
    for start in range(0, len(wire), 5):  # a CR and its LF land in different reads too
        reader.feed_data(wire[start : start + 5])
    reader.feed_eof()
    stream = EventStream(reader, None, chunked=False)  # type: ignore[arg-type]
    frames = [frame_data(f) async for f in stream.frames()]
    assert [kind for _, kind, _ in frames] == ["metadata", "messages"]
    assert chunk_text(frames[1][2]) == "You said: “h"
    assert chunk_text(frames[0][2]) == "" and chunk_text([{"content": [{"text": "a"}, {"text": "b"}]}, {}]) == "ab"


def test_the_langgraph_ratios_and_every_chat_goal_come_from_one_run() -> None:
    measured = {
        "loopd": {1: _run(10, 50, chats=1), 100: _run(120, 400)},
        PEER_NAMES["langgraph"]: {100: _run(30, 3000)},
        PEER_NAMES["bare"]: {100: _run(600, 100)},
    }
    kept = ThousandRun(_run(80, 900, chats=1000, ok=998), streamed=999, stored=998)
    goals = chat_goals(measured, kept)
    assert set(goals) == {goal.key for goal in goals_of("server_chats")}  # every goal has its figure
    assert goals["x_langgraph_rate"] == 4.0
    assert goals["x_langgraph_ttft"] == pytest.approx(400 / 3000)
    assert goals["x_bare_rate"] == 0.2 and goals["lost_1000"] == 2.0
    smaller = ThousandRun(_run(80, 900, chats=200), streamed=200, stored=200)
    unmeasured = chat_goals({"loopd": {100: _run(120, 400)}}, smaller)
    assert unmeasured["x_langgraph_rate"] is None and unmeasured["x_langgraph_ttft"] is None
    assert unmeasured["lost_1000"] is None  # fewer than 1,000 chats does not judge the 1,000-chat goal
