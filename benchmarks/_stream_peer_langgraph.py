"""The joined-stream peer of `server_streams`: N clients join one run's stream on LangGraph's Agent Server.

LangGraph's local Agent Server (``langgraph dev --no-browser``, from ``langgraph-cli[inmem]``: in-memory state)
serves a one-node graph that, once every client has joined, writes ``--rate`` custom stream events per second for
``--seconds`` (each carries its index and CLOCK_MONOTONIC time taken just before the write, like loopd's emits),
then ``bench-done``. The benchmark creates a thread and a run (``stream_mode: custom``), N clients join it with
``GET /threads/{thread_id}/runs/{run_id}/stream`` (the same bare-protocol subscribers as loopd's, in worker
processes), and the same delay percentiles are computed.

The server runs in its own process, on loopback, started from a temporary directory and stopped by its pid. The
``langgraph`` command is found next to this interpreter (the bench extra), or named by ``LOOPD_BENCH_LANGGRAPH``
(e.g. a separate virtualenv's, since langgraph-api pins some libraries differently from loopd).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

LANGGRAPH_ENV: Final = "LOOPD_BENCH_LANGGRAPH"
START_TIMEOUT: Final = 120.0

_GRAPH = """
import asyncio, os, time
from typing import TypedDict
from langgraph.config import get_stream_writer
from langgraph.graph import StateGraph, START, END


class State(TypedDict, total=False):
    events: int
    rate: float
    flag: str
    sent: int


async def ticks(state: State) -> State:
    write = get_stream_writer()
    deadline = time.monotonic() + 600
    while not os.path.exists(state["flag"]):  # every client joined
        if time.monotonic() > deadline:
            raise TimeoutError("the clients never joined")
        await asyncio.sleep(0.01)
    start = time.monotonic() + 0.05
    for index in range(state["events"]):
        await asyncio.sleep(max(0.0, start + index / state["rate"] - time.monotonic()))
        write({"tick": f"bench:{index}:{time.monotonic():.6f};"})
    write({"tick": "bench-done"})
    return {"sent": state["events"]}


builder = StateGraph(State)
builder.add_node("ticks", ticks)
builder.add_edge(START, "ticks")
builder.add_edge("ticks", END)
graph = builder.compile()
"""


def langgraph_command() -> Path | None:
    """The ``langgraph`` CLI to run: ``$LOOPD_BENCH_LANGGRAPH``, else the one next to this interpreter."""
    named = os.environ.get(LANGGRAPH_ENV)
    candidate = Path(named) if named else Path(sys.executable).parent / "langgraph"
    return candidate if candidate.exists() else None


@dataclass(frozen=True)
class LangGraphServer:
    host: str
    port: int
    directory: Path
    pid: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_langgraph(directory: Path, command: Path) -> Iterator[LangGraphServer]:
    """``langgraph dev --no-browser`` serving the tick graph from ``directory``; stopped by its pid on exit."""
    (directory / "graph.py").write_text(_GRAPH)
    (directory / "langgraph.json").write_text(
        json.dumps({"dependencies": ["."], "graphs": {"bench": "./graph.py:graph"}})
    )
    port = _free_port()
    log = (directory / "langgraph.log").open("wb")
    env = dict(os.environ, LANGGRAPH_CLI_NO_ANALYTICS="1", LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false")
    child = subprocess.Popen(
        [
            str(command),
            "dev",
            "--no-browser",
            "--no-reload",
            "--allow-blocking",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"langgraph dev exited: {(directory / 'langgraph.log').read_text()[-1500:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/ok", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"langgraph dev did not answer within {START_TIMEOUT:g} s")
            time.sleep(0.5)
        yield LangGraphServer("127.0.0.1", port, directory, child.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)  # its own session: the CLI and the server it started
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
        log.close()


def start_run(server: LangGraphServer, events: int, rate: float, flag: Path) -> str:
    """A thread and a run of the tick graph (waiting for ``flag``); the run's stream path to join."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        thread = client.post("/threads", json={})
        thread.raise_for_status()
        thread_id = thread.json()["thread_id"]
        body = {
            "assistant_id": "bench",
            "input": {"events": events, "rate": rate, "flag": str(flag)},
            "stream_mode": ["custom"],
        }
        run = client.post(f"/threads/{thread_id}/runs", json=body)
        run.raise_for_status()
        return f"/threads/{thread_id}/runs/{run.json()['run_id']}/stream"
